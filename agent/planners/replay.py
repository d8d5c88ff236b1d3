"""Replay planner: re-proposes a saved trace's proposals in order (reproduces a session)."""

from __future__ import annotations

from megakernel_agent.traces.loader import load

from .base import PlannedVersion, Planner, PlannerExhausted, PlannerView


class ReplayPlanner(Planner):
    name = "replay"

    def __init__(self, trace_path: str):
        self.trace_path = trace_path
        trace = load(trace_path)
        self._queue = [(a.proposal, trace.source_of(a.proposal.source_sha)) for a in trace.attempts()]

    def settings(self) -> dict:
        return {"trace": str(self.trace_path), "proposals": len(self._queue)}

    def propose(self, view: PlannerView) -> PlannedVersion:
        if not self._queue:
            raise PlannerExhausted("every recorded proposal has been replayed")
        return _planned(*self._queue.pop(0))

    def upcoming(self, view: PlannerView, n: int) -> list[PlannedVersion]:
        return [_planned(p, source) for p, source in self._queue[:n]]


def _planned(p, source: str) -> PlannedVersion:
    return PlannedVersion(source=source, knobs=dict(p.knobs), hypothesis=f"replay of {p.id}: {p.hypothesis}",
                          predicted_change=p.predicted_change)
