"""The interface a task implements for the sandbox (runs inside a GPU worker process)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from importlib import resources
from pathlib import Path, PurePosixPath

import torch
from pydantic import BaseModel

from megakernel_agent.traces.results import PhaseTimeline

from .cuda_runtime import CompiledKernel
from .spec import TaskSpec

ROOT = Path(__file__).resolve().parent.parent

State = list[dict]


def clone_state(state: State) -> State:
    """A deep copy of a decode state (list of dicts of tensors)."""
    return [{k: v.clone() for k, v in st.items()} for st in state]


class ModelledStep(BaseModel):
    """A schedule model's step: kernel µs (spans plus waits) and each phase's modelled span, in kernel order."""

    kernel_us: float
    spans_us: dict[str, float]


class ScheduleModelError(ValueError):
    """A schedule-model request the task cannot answer (a what-if or machine figure it does not know)."""


class Task(ABC):
    """A decode-style problem: `step(hidden, state) -> (hidden, state)` for reference, baseline, candidate."""

    spec: TaskSpec

    # ---- compile side (no GPU needed) ----
    @abstractmethod
    def defines(self) -> dict[str, str]:
        """Task dimensions passed to the compiler as -D."""

    @abstractmethod
    def prelude(self) -> str:
        """Text prepended to every candidate (headers, ABI structs, launch macro)."""

    def seed_source(self) -> str:
        """The seed kernel, read as package data: the same text from a checkout and from an installed wheel."""
        inside = PurePosixPath(self.spec.seed_kernel).relative_to("kernels")
        return (resources.files("megakernel_agent.kernels") / inside.as_posix()).read_text()

    def what_ifs(self) -> dict[str, str]:
        """Named what-ifs the task's schedule model knows (key: what it models); none without a model."""
        return {}

    def model_step(self, source: str, knobs: dict[str, int], stamped: PhaseTimeline, what_if: str | None = None,
                   machine: dict[str, float | str] | None = None,
                   stamped_knobs: dict[str, int] | None = None) -> ModelledStep | None:
        """The task's schedule model of one step of `source` with `knobs` (the phases it does not simulate from
        `stamped`, a profile of the version with `stamped_knobs`, by default `knobs`), or None: the task has no
        model, `source` is not the schedule the model mirrors, or the knobs moved change the stamped phases."""
        return None

    # ---- GPU side ----
    @abstractmethod
    def build_reference(self, device: torch.device, weight_seed: int) -> torch.nn.Module:
        """The fp32 oracle with freshly generated weights."""

    @abstractmethod
    def build_baseline(self, reference: torch.nn.Module) -> torch.nn.Module:
        """The optimized-PyTorch floor, sharing the reference's weights."""

    @abstractmethod
    def build_candidate(self, reference: torch.nn.Module, kernel: CompiledKernel) -> torch.nn.Module:
        """A model whose step launches `kernel` once, sharing the reference's weights."""

    @abstractmethod
    def make_token(self, seed: int, device: torch.device) -> torch.Tensor:
        """A step's input hidden vector (a token's embedding, as decoding feeds each step)."""

    def make_inputs(self, seed: int, ctx: int, device: torch.device) -> tuple[torch.Tensor, State]:
        """Hidden vector and decode state holding `ctx` tokens."""
        return self.make_token(seed, device), self.make_state(seed, ctx, device)

    @abstractmethod
    def make_state(self, seed: int, ctx: int, device: torch.device) -> State:
        """A decode state holding `ctx` tokens."""

    @abstractmethod
    def observables(self, hidden: torch.Tensor, state: State, ctx: int) -> dict[str, torch.Tensor]:
        """Every tensor a step produces or updates, by name (after a step from a `ctx`-token state)."""

    @abstractmethod
    def untouched(self, state_before: State, state_after: State, ctx: int) -> dict[str, bool]:
        """Parts of the state a step must leave bit-identical (e.g. old cache rows), by name."""

    @abstractmethod
    def tensor_class(self, name: str, reference: torch.nn.Module | None = None) -> str:
        """Key into spec.tolerances for an observable; `reference` (after its step) may refine it."""

    def reference_variants(self, reference: torch.nn.Module, hidden: torch.Tensor, state: State,
                           distance: Callable[[torch.Tensor, State], float] | None = None, start: float = 0.0
                           ) -> list[tuple[str, torch.Tensor, State]]:
        """Other equally valid reference results for these inputs (e.g. at a routing near-tie).

        Called right after the reference's own step on the same inputs; the candidate passes if it
        matches the reference or any variant. `distance(out, state)`, when given, says how far the
        candidate is from a variant (at most 1.0: it matches), and `start` how far it is from the plain
        reference: a task may search its variants nearest first and stop at a match. Default: the
        reference is unique.
        """
        return []

    @abstractmethod
    def rewind(self, state: State, ctx: int) -> State:
        """The same state seen as holding only `ctx` tokens (for repeatable timing)."""

    # ---- phase timeline (sandbox/phases.py: what a -DPHASE_STAMPS=1 build writes, and where) ----
    def phase_names(self) -> list[str]:
        """The phases a stamped build of this task's kernels marks, in order; none: it cannot be profiled."""
        return []

    def phase_bytes(self, ctx: int) -> list[int]:
        """Bytes each of phase_names() must move at `ctx`: the bytes model split by phase."""
        return []

    def scratch(self, model: torch.nn.Module) -> torch.Tensor:
        """A candidate model's scratch buffer (MK_LAUNCH_CONTRACT's, allocated on its first step): a stamped
        build leaves its stamps at the end of it."""
        return model._scratch

    @staticmethod
    def clone_state(state: State) -> State:
        return clone_state(state)


def sharing_weights(cls: type[torch.nn.Module], cfg, reference: torch.nn.Module) -> torch.nn.Module:
    """A `cls(cfg)` built on the reference's device and loaded with its weights (strict, as upstream)."""
    with torch.device(next(reference.parameters()).device):
        model = cls(cfg)
    model.load_state_dict(reference.state_dict(), strict=True)
    return model.eval()
