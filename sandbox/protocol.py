"""Messages between the parent (no CUDA) and a GPU worker process: one JSON object per line."""

from __future__ import annotations

import json
from typing import Literal, get_args

from pydantic import BaseModel, Field, ValidationError

from megakernel_agent.traces.results import DeviceInfo, EvalResult


class PhaseTimeouts(BaseModel):
    """Seconds each phase may take before the worker's whole process group is killed."""

    startup: float = 300.0
    build: float = 180.0
    check: float = 180.0
    time: float = 240.0

    def scaled_to(self, remaining: float) -> PhaseTimeouts:
        """No phase may outlive what is left of a budget (the session's end stays within budget)."""
        cap = max(1.0, remaining)
        return PhaseTimeouts(**{k: min(v, cap) for k, v in self.model_dump().items()})


class EvalRequest(BaseModel):
    source: str
    knobs: dict[str, int] = {}
    fresh_seeds: list[int] = Field(default_factory=list, description="chosen by the parent, so they are recorded")
    check: bool = True
    time: bool = True
    contexts: list[int] | None = None
    samples: int | None = None
    steps_per_sample: int | None = None
    baseline: bool = True
    profile: list[int] = Field(default_factory=list, description="contexts whose phase timeline is wanted")


class ProtocolError(ValueError):
    """A worker sent something that is not a well-formed message; the message says what was wrong."""


class Ready(BaseModel):
    event: Literal["ready"]
    pid: int
    device: DeviceInfo


class Fatal(BaseModel):
    event: Literal["fatal"]
    message: str


class PhaseStarted(BaseModel):
    event: Literal["phase"]
    phase: str


class ResultMessage(BaseModel):
    event: Literal["result"]
    result: EvalResult
    retire: bool = False


WorkerMessage = Ready | Fatal | PhaseStarted | ResultMessage
MESSAGE_TYPES = {get_args(m.model_fields["event"].annotation)[0]: m for m in get_args(WorkerMessage)}


def parse_message(line: bytes) -> WorkerMessage:
    """One line from a worker as a typed message; anything else is a ProtocolError naming the problem."""
    try:
        raw = json.loads(line.decode("utf-8"))
    except ValueError:
        raise ProtocolError(f"a line that is not JSON: {line[:200]!r}") from None
    if not isinstance(raw, dict):
        raise ProtocolError(f"a JSON {type(raw).__name__} instead of a message object: {line[:200]!r}")
    if "event" not in raw:
        raise ProtocolError(f"a message without its 'event': {line[:200]!r}")
    kind = MESSAGE_TYPES.get(raw["event"]) if isinstance(raw["event"], str) else None
    if kind is None:
        raise ProtocolError(f"an unknown event {raw['event']!r}")
    try:
        return kind.model_validate(raw)
    except ValidationError as e:
        raise ProtocolError(f"an invalid {raw['event']!r} message: {str(e)[:800]}") from None
