"""What a planner sees and returns. A planner is one method: propose(view) -> Proposal."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

from pydantic import BaseModel

from sandbox.candidate import Knob
from traces.results import DeviceInfo
from traces.schema import LlmUsage


class AttemptSummary(BaseModel):
    """One past attempt, compact: what was tried and what came of it."""

    id: str
    hypothesis: str
    knobs: dict[str, int]
    source_sha: str
    outcome: str                       # measured | kept | build | timeout | crash | wrong | slower | infra
    message: str = ""                  # compile error, failed check, decision reason
    us_per_ctx: dict[int, float] = {}
    registers: int | None = None
    local_bytes: int | None = None
    roofline: float | None = None


class PlannerView(BaseModel):
    """The read-only world of a planner: task, hardware, the best version and the history."""

    task_name: str
    task_description: str
    dims: dict
    context_lengths: list[int]
    bytes_per_step: dict[int, int]
    hardware: DeviceInfo | None
    abi: str
    best_id: str
    best_source: str
    best_knobs: dict[str, int]
    declared_knobs: list[Knob]
    best_us_per_ctx: dict[int, float]
    baseline_us_per_ctx: dict[int, float]
    history: list[AttemptSummary]
    budget_left_s: float


class PlannedVersion(BaseModel):
    source: str
    knobs: dict[str, int]
    hypothesis: str
    predicted_change: str
    llm: LlmUsage | None = None


class PlannerExhausted(Exception):
    """The planner has nothing more to propose (search finished, replay done, cost cap)."""


class PlannerFailure(Exception):
    """This turn produced no usable proposal; the session records it and asks again."""

    def __init__(self, message: str, usage: LlmUsage | None = None, retryable: bool = True):
        super().__init__(message)
        self.usage, self.retryable = usage, retryable


ErrorHook = Callable[[str, LlmUsage | None], None]


class Planner(ABC):
    name: str = "planner"
    on_error: ErrorHook | None = None   # the session records every failed attempt through this

    def settings(self) -> dict:
        """Recorded in the trace; never includes secrets."""
        return {}

    @abstractmethod
    def propose(self, view: PlannerView) -> PlannedVersion: ...
