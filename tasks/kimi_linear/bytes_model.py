"""Bytes one decode step must move through device memory (each weight read once, states read and
written once, the MLA cache read once): the numerator of the roofline fraction, split by the phases
the kernel marks (a phase is charged with what its own work reads or writes, prefetched weights too)."""

from __future__ import annotations

from .config import KimiConfig


def int4_bytes(k: int, n: int, group: int) -> int:
    """Packed codes plus bf16 scales and zeros of one (k, n) W4A16 matrix."""
    return k * n // 2 + 2 * 2 * (k // group) * n


def layer_bytes(cfg: KimiConfig, kind: str, ctx: int) -> dict[str, int]:
    """Bytes of each phase of one KDA ("K") or MLA ("M") layer, by phase name in the kernel's order."""
    g, d = cfg.group, cfg.hidden
    norm = d * 2
    router = norm + cfg.n_experts * d * 2                                   # RMSNorm weight, router
    experts = (cfg.n_active + cfg.n_shared) * (2 * int4_bytes(d, cfg.moe_inter, g) + int4_bytes(cfg.moe_inter, d, g))
    if kind == "K":
        c = cfg.kda_dim
        windows = 3 * (cfg.short_conv - 1) * c * 2                          # conv windows, read or written once
        return {
            "kda project": norm + 4 * int4_bytes(d, c, g) + cfg.kda_heads * d * 2,   # q, k, v, g; beta
            "kda delta": 3 * c * cfg.short_conv * 2 + windows + 2 * cfg.kda_heads * cfg.kda_head_dim**2 * 4,
            "kda o_proj": int4_bytes(c, d, g),
            "router+windows": router + windows,
            "g/u+down": experts,
        }
    return {
        "mla project": norm + int4_bytes(d, cfg.mla_q_dim, g) + int4_bytes(d, cfg.kv_lora + cfg.qk_rope, g),
        "absorb q": int4_bytes(cfg.kv_lora, cfg.mla_heads * cfg.qk_nope, g),         # W_uk: kv_b's key half
        "attention": (ctx + 1) * (cfg.kv_lora + cfg.qk_rope) * 2,                  # cache incl. the new row
        "merge+absorb v": int4_bytes(cfg.kv_lora, cfg.mla_heads * cfg.v_head, g),  # W_uv: kv_b's value half
        "mla o_proj": int4_bytes(cfg.mla_heads * cfg.v_head, d, g),
        "router": router,
        "g/u+down": experts,
    }


def phase_bytes(cfg: KimiConfig, ctx: int) -> dict[str, int]:
    """Bytes of every phase of a step ("L<layer> <phase>", kernel order); the step's input vector is
    read in the first phase, its output written in the last."""
    out = {f"L{i} {name}": n for i, kind in enumerate(cfg.pattern) for name, n in layer_bytes(cfg, kind, ctx).items()}
    out[next(iter(out))] += cfg.hidden * 2
    out[next(reversed(out))] += cfg.hidden * 2
    return out


def bytes_per_step(cfg: KimiConfig, ctx: int) -> int:
    return sum(phase_bytes(cfg, ctx).values())
