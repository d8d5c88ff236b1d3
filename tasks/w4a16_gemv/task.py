"""Task wiring of the smoke task (the template for adding a task)."""

from __future__ import annotations

import torch

from ..base import State, Task, sharing_weights
from ..cuda_runtime import CompiledKernel
from ..spec import TaskSpec, TimingSpec, Tolerance
from . import binding
from .model import CONFIGS, GemvBaseline, GemvReference, random_weights_


class GemvTask(Task):
    def __init__(self, size: str = "full"):
        if size not in CONFIGS:
            raise ValueError(f"unknown size {size!r}; choose from {sorted(CONFIGS)}")
        self.cfg = CONFIGS[size]
        d = self.cfg.hidden
        self.spec = TaskSpec(
            name="w4a16_gemv",
            size=size,
            description=f"y = x + bf16(rmsnorm(x) @ W), W int4 {d}x{d} group {self.cfg.group}, one launch.",
            dims=self.cfg.model_dump(),
            seed_kernel="kernels/w4a16_gemv/seed.cu",
            entry=binding.ENTRY,
            context_lengths=[0],
            check_context_lengths=[0],
            fixed_seeds=[0],
            continuation_steps=2,
            tolerances={"out": Tolerance(rel_l2_max=0.02)},
            tolerance_note="bf16 output rounding of the residual sum dominates (~0.004); 5x margin.",
            timing=TimingSpec(steps_per_sample=50, samples=7, baseline_steps_per_sample=20, baseline_samples=5),
            bytes_per_step={0: d * d // 2 + 4 * (d // self.cfg.group) * d + 3 * 2 * d},
        )

    def defines(self) -> dict[str, str]:
        return binding.defines(self.cfg)

    def prelude(self) -> str:
        return binding.prelude()

    def build_reference(self, device, weight_seed: int):
        with torch.device(device):
            model = GemvReference(self.cfg)
        return random_weights_(model, weight_seed).eval()

    def build_baseline(self, reference):
        return sharing_weights(GemvBaseline, self.cfg, reference)

    def build_candidate(self, reference, kernel: CompiledKernel):
        return sharing_weights(binding.GemvKernelModel, self.cfg, reference).attach(kernel)

    def make_token(self, seed: int, device):
        g = torch.Generator(device=device).manual_seed(seed)
        return torch.randn(self.cfg.hidden, device=device, generator=g).to(torch.bfloat16)

    def make_state(self, seed: int, ctx: int, device):
        return []

    def observables(self, hidden: torch.Tensor, state: State, ctx: int) -> dict[str, torch.Tensor]:
        return {"out": hidden}

    def untouched(self, state_before: State, state_after: State, ctx: int) -> dict[str, bool]:
        return {}

    def tensor_class(self, name: str, reference=None) -> str:
        return "out"

    def rewind(self, state: State, ctx: int) -> State:
        return state
