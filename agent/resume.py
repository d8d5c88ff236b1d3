"""What a resumed session must check and redo: the trace is of this task, and attempts that never got a
fair verdict (unfinished, or failed on our side) are proposed again before the planner is asked."""

from __future__ import annotations

from dataclasses import dataclass

from megakernel_agent.tasks.spec import TaskSpec
from megakernel_agent.traces.loader import Attempt, Trace
from megakernel_agent.traces.schema import Proposal

from .errors import ResumeMismatch
from .planners.base import PlannedVersion


@dataclass
class Retry:
    planned: PlannedVersion
    parent_id: str
    retry_of: str


def check_same_task(trace: Trace, spec: TaskSpec) -> None:
    """Raise ResumeMismatch when `trace` records another task or size than `spec`."""
    start = trace.start
    if (start.task, start.size) != (spec.name, spec.size):
        raise ResumeMismatch(f"{trace.path} records task {start.task} ({start.size}), not {spec.name} ({spec.size}): "
                             f"resuming it would restore another task's kernel")


def needs_retry(attempt: Attempt) -> bool:
    """No decision and no failure (the session stopped mid-attempt), or a failure marked retryable (infra)."""
    return attempt.outcome == "unfinished" or (attempt.failure is not None and attempt.failure.failure.retryable)


def retries(trace: Trace) -> list[Retry]:
    """The attempts to propose again, in trace order, except those a later proposal already retried."""
    retried = {e.retry_of for e in trace.events if isinstance(e, Proposal) and e.retry_of}
    out = []
    for a in trace.attempts():
        p = a.proposal
        if needs_retry(a) and p.id not in retried:
            planned = PlannedVersion(source=trace.source_of(p.source_sha), knobs=dict(p.knobs),
                                     hypothesis=f"retry of {p.id}: {p.hypothesis}", predicted_change=p.predicted_change)
            out.append(Retry(planned, p.parent_id, p.id))
    return out
