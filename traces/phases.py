"""The phase timelines a trace holds, by version: from every event whose result carries them (the
starting measure, an evaluation or a profile of a version)."""

from __future__ import annotations

from .loader import Trace
from .results import EvalResult, PhaseTimeline


def timelines_of(trace: Trace) -> dict[str, list[PhaseTimeline]]:
    """Each version's timelines in context order; a later event's timeline at a context replaces an earlier one.

    A planner's profile of version X is recorded as an evaluation `X~profile-<call>`; other `~` ids (a
    confirmation's re-timing of the best under the candidate's id) are not the named version's own."""
    by_version: dict[str, dict[int, PhaseTimeline]] = {}
    for event in trace.events:
        result = getattr(event, "result", None)
        if not isinstance(result, EvalResult) or not result.phases:
            continue
        vid, _, suffix = event.id.partition("~")
        if suffix and not suffix.startswith("profile"):
            continue
        by_version.setdefault(vid, {}).update({t.ctx: t for t in result.phases})
    return {vid: [by_ctx[c] for c in sorted(by_ctx)] for vid, by_ctx in by_version.items()}
