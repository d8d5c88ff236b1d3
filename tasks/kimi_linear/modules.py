"""Parameter layout of the Kimi-Linear block, name-for-name and shape-for-shape with upstream.

Only containers live here (plus the RoPE frequency table both sides share), so the reference, the
baseline and the megakernel model share one definition and each loads an upstream state dict with
strict=True. This file imports nothing but torch: `export` embeds it verbatim in solution.py.
"""

from __future__ import annotations

import torch
import torch.nn as nn


def rope_inv_freq(dim: int, theta: float, device=None) -> torch.Tensor:
    """fp32 RoPE inverse frequencies exactly as upstream computes them (the kernel receives this table)."""
    return 1.0 / (theta ** (torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim))


class QuantLinear(nn.Module):
    """An (in, out) W4A16 weight: w_q (in/2, out) uint8, scales and zeros (in/group, out) bf16."""

    def __init__(self, in_f: int, out_f: int, group: int = 128):
        super().__init__()
        self.in_f, self.out_f, self.group = in_f, out_f, group
        self.register_buffer("w_q", torch.zeros(in_f // 2, out_f, dtype=torch.uint8))
        self.register_buffer("scales", torch.zeros(in_f // group, out_f, dtype=torch.bfloat16))
        self.register_buffer("zeros", torch.zeros(in_f // group, out_f, dtype=torch.bfloat16))


class QuantExperts(nn.Module):
    """n independent W4A16 (in, out) weights stacked on a leading expert dimension."""

    def __init__(self, n: int, in_f: int, out_f: int, group: int = 128):
        super().__init__()
        self.n, self.in_f, self.out_f, self.group = n, in_f, out_f, group
        self.register_buffer("w_q", torch.zeros(n, in_f // 2, out_f, dtype=torch.uint8))
        self.register_buffer("scales", torch.zeros(n, in_f // group, out_f, dtype=torch.bfloat16))
        self.register_buffer("zeros", torch.zeros(n, in_f // group, out_f, dtype=torch.bfloat16))


class KDA(nn.Module):
    """Kimi delta attention weights: q/k/v/g/o int4 projections, bf16 beta and short-conv weights."""

    def __init__(self, cfg):
        super().__init__()
        d, c, h = cfg.hidden, cfg.kda_heads * cfg.kda_head_dim, cfg.kda_heads
        self.q_proj = QuantLinear(d, c, cfg.group)
        self.k_proj = QuantLinear(d, c, cfg.group)
        self.v_proj = QuantLinear(d, c, cfg.group)
        self.g_proj = QuantLinear(d, c, cfg.group)
        self.beta_proj = nn.Linear(d, h, bias=False, dtype=torch.bfloat16)
        self.conv_w = nn.Parameter(torch.zeros(3, c, cfg.short_conv, dtype=torch.bfloat16))
        self.o_proj = QuantLinear(c, d, cfg.group)


class MLA(nn.Module):
    """Multi-head latent attention weights (all int4)."""

    def __init__(self, cfg):
        super().__init__()
        d, h = cfg.hidden, cfg.mla_heads
        self.q_proj = QuantLinear(d, h * (cfg.qk_nope + cfg.qk_rope), cfg.group)
        self.kv_a = QuantLinear(d, cfg.kv_lora + cfg.qk_rope, cfg.group)
        self.kv_b = QuantLinear(cfg.kv_lora, h * (cfg.qk_nope + cfg.v_head), cfg.group)
        self.o_proj = QuantLinear(h * cfg.v_head, d, cfg.group)


class MoE(nn.Module):
    """Router (bf16), routed experts and shared experts (int4, leading expert dimension)."""

    def __init__(self, cfg):
        super().__init__()
        d, m, e = cfg.hidden, cfg.moe_inter, cfg.n_experts
        self.router = nn.Linear(d, e, bias=False, dtype=torch.bfloat16)
        self.gate = QuantExperts(e, d, m, cfg.group)
        self.up = QuantExperts(e, d, m, cfg.group)
        self.down = QuantExperts(e, m, d, cfg.group)
        self.s_gate = QuantExperts(cfg.n_shared, d, m, cfg.group)
        self.s_up = QuantExperts(cfg.n_shared, d, m, cfg.group)
        self.s_down = QuantExperts(cfg.n_shared, m, d, cfg.group)


class Block(nn.Module):
    """attn_norm -> attention (KDA or MLA) -> residual, moe_norm -> MoE -> residual."""

    def __init__(self, cfg, kind: str):
        super().__init__()
        self.kind = kind
        self.attn_norm = nn.Parameter(torch.ones(cfg.hidden, dtype=torch.bfloat16))
        self.moe_norm = nn.Parameter(torch.ones(cfg.hidden, dtype=torch.bfloat16))
        self.attn = KDA(cfg) if kind == "K" else MLA(cfg)
        self.moe = MoE(cfg)


class KimiBlocks(nn.Module):
    """Root container: `blocks.{i}` in pattern order, as upstream's Model."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.blocks = nn.ModuleList(Block(cfg, k) for k in cfg.pattern)
