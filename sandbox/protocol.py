"""Messages between the parent (no CUDA) and a GPU worker process: one JSON object per line."""

from __future__ import annotations

from pydantic import BaseModel, Field


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
