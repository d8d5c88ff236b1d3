"""Parameters, fp32 reference and PyTorch baseline of y = x + bf16(rmsnorm(x) @ W), W int4 (D x D)."""

from __future__ import annotations

import torch
import torch.nn as nn
from pydantic import BaseModel, ConfigDict

from ..kimi_linear.modules import QuantLinear
from ..kimi_linear.quant import dequantize
from ..kimi_linear.reference import rmsnorm


class GemvConfig(BaseModel):
    model_config = ConfigDict(frozen=True)

    hidden: int
    group: int = 128


CONFIGS = {"full": GemvConfig(hidden=8192), "small": GemvConfig(hidden=512)}


class GemvBlock(nn.Module):
    def __init__(self, cfg: GemvConfig):
        super().__init__()
        self.cfg = cfg
        self.norm = nn.Parameter(torch.ones(cfg.hidden, dtype=torch.bfloat16))
        self.proj = QuantLinear(cfg.hidden, cfg.hidden, cfg.group)


class GemvReference(GemvBlock):
    """fp32 accumulation over the bf16-dequantized weight; bf16 where upstream-style code rounds."""

    @torch.no_grad()
    def step(self, hidden: torch.Tensor, state: list) -> tuple[torch.Tensor, list]:
        w = dequantize(self.proj.w_q, self.proj.scales, self.proj.zeros, self.cfg.group).float()
        y = (rmsnorm(hidden, self.norm).float() @ w).to(torch.bfloat16)
        return hidden + y, state


class GemvBaseline(GemvBlock):
    """What a PyTorch user writes: dequantize to bf16, bf16 matmul."""

    @torch.no_grad()
    def step(self, hidden: torch.Tensor, state: list) -> tuple[torch.Tensor, list]:
        w = dequantize(self.proj.w_q, self.proj.scales, self.proj.zeros, self.cfg.group)
        return hidden + rmsnorm(hidden, self.norm) @ w, state


@torch.no_grad()
def random_weights_(model: GemvBlock, seed: int) -> GemvBlock:
    dev = model.norm.device
    g = torch.Generator(device=dev).manual_seed(seed)
    p = model.proj
    p.w_q.copy_(torch.randint(0, 256, p.w_q.shape, device=dev, generator=g, dtype=torch.uint8))
    p.scales.copy_(torch.rand(p.scales.shape, device=dev, generator=g) * 0.004 + 0.005)
    p.zeros.copy_(torch.randint(6, 10, p.zeros.shape, device=dev, generator=g).float())
    model.norm.copy_(1.0 + 0.1 * torch.randn(model.norm.shape, device=dev, generator=g))
    return model
