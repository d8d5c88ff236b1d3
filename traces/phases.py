"""The phase timelines a trace holds, by version: from every event whose result carries them (the
starting measure, an evaluation or a profile of a version)."""

from __future__ import annotations

from .loader import Trace
from .results import EvalResult, PhaseTimeline


def timelines_of(trace: Trace) -> dict[str, list[PhaseTimeline]]:
    """Each version's timelines in context order; a later event's timeline at a context replaces an earlier one."""
    by_version: dict[str, dict[int, PhaseTimeline]] = {}
    for event in trace.events:
        result = getattr(event, "result", None)
        if isinstance(result, EvalResult) and result.phases:
            by_version.setdefault(event.id, {}).update({t.ctx: t for t in result.phases})
    return {vid: [by_ctx[c] for c in sorted(by_ctx)] for vid, by_ctx in by_version.items()}
