"""Trace events: one JSON object per line, discriminated by `type`, versioned by `schema_version`.

A trace is self-contained: the first event records the task and the environment; a kernel source is
stored once, carried by the first proposal (or measure) that uses it and referenced by sha256 after.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Annotated, Literal

from pydantic import BaseModel, Field, TypeAdapter

from .results import BuildResult, DeviceInfo, EvalResult, Failure

SCHEMA_VERSION = 1


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


class _Event(BaseModel):
    schema_version: int = SCHEMA_VERSION
    at: str = Field(default_factory=now)


class Environment(BaseModel):
    """Where the session ran (no hostname): GPU facts plus software and project versions."""

    device: DeviceInfo | None = None
    lanes: list[DeviceInfo] = Field([], description="every evaluation lane's GPU, when the session used several")
    python: str
    platform: str
    project_commit: str
    packages: dict[str, str] = {}


class LlmUsage(BaseModel):
    model: str
    calls: int = 1
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    retries: int = 0
    cost_usd: float = 0.0


class SessionStart(_Event):
    type: Literal["session_start"] = "session_start"
    session_id: str
    task: str
    size: str
    task_spec: dict
    planner: str
    planner_settings: dict = {}
    budget_s: float
    environment: Environment
    resumed_from: str | None = None
    inflight: int = Field(1, description="proposals the session kept in flight at once")


class Measure(_Event):
    """The starting kernel, built, checked and timed with the baseline, before any proposal."""

    type: Literal["measure"] = "measure"
    id: str
    source_sha: str
    source: str | None = None
    knobs: dict[str, int] = {}
    result: EvalResult
    gpu: str = Field("", description="the GPU (UUID, else the lane) it was timed on: later decisions there use it")


class Proposal(_Event):
    type: Literal["proposal"] = "proposal"
    id: str
    parent_id: str
    planner: str
    hypothesis: str
    predicted_change: str
    source_sha: str
    source: str | None = Field(None, description="present only on the first use of this source")
    knobs: dict[str, int] = {}
    llm: LlmUsage | None = None
    retry_of: str | None = Field(None, description="the attempt this one repeats (it never finished, or failed "
                                                     "on our side)")
    name: str = Field("", description="the planner's own label for this version (a parent may be named by it)")
    best_seen: str | None = Field(None, description="the best version when this was proposed (with several in "
                                                    "flight, the best may move before this one is decided)")
    in_flight: list[str] = Field([], description="the versions still being evaluated when this was proposed")
    predicted_us: dict[int, float] = Field({}, description="the planner's predicted µs/token per context")
    predicted_phases: dict[str, float] = Field({}, description="predicted span (µs) of named phases")


class Build(_Event):
    type: Literal["build"] = "build"
    id: str
    result: BuildResult


class Evaluate(_Event):
    """Checks, timings and launches of a proposal (its build is in the preceding Build event)."""

    type: Literal["evaluate"] = "evaluate"
    id: str
    result: EvalResult


class Decision(_Event):
    type: Literal["decision"] = "decision"
    id: str
    kept: bool
    rule: str
    reason: str
    ratio: float | None = Field(None, description="median time of the best / median time of this candidate")
    ratio_low: float | None = None
    ratio_high: float | None = None
    prediction: str = ""
    outcome: str = ""
    best_id: str
    gpu: str = Field("", description="the GPU (UUID, else the lane) on which the candidate and the best were compared")
    by_load: bool = Field(False, description="the rule's interval resampled module loads, then samples "
                          "within each; false in traces before the forty-eighth session: samples pooled")


class FailureEvent(_Event):
    type: Literal["failure"] = "failure"
    id: str
    failure: Failure


class PlannerError(_Event):
    """The planner could not produce a usable proposal (bad edit, no tool call, API error, cost cap)."""

    type: Literal["planner_error"] = "planner_error"
    id: str
    planner: str
    message: str
    retryable: bool = True
    llm: LlmUsage | None = None


class PlannerFinished(_Event):
    """The planner chose to stop (its search is done, the model called finish, the cost cap); the LLM usage
    of the turn that decided it."""

    type: Literal["planner_finished"] = "planner_finished"
    planner: str
    message: str
    llm: LlmUsage | None = None


class ToolCall(_Event):
    """A planner's tool call (outline, read, profile, diagnose, compare, model, note) and what it cost."""

    type: Literal["tool_call"] = "tool_call"
    id: str
    planner: str
    tool: str
    input: dict = {}
    ok: bool = True
    summary: str = Field("", description="one line: what came back (kept when old results leave the context)")
    output: str = Field("", description="what the planner was shown, up to a limit")
    device_s: float = Field(0.0, description="wall seconds the tool held the GPU worker")
    versions: list[str] = Field([], description="ids of the evaluations it recorded (Evaluate events)")


class Note(_Event):
    """The session notebook: predictions against outcomes, observations, ideas tried and dropped."""

    type: Literal["note"] = "note"
    id: str
    author: str
    kind: Literal["prediction", "observation", "idea", "dropped", "context"]
    text: str
    refs: list[str] = []


class SessionEnd(_Event):
    type: Literal["session_end"] = "session_end"
    best_id: str
    reason: str
    summary: dict = {}


LLM_EVENTS = ("proposal", "planner_error", "planner_finished")   # event types that carry a planner's usage


Event = Annotated[
    SessionStart | Measure | Proposal | Build | Evaluate | Decision | FailureEvent | PlannerError | PlannerFinished
    | ToolCall | Note | SessionEnd,
    Field(discriminator="type"),
]
EVENT = TypeAdapter(Event)
