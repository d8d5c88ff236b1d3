"""Seeded inputs: weights, decode states and the token.

`init_state`/`init_token` draw exactly what upstream's functions of the same names draw (same
generator, same order), so seeds mean the same thing in both projects. `random_weights_` fills a
full-size model directly on its device in about a second; `upstream_weights_` reproduces
upstream's `reset_parameters` (CPU generator, slow at full size) for bit-compatibility.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from .config import KimiConfig
from .modules import KDA, KimiBlocks, QuantExperts, QuantLinear
from .quant import quantize


def _device(device) -> torch.device:
    return torch.device(device if device is not None else ("cuda:0" if torch.cuda.is_available() else "cpu"))


def init_state(cfg: KimiConfig, context_len: int, seed: int, device=None) -> list[dict]:
    """Per layer: KDA {S fp32 (H,Dk,Dk), cq/ck/cv bf16 (conv-1, H*Dk)}, MLA {c_kv (L,kv_lora), k_rope (L,rope)}."""
    dev = _device(device)
    g = torch.Generator(device=dev).manual_seed(seed)
    h, dk, c = cfg.kda_heads, cfg.kda_head_dim, cfg.kda_dim
    bf16 = torch.bfloat16
    state: list[dict] = []
    for kind in cfg.pattern:
        if kind == "K":
            state.append({
                "S": torch.randn(h, dk, dk, device=dev, generator=g) * 0.05,
                "cq": torch.randn(cfg.short_conv - 1, c, device=dev, generator=g, dtype=bf16) * 0.1,
                "ck": torch.randn(cfg.short_conv - 1, c, device=dev, generator=g, dtype=bf16) * 0.1,
                "cv": torch.randn(cfg.short_conv - 1, c, device=dev, generator=g, dtype=bf16) * 0.1,
            })
        else:
            state.append({
                "c_kv": torch.randn(context_len, cfg.kv_lora, device=dev, generator=g, dtype=bf16) * 0.1,
                "k_rope": torch.randn(context_len, cfg.qk_rope, device=dev, generator=g, dtype=bf16) * 0.1,
            })
    return state


def init_token(cfg: KimiConfig, seed: int, device=None) -> torch.Tensor:
    dev = _device(device)
    g = torch.Generator(device=dev).manual_seed(seed + 1)
    return torch.randn(cfg.hidden, device=dev, generator=g, dtype=torch.bfloat16) * 0.25


@torch.no_grad()
def random_weights_(model: KimiBlocks, seed: int) -> KimiBlocks:
    """Fill every weight on the model's device with int4 codes and group params shaped like upstream's.

    Scales follow what min/max quantization of N(0, 0.02) weights gives (about 0.007), zeros sit
    near the middle of the code range, norms are 1 + small noise so the norm weight is exercised.
    """
    dev = next(model.parameters()).device
    g = torch.Generator(device=dev).manual_seed(seed)

    def uniform(shape, lo, hi):
        return torch.rand(shape, device=dev, generator=g) * (hi - lo) + lo

    for mod in model.modules():
        if isinstance(mod, (QuantLinear, QuantExperts)):
            mod.w_q.copy_(torch.randint(0, 256, mod.w_q.shape, device=dev, generator=g, dtype=torch.uint8))
            mod.scales.copy_(uniform(mod.scales.shape, 0.005, 0.009))
            mod.zeros.copy_(torch.randint(6, 10, mod.zeros.shape, device=dev, generator=g).float())
        elif isinstance(mod, nn.Linear):
            mod.weight.copy_(torch.randn(mod.weight.shape, device=dev, generator=g) * 0.02)
        elif isinstance(mod, KDA):
            mod.conv_w.copy_(torch.randn(mod.conv_w.shape, device=dev, generator=g) * 0.1)
    for blk in model.blocks:
        for norm in (blk.attn_norm, blk.moe_norm):
            norm.copy_(1.0 + 0.1 * torch.randn(norm.shape, device=dev, generator=g))
    return model


@torch.no_grad()
def upstream_weights_(model: KimiBlocks) -> KimiBlocks:
    """Upstream's reset_parameters: one CPU generator (seed 1234) walked over modules in order.

    The model must live on the CPU (as upstream's does when it initializes); move it afterwards.
    """
    g = torch.Generator(device="cpu").manual_seed(1234)
    for mod in model.modules():
        if isinstance(mod, QuantLinear):
            _set_quant(mod.w_q, mod.scales, mod.zeros, torch.randn(mod.in_f, mod.out_f, generator=g) * 0.02, mod.group)
        elif isinstance(mod, QuantExperts):
            for e in range(mod.n):
                w = torch.randn(mod.in_f, mod.out_f, generator=g) * 0.02
                _set_quant(mod.w_q[e], mod.scales[e], mod.zeros[e], w, mod.group)
        elif isinstance(mod, nn.Linear):
            mod.weight.normal_(0.0, 0.02, generator=g)
        elif isinstance(mod, KDA):
            mod.conv_w.normal_(0.0, 0.1, generator=g)
    return model


def _set_quant(w_q, scales, zeros, w, group):
    q, s, z = quantize(w, group)
    w_q.copy_(q)
    scales.copy_(s)
    zeros.copy_(z)


def build_model(cls: type[KimiBlocks], cfg: KimiConfig, seed: int | None = 0, device=None) -> KimiBlocks:
    """Construct `cls` directly on `device`; weights from `random_weights_(seed)` or upstream's if seed is None."""
    if seed is None:
        return upstream_weights_(cls(cfg)).to(_device(device)).eval()
    with torch.device(_device(device)):
        model = cls(cfg)
    return random_weights_(model, seed).eval()
