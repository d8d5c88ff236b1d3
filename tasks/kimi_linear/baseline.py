"""Optimized pure-PyTorch decode in bf16: what a competent PyTorch user writes (upstream baseline.py's role).

Weights are dequantized to bf16 on the fly (int4 kept in memory, as upstream's baseline does),
the 8 routed experts are gathered and dequantized in one batch and run through bmm, matmuls run
in bf16 on the tensor cores, the KDA state stays fp32. This is the floor every speedup is quoted
against; it is not a numerical oracle (see reference.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .modules import KDA, MLA, Block, KimiBlocks, MoE, QuantExperts, QuantLinear
from .quant import dequantize, dequantize_experts
from .reference import apply_rope, rmsnorm, rope_cos_sin, short_conv

BF16 = torch.bfloat16


def linear(mod: QuantLinear, x: torch.Tensor) -> torch.Tensor:
    return x @ dequantize(mod.w_q, mod.scales, mod.zeros, mod.group)


def kda_step(attn: KDA, cfg, x: torch.Tensor, st: dict) -> torch.Tensor:
    h, dk = cfg.kda_heads, cfg.kda_head_dim
    q, k, v = linear(attn.q_proj, x), linear(attn.k_proj, x), linear(attn.v_proj, x)
    q, st["cq"] = short_conv(attn.conv_w[0], q, st["cq"])
    k, st["ck"] = short_conv(attn.conv_w[1], k, st["ck"])
    v, st["cv"] = short_conv(attn.conv_w[2], v, st["cv"])
    q = q.view(h, dk).float() * dk**-0.5
    k = k.view(h, dk).float()
    v = v.view(h, dk).float()
    g = -F.softplus(linear(attn.g_proj, x).float()).view(h, dk)
    beta = torch.sigmoid(F.linear(x, attn.beta_proj.weight).float())
    s = st["S"] * g.exp().unsqueeze(-1)
    pred = torch.bmm(k.unsqueeze(1), s).squeeze(1)
    s = torch.baddbmm(s, (beta[:, None] * k).unsqueeze(-1), (v - pred).unsqueeze(1))
    o = torch.bmm(q.unsqueeze(1), s).squeeze(1)
    st["S"] = s
    return linear(attn.o_proj, o.reshape(-1).to(BF16))


def mla_step(attn: MLA, cfg, x: torch.Tensor, st: dict) -> torch.Tensor:
    h = cfg.mla_heads
    pos = st["c_kv"].shape[0]
    q = linear(attn.q_proj, x).view(h, cfg.qk_nope + cfg.qk_rope)
    kv = linear(attn.kv_a, x)
    cos, sin = rope_cos_sin(pos, cfg.qk_rope, cfg.rope_theta, x.device)
    q_rope = apply_rope(q[:, cfg.qk_nope :], cos, sin)
    k_rope = apply_rope(kv[cfg.kv_lora :], cos, sin)
    st["c_kv"] = torch.cat([st["c_kv"], kv[None, : cfg.kv_lora]], 0)
    st["k_rope"] = torch.cat([st["k_rope"], k_rope[None]], 0)
    kvb = linear(attn.kv_b, st["c_kv"]).view(-1, h, cfg.qk_nope + cfg.v_head)
    k_nope, v = kvb[..., : cfg.qk_nope], kvb[..., cfg.qk_nope :]
    scale = (cfg.qk_nope + cfg.qk_rope) ** -0.5
    scores = torch.einsum("hd,lhd->hl", q[:, : cfg.qk_nope], k_nope) + q_rope @ st["k_rope"].T
    p = torch.softmax(scores.float() * scale, dim=-1).to(BF16)
    o = torch.einsum("hl,lhd->hd", p, v)
    return linear(attn.o_proj, o.reshape(-1))


def _gathered(mod: QuantExperts, idx: torch.Tensor) -> torch.Tensor:
    return dequantize_experts(mod.w_q[idx], mod.scales[idx], mod.zeros[idx], mod.group)


def _ffn(gate: QuantExperts, up: QuantExperts, down: QuantExperts, idx: torch.Tensor, x: torch.Tensor):
    xb = x.expand(idx.numel(), 1, -1)
    act = F.silu(torch.bmm(xb, _gathered(gate, idx))) * torch.bmm(xb, _gathered(up, idx))
    return torch.bmm(act, _gathered(down, idx)).squeeze(1)


def moe_step(moe: MoE, cfg, x: torch.Tensor) -> torch.Tensor:
    probs = torch.softmax(F.linear(x, moe.router.weight).float(), dim=-1)
    w, idx = torch.topk(probs, cfg.n_active)
    w = w / (w.sum() + 1e-9) * cfg.routed_scaling
    routed = _ffn(moe.gate, moe.up, moe.down, idx, x).float()
    shared_idx = torch.arange(cfg.n_shared, device=x.device)
    shared = _ffn(moe.s_gate, moe.s_up, moe.s_down, shared_idx, x).float()
    return (w @ routed + shared.sum(0)).to(BF16)


def block_step(blk: Block, cfg, x: torch.Tensor, st: dict) -> torch.Tensor:
    attn = kda_step if blk.kind == "K" else mla_step
    h = x + attn(blk.attn, cfg, rmsnorm(x, blk.attn_norm), st)
    return h + moe_step(blk.moe, cfg, rmsnorm(h, blk.moe_norm))


class BaselineModel(KimiBlocks):
    """`step(hidden, state) -> (hidden, state)` in bf16 PyTorch; many kernel launches per token."""

    @torch.no_grad()
    def step(self, hidden: torch.Tensor, state: list[dict]) -> tuple[torch.Tensor, list[dict]]:
        for blk, st in zip(self.blocks, state, strict=True):
            hidden = block_step(blk, self.cfg, hidden, st)
        return hidden, state
