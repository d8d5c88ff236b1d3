"""Bytes one decode step must move through device memory (each weight read once, states read and
written once, the MLA cache read once): the numerator of the roofline fraction."""

from __future__ import annotations

from .config import KimiConfig


def int4_bytes(k: int, n: int, group: int) -> int:
    """Packed codes plus bf16 scales and zeros of one (k, n) W4A16 matrix."""
    return k * n // 2 + 2 * 2 * (k // group) * n


def bytes_per_step(cfg: KimiConfig, ctx: int) -> int:
    g, d = cfg.group, cfg.hidden
    expert = int4_bytes(d, cfg.moe_inter, g) * 2 + int4_bytes(cfg.moe_inter, d, g)
    total = 0
    for kind in cfg.pattern:
        total += 2 * d * 2                                    # two RMSNorm weights
        total += cfg.n_experts * d * 2                        # router
        total += (cfg.n_active + cfg.n_shared) * expert       # experts the token visits
        if kind == "K":
            c = cfg.kda_dim
            total += 4 * int4_bytes(d, c, g) + int4_bytes(c, d, g)
            total += cfg.kda_heads * d * 2 + 3 * c * cfg.short_conv * 2     # beta, conv weights
            total += 2 * cfg.kda_heads * cfg.kda_head_dim**2 * 4            # S read + write
            total += 2 * 3 * (cfg.short_conv - 1) * c * 2                   # conv windows
        else:
            total += int4_bytes(d, cfg.mla_q_dim, g) + int4_bytes(d, cfg.kv_lora + cfg.qk_rope, g)
            total += int4_bytes(cfg.kv_lora, cfg.kv_b_dim, g) + int4_bytes(cfg.mla_heads * cfg.v_head, d, g)
            total += (ctx + 1) * (cfg.kv_lora + cfg.qk_rope) * 2            # cache read incl. new row
    return total + 2 * d * 2                                   # hidden in and out
