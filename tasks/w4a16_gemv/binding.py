"""Host binding: the ABI struct and a model whose step is one cooperative launch."""

from __future__ import annotations

import ctypes

import torch

from ..abi_gen import c_struct, py_struct
from ..cuda_runtime import LAUNCH_CONTRACT_MACRO, CompiledKernel, CooperativeLauncher, stream_getter
from .model import GemvBlock, GemvConfig

ENTRY = "gemv_step"
FIELDS = [
    ("x", "const bf16*", 1),
    ("norm_w", "const bf16*", 1),
    ("wq", "const unsigned char*", 1),
    ("sc", "const bf16*", 1),
    ("zr", "const bf16*", 1),
    ("out", "bf16*", 1),
    ("scratch", "unsigned char*", 1),
    ("counters", "unsigned int*", 1),
]
GemvParams = py_struct("GemvParams", FIELDS)


def defines(cfg: GemvConfig) -> dict[str, str]:
    return {"HIDDEN": str(cfg.hidden), "QGROUP": str(cfg.group), "RMS_EPS": "1e-06f"}


def prelude() -> str:
    return "\n".join([
        "#include <cuda_bf16.h>",
        "typedef __nv_bfloat16 bf16;",
        c_struct("GemvParams", FIELDS),
        'extern "C" __device__ unsigned long long gemv_abi_size = sizeof(GemvParams);',
        LAUNCH_CONTRACT_MACRO,
    ])


class GemvKernelModel(GemvBlock):
    """`step(hidden, []) -> (hidden, [])` with one launch; outputs alternate between two buffers."""

    def attach(self, kernel: CompiledKernel) -> GemvKernelModel:
        if kernel.read_u64("gemv_abi_size") != ctypes.sizeof(GemvParams):
            raise RuntimeError("kernel GemvParams size differs from the host's")
        dev = self.norm.device
        c = kernel.contract
        self._scratch = torch.full((max(c.scratch_bytes, 4),), 0xFF, dtype=torch.uint8, device=dev)
        self._counters = torch.zeros((max(c.counter_words, 1),), dtype=torch.int32, device=dev)
        self._ring = [torch.empty(self.cfg.hidden, dtype=torch.bfloat16, device=dev) for _ in range(2)]
        self._next = [0]   # mutated in place: no nn.Module.__setattr__ on the hot path
        p = GemvParams()
        p.norm_w, p.wq = self.norm.data_ptr(), self.proj.w_q.data_ptr()
        p.sc, p.zr = self.proj.scales.data_ptr(), self.proj.zeros.data_ptr()
        p.scratch, p.counters = self._scratch.data_ptr(), self._counters.data_ptr()
        self._params = p
        self._stream = stream_getter(dev)
        self._launcher = CooperativeLauncher(kernel, p)
        return self

    def poison(self, state: list) -> None:
        self._ring[self._next[0]].fill_(float("nan"))

    def step(self, hidden: torch.Tensor, state: list, out: torch.Tensor | None = None) -> tuple[torch.Tensor, list]:
        """One launch; the output goes to `out` when given (the sandbox keeps every output of a chain)."""
        for name, t in (("hidden", hidden), ("out", out)):
            if t is not None and (t.dtype != torch.bfloat16 or t.numel() != self.cfg.hidden or not t.is_contiguous()):
                raise ValueError(f"{name} must be a contiguous bf16 vector of {self.cfg.hidden}")
        if out is None:
            out = self._ring[self._next[0]]
            self._next[0] ^= 1
        self._params.x, self._params.out = hidden.data_ptr(), out.data_ptr()
        self._launcher.launch(self._stream())
        return out, state
