"""What a planner sees and returns. A planner is one method: propose(view) -> PlannedVersion.

A planner that studies versions (reads sources, profiles, diagnoses, compares) does it through `tools`,
which the session attaches: every such call is recorded and paid for from the session's budget.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING

from pydantic import BaseModel

from megakernel_agent.sandbox.candidate import Knob
from megakernel_agent.traces.results import DeviceInfo
from megakernel_agent.traces.schema import LlmUsage

from ..archive import ArchivedVersion

if TYPE_CHECKING:
    from ..session_tools import SessionTools


class PlannerView(BaseModel):
    """The read-only world of a planner: task, hardware, the best version and every version so far."""

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
    archive: list[ArchivedVersion]
    budget_left_s: float


class PlannedVersion(BaseModel):
    source: str
    knobs: dict[str, int]
    hypothesis: str
    predicted_change: str = ""
    parent_id: str | None = None          # None: the best
    name: str = ""
    predicted_us: dict[int, float] = {}
    predicted_phases: dict[str, float] = {}
    llm: LlmUsage | None = None


class PlannerExhausted(Exception):
    """The planner has nothing more to propose (search finished, replay done, cost cap, it chose to finish)."""

    def __init__(self, message: str, usage: LlmUsage | None = None):
        super().__init__(message)
        self.usage = usage


class PlannerFailure(Exception):
    """This turn produced no usable proposal; the session records it and asks again."""

    def __init__(self, message: str, usage: LlmUsage | None = None, retryable: bool = True):
        super().__init__(message)
        self.usage, self.retryable = usage, retryable


ErrorHook = Callable[[str, LlmUsage | None], None]


class Planner(ABC):
    name: str = "planner"
    on_error: ErrorHook | None = None   # the session records every failed attempt through this
    tools: SessionTools | None = None   # attached by the session

    def settings(self) -> dict:
        """Recorded in the trace; never includes secrets."""
        return {}

    def accepted(self, version_id: str) -> None:  # noqa: B027 - an optional hook, a no-op by default
        """The session recorded the last proposal as `version_id` (its outcome follows in the next view)."""

    def restore(self, spent_usd: float) -> None:  # noqa: B027 - an optional hook, a no-op by default
        """A resumed session tells the planner what was already spent (cost caps hold across resumes)."""

    @abstractmethod
    def propose(self, view: PlannerView) -> PlannedVersion: ...

    def upcoming(self, view: PlannerView, n: int) -> list[PlannedVersion]:
        """Up to `n` versions this planner expects to propose next, as far as it can tell from `view` (the session
        compiles them ahead on the CPU). No side effects and no tool calls. Default: it cannot tell."""
        return []
