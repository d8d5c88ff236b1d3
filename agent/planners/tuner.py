"""Offline tuner: knob search over the archive, guided by the phase timeline, until the budget ends.

Around a base version it tries every other declared value of one knob (nearest first), then two knobs at
once (one declared value each, up or down: knobs interact), never repeating a point it has evaluated on
that source. The best version is the first base; when its neighbourhood is spent, the next-fastest
correct version becomes the base (stacking on near-misses), and after all of them, moves two values
away around the best. Knobs are tried in the order of the phases they touch: the phase with the largest
gap between its span and its byte floor first (a knob touches a phase when their names and the knob's
description share words; knobs that touch none keep their declared order after the others). The
timeline comes from a profile of the base, asked of the session once per base; without one (a task
with no phases) the declared order stands. Deterministic for a given seed (it rotates the first knob).
"""

from __future__ import annotations

import itertools
import re
from concurrent.futures import Future, ThreadPoolExecutor

from megakernel_agent.sandbox.candidate import Knob, parse_knobs, source_sha256

from ..archive import ArchivedVersion
from .base import PlannedVersion, Planner, PlannerExhausted, PlannerView

STOP_WORDS = {"of", "the", "a", "an", "k", "per", "each", "in", "and", "to", "is", "its", "for", "on", "all", "x",
              "slices", "units", "l0", "l1", "l2", "l3"}
SYNONYMS = {"o_proj": "output", "g/u": "gate up", "projections": "project", "projection": "project",
            "experts": "expert", "routed": "router", "mla": "mla attention"}
UNKNOWN = "unknown sign; kept only if faster beyond noise at every context"


def words(text: str) -> set[str]:
    text = text.lower()
    for k, v in SYNONYMS.items():
        text = text.replace(k, f"{k} {v}")
    return {w for w in re.split(r"[^a-z0-9_]+", text) if len(w) > 1 and w not in STOP_WORDS}


def phase_gaps(version: ArchivedVersion, copy_tbs: float) -> dict[str, float]:
    """Per phase (over every context profiled): its span minus the time its bytes take at copy bandwidth."""
    gaps: dict[str, float] = {}
    for timeline in version.phases:
        for row in timeline.rows:
            floor = row.bytes / (copy_tbs * 1e6) if copy_tbs else 0.0
            gaps[row.name] = gaps.get(row.name, 0.0) + max(0.0, row.span_us - floor)
    return gaps


def knob_order(knobs: list[Knob], gaps: dict[str, float]) -> list[Knob]:
    """Knobs touching the phases with the largest gaps first (summed over the phases a knob touches)."""
    def weight(k: Knob) -> float:
        mine = words(f"{k.name.replace('_', ' ')} {k.doc}")
        return sum(g for phase, g in gaps.items() if mine & words(phase))
    return sorted(knobs, key=lambda k: -weight(k))


class TunerPlanner(Planner):
    name = "tuner"

    def __init__(self, seed: int = 0, profile: bool = True):
        self.seed, self.profile = seed, profile
        self.profiled: set[str] = set()
        # the schedule model's predictions of foreseen moves, worked out on a CPU thread while the GPU evaluates
        # (a prediction takes ~1 s; on the proposal's path it would cost a fifth of the tuner's rate)
        self.modelling = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tuner-model")
        self.foreseen: dict[tuple, Future] = {}
        self.proposed: set[tuple] = set()   # (parent, point) of every move proposed: never foreseen again

    def settings(self) -> dict:
        return {"seed": self.seed, "profile": self.profile,
                "strategy": "coordinate descent on the archive's versions, phase-gap order, nearest values first; "
                            "two-knob steps; next-fastest version as base; then two-value moves around the best"}

    def propose(self, view: PlannerView) -> PlannedVersion:
        planned = next(self._plans(view, profile=True), None)
        if planned is None:
            raise PlannerExhausted("every one- and two-knob move around every correct version, and every "
                                   "two-value move around the best, has been evaluated")
        return self._predicted(planned, view)

    def _predicted(self, planned: PlannedVersion, view: PlannerView) -> PlannedVersion:
        """The move with the task's schedule model's prediction, when it can model the parent (its source is
        the seed's and it has been profiled): the parent's µs per context plus the modelled change of the
        step, and the phases the model moves. The prediction is recorded, never used to skip a move."""
        if self.tools is None:
            return planned
        parent, point = self._key(planned, view)
        self.proposed.add((parent, point))
        foreseen = self.foreseen.pop((parent, point), None)
        got = foreseen.result() if foreseen is not None else None
        if got is None:   # not foreseen, or foreseen before its parent was profiled
            got = self._prediction(parent, planned.knobs)
        if got is None:
            return planned
        _, stamped, base, new = got
        delta = new.kernel_us - base.kernel_us
        parent_us = view.best_us_per_ctx if parent == view.best_id else self.tools.entry(parent).us_per_ctx
        moved = {k: round(v, 2) for k, v in new.spans_us.items() if abs(v - base.spans_us[k]) >= 0.05}
        return planned.model_copy(update={
            "predicted_us": {c: round(u + delta, 1) for c, u in parent_us.items()},
            "predicted_phases": moved,
            "predicted_change": f"schedule model: {delta:+.1f} µs per step (from {parent}'s stamps at ctx "
                                f"{stamped.ctx}; {len(moved)} phases move)"})

    def upcoming(self, view: PlannerView, n: int) -> list[PlannedVersion]:
        """The next `n` moves in the order propose would take them if nothing were kept meanwhile (bases not yet
        profiled keep the declared knob order here); their model predictions start in the background. Foreseen
        moves no longer among them are dropped (not yet started: cancelled), and a move already proposed (the
        session's view may not hold it yet) is not foreseen again."""
        moves = list(itertools.islice(self._plans(view, profile=False), n))
        keys = {self._key(planned, view): planned for planned in moves}
        for stale in [key for key in self.foreseen if key not in keys]:
            self.foreseen.pop(stale).cancel()
        for key, planned in keys.items():
            if self.tools is not None and key not in self.foreseen and key not in self.proposed:
                self.foreseen[key] = self.modelling.submit(self._prediction, key[0], planned.knobs)
        return moves

    def _key(self, planned: PlannedVersion, view: PlannerView) -> tuple:
        return planned.parent_id or view.best_id, _point(planned.knobs)

    def _prediction(self, parent: str, knobs: dict[str, int]):
        try:
            return self.tools.predict(parent, knobs)
        except ValueError:   # the model cannot take this move (a figure it refuses): the move goes unpredicted
            return None

    def _plans(self, view: PlannerView, profile: bool):
        """Every unevaluated move, in order: one value around each base (the best first), then two around the
        best. With `profile`, a base is profiled (once) before its moves are ordered."""
        by_id = {v.id: v for v in view.archive}
        bases = [view.best_id] + [v.id for v in _fastest(view.archive) if v.id != view.best_id]
        for base in bases:
            yield from self._around(view, by_id, base, 1, profile)
        yield from self._around(view, by_id, view.best_id, 2, profile)

    def _around(self, view: PlannerView, by_id: dict[str, ArchivedVersion], base: str, reach: int, profile: bool):
        source, explicit = self._base(view, base)
        declared = parse_knobs(source)
        if not declared:
            return
        point = {k.name: k.default for k in declared} | {k: v for k, v in explicit.items()
                                                          if k in {d.name for d in declared}}
        sha = source_sha256(source)
        seen = {_point(v.knobs) for v in view.archive if v.source_sha == sha and v.knobs}
        seen.add(_point(point))
        entry = self._profiled(base, by_id) if profile else by_id[base]
        gaps = phase_gaps(entry, view.hardware.copy_tbs if view.hardware else 0.0)
        ordered = knob_order(declared, gaps) if gaps else declared
        start = self.seed % len(ordered) if not gaps else 0
        ordered = ordered[start:] + ordered[:start]
        for make in (_single_moves, _pair_moves):
            for new, moves in make(ordered, point, reach):
                if _point(new) in seen:
                    continue
                seen.add(_point(new))
                why = f" (phase gaps: {_top(gaps)})" if gaps else ""
                yield PlannedVersion(
                    source=source, knobs=new, parent_id=base,
                    hypothesis=f"{' and '.join(moves)} around {base}{why}", predicted_change=UNKNOWN)

    def _base(self, view: PlannerView, base: str) -> tuple[str, dict[str, int]]:
        if base == view.best_id or self.tools is None:
            return view.best_source, view.best_knobs
        _, source, knobs = self.tools.version(base)
        return source, knobs

    def _profiled(self, base: str, by_id: dict[str, ArchivedVersion]) -> ArchivedVersion:
        """The base's archive entry, profiled first (once per base) when the session can profile."""
        if self.profile and self.tools is not None and base not in self.profiled:
            self.profiled.add(base)
            self.tools.call("profile", {"version": base}, self.name)
            return self.tools.entry(base)
        return by_id[base]


def _fastest(archive: list[ArchivedVersion]) -> list[ArchivedVersion]:
    good = [v for v in archive if v.correct and v.us_per_ctx]
    return sorted(good, key=lambda v: v.us_per_ctx[max(v.us_per_ctx)])


def _single_moves(knobs: list[Knob], point: dict[str, int], reach: int):
    for knob in knobs:
        cur = point[knob.name]
        pos = knob.values.index(cur) if cur in knob.values else 0
        for value in sorted(knob.values, key=lambda v: (abs(knob.values.index(v) - pos), v)):
            if value == cur or (reach > 1 and abs(knob.values.index(value) - pos) != reach):
                continue
            yield {**point, knob.name: value}, [f"{knob.name} {cur}->{value}"]


def _pair_moves(knobs: list[Knob], point: dict[str, int], reach: int):
    """Knobs a and b each moved `reach` declared values up or down from the point."""
    for i, a in enumerate(knobs):
        for b in knobs[i + 1:]:
            for da in (-reach, reach):
                for db in (-reach, reach):
                    new, moves = dict(point), []
                    for knob, d in ((a, da), (b, db)):
                        cur = point[knob.name]
                        pos = knob.values.index(cur) if cur in knob.values else 0
                        if not 0 <= pos + d < len(knob.values):
                            break
                        new[knob.name] = knob.values[pos + d]
                        moves.append(f"{knob.name} {cur}->{new[knob.name]}")
                    else:
                        yield new, [" and ".join(moves) + " together"]


def _top(gaps: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.1f} µs" for k, v in sorted(gaps.items(), key=lambda kv: -kv[1])[:2])


def _point(knobs: dict[str, int]) -> tuple:
    return tuple(sorted(knobs.items()))
