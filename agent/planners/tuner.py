"""Offline tuner: coordinate descent over the declared knobs, never repeating an evaluated point.

From the best point it tries, knob by knob, every other declared value (nearest first). A kept
candidate moves the best point, so the next proposals explore around it. When a full sweep of
every knob around the best point finds nothing new, it stops. Deterministic for a given seed (the
seed only rotates which knob goes first).
"""

from __future__ import annotations

from sandbox.candidate import source_sha256

from .base import PlannedVersion, Planner, PlannerExhausted, PlannerView


class TunerPlanner(Planner):
    name = "tuner"

    def __init__(self, seed: int = 0):
        self.seed = seed

    def settings(self) -> dict:
        return {"seed": self.seed, "strategy": "coordinate descent, nearest values first"}

    def propose(self, view: PlannerView) -> PlannedVersion:
        best = dict(view.best_knobs)
        sha = source_sha256(view.best_source)
        seen = {_point(a.knobs) for a in view.history if a.source_sha == sha}
        seen.add(_point(best))
        knobs = view.declared_knobs
        if not knobs:
            raise PlannerExhausted("the kernel declares no knobs")
        start = self.seed % len(knobs)
        for knob in knobs[start:] + knobs[:start]:
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
        raise PlannerExhausted("every knob value around the best point has been evaluated (local optimum)")


def _point(knobs: dict[str, int]) -> tuple:
    return tuple(sorted(knobs.items()))
