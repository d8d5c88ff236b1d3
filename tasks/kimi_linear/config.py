"""Shape configuration of the Kimi-Linear hybrid block (field names match upstream `Config`)."""

from __future__ import annotations

import torch
from pydantic import BaseModel, ConfigDict, model_validator


class KimiConfig(BaseModel):
    """One repeating motif of Kimi-Linear: KDA layers and MLA layers, each followed by a MoE FFN."""

    model_config = ConfigDict(frozen=True)

    hidden: int = 2304
    kda_heads: int = 32
    kda_head_dim: int = 128
    short_conv: int = 4
    mla_heads: int = 32
    kv_lora: int = 512
    qk_nope: int = 128
    qk_rope: int = 64
    v_head: int = 128
    rope_theta: float = 10000.0
    n_experts: int = 64
    n_active: int = 8
    n_shared: int = 1
    moe_inter: int = 1024
    routed_scaling: float = 2.446
    group: int = 128
    pattern: tuple[str, ...] = ("K", "K", "K", "M")

    @property
    def dtype(self) -> torch.dtype:
        return torch.bfloat16

    @property
    def kda_dim(self) -> int:
        return self.kda_heads * self.kda_head_dim

    @property
    def mla_q_dim(self) -> int:
        return self.mla_heads * (self.qk_nope + self.qk_rope)

    @property
    def kv_b_dim(self) -> int:
        return self.mla_heads * (self.qk_nope + self.v_head)

    @model_validator(mode="after")
    def _check_quantizable(self) -> KimiConfig:
        in_dims = {
            "hidden": self.hidden,
            "kda_heads*kda_head_dim": self.kda_dim,
            "kv_lora": self.kv_lora,
            "mla_heads*v_head": self.mla_heads * self.v_head,
            "moe_inter": self.moe_inter,
        }
        bad = [name for name, v in in_dims.items() if v % self.group]
        if bad:
            raise ValueError(f"input dims {bad} must be multiples of the quant group {self.group}")
        if set(self.pattern) - {"K", "M"}:
            raise ValueError(f"pattern may contain only 'K' and 'M', got {self.pattern}")
        if self.qk_rope % 2:
            raise ValueError("qk_rope must be even (RoPE rotates pairs)")
        if self.n_active > self.n_experts:
            raise ValueError("n_active cannot exceed n_experts")
        return self


FULL = KimiConfig()

# Small enough for CPU tests in seconds, same structure (every dim still a multiple of the group).
SMALL = KimiConfig(
    hidden=256,
    kda_heads=4,
    kda_head_dim=64,
    mla_heads=4,
    kv_lora=128,
    qk_nope=64,
    qk_rope=32,
    v_head=64,
    n_experts=16,
    n_active=4,
    moe_inter=256,
)

CONFIGS = {"full": FULL, "small": SMALL}


def build_config(shape: dict) -> KimiConfig:
    """Upstream-compatible constructor: only `n_experts` varies across upstream shapes."""
    return KimiConfig(n_experts=int(shape.get("n_experts", 64)))
