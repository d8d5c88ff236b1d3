"""Offline tuner: coordinate descent over the declared knobs, never repeating an evaluated point.

From the best point it tries, knob by knob, every other declared value (nearest first). A kept
candidate moves the best point, so the next proposals explore around it. When every single-knob
move around the best point has been evaluated, it tries two knobs at once, each one declared value
up or down (knobs interact: a work split that pays only with another grid shape is invisible to
one-knob moves). When those are exhausted too, it stops. Deterministic for a given seed (the seed
only rotates which knob goes first).
"""

from __future__ import annotations

from sandbox.candidate import source_sha256

from .base import PlannedVersion, Planner, PlannerExhausted, PlannerView


class TunerPlanner(Planner):
    name = "tuner"

    def __init__(self, seed: int = 0):
        self.seed = seed

    def settings(self) -> dict:
        return {"seed": self.seed,
                "strategy": "coordinate descent, nearest values first; then two-knob adjacent steps"}

    def propose(self, view: PlannerView) -> PlannedVersion:
        best = dict(view.best_knobs)
        sha = source_sha256(view.best_source)
        seen = {_point(a.knobs) for a in view.history if a.source_sha == sha}
        seen.add(_point(best))
        knobs = view.declared_knobs
        if not knobs:
            raise PlannerExhausted("the kernel declares no knobs")
        start = self.seed % len(knobs)
        order = knobs[start:] + knobs[:start]
        for knob in order:
            cur = best.get(knob.name, knob.default)
            pos = knob.values.index(cur) if cur in knob.values else 0
            for value in sorted(knob.values, key=lambda v: (abs(knob.values.index(v) - pos), v)):
                point = {**best, knob.name: value}
                if value == cur or _point(point) in seen:
                    continue
                why = f" ({knob.doc})" if knob.doc else ""
                direction = "up" if knob.values.index(value) > pos else "down"
                return PlannedVersion(
                    source=view.best_source, knobs=point,
                    hypothesis=f"{knob.name} {cur}->{value}{why}: one step {direction} around the best point "
                               f"{view.best_id}",
                    predicted_change="unknown sign; kept only if faster beyond noise at every context",
                )
        for i, a in enumerate(order):
            for b in order[i + 1:]:
                for point, moves in _pair_steps(best, a, b):
                    if _point(point) in seen:
                        continue
                    return PlannedVersion(
                        source=view.best_source, knobs=point,
                        hypothesis=f"{' and '.join(moves)} together: no single-knob move around the best point "
                                   f"{view.best_id} helps; these two may interact",
                        predicted_change="unknown sign; kept only if faster beyond noise at every context",
                    )
        raise PlannerExhausted("every one-knob value and two-knob adjacent step around the best point has been "
                               "evaluated (local optimum)")


def _pair_steps(best: dict[str, int], a, b):
    """Points with knobs a and b each moved one declared value up or down from the best point."""
    steps = []
    for da in (-1, 1):
        for db in (-1, 1):
            point, moves = dict(best), []
            for knob, d in ((a, da), (b, db)):
                cur = best.get(knob.name, knob.default)
                pos = knob.values.index(cur) if cur in knob.values else 0
                if not 0 <= pos + d < len(knob.values):
                    break
                point[knob.name] = knob.values[pos + d]
                moves.append(f"{knob.name} {cur}->{point[knob.name]}")
            else:
                steps.append((point, moves))
    return steps

def _point(knobs: dict[str, int]) -> tuple:
    return tuple(sorted(knobs.items()))
