"""fp32-accumulating oracle of one decode step; the same function as upstream reference.py.

Weights are dequantized to bf16 exactly as upstream does, every product is accumulated in fp32,
and values are rounded to bf16 at the same points as upstream (projection outputs, conv output,
residual adds, RoPE outputs, router logits).
"""

from __future__ import annotations

import itertools
import math

import torch
import torch.nn.functional as F

from .modules import KDA, MLA, Block, KimiBlocks, MoE, QuantExperts, QuantLinear, rope_inv_freq
from .quant import dequantize

EPS = 1.0e-6
TIE_ULPS = 8.0          # a top-k boundary this narrow (bf16 ulps of the k-th logit) may resolve either way,
TIE_SPREAD = 0.07       # and so may one narrower than this share of the logits' standard deviation (see routing_sets)
MAX_SETS_PER_LAYER = 8  # valid expert sets considered at one near-tie layer (the plain one included)
MAX_SWAPS = 2           # ... each differing from the plain top-k in at most this many experts
BF16 = torch.bfloat16


def linear(mod: QuantLinear, x: torch.Tensor) -> torch.Tensor:
    """y = x @ W with W dequantized to bf16, accumulated in fp32, rounded to bf16."""
    w = dequantize(mod.w_q, mod.scales, mod.zeros, mod.group).float()
    return (x.float() @ w).to(BF16)


def expert_weight(mod: QuantExperts, e: int) -> torch.Tensor:
    return dequantize(mod.w_q[e], mod.scales[e], mod.zeros[e], mod.group).float()


def rmsnorm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)
    return (xf * w.float()).to(x.dtype)


def rope_cos_sin(pos: int, dim: int, theta: float, device) -> tuple[torch.Tensor, torch.Tensor]:
    inv = rope_inv_freq(dim, theta, device)
    ang = pos * inv
    return torch.cos(ang), torch.sin(ang)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Interleaved-pair rotation in fp32, rounded back to the input dtype."""
    xf = x.float()
    even, odd = xf[..., 0::2], xf[..., 1::2]
    out = torch.empty_like(xf)
    out[..., 0::2] = even * cos - odd * sin
    out[..., 1::2] = odd * cos + even * sin
    return out.to(x.dtype)


def short_conv(conv_w: torch.Tensor, val: torch.Tensor, window: torch.Tensor):
    """Causal depthwise conv over [window; val] then SiLU; returns (bf16 output, shifted window)."""
    win = torch.cat([window, val[None]], dim=0)
    out = (win.float() * conv_w.float().transpose(0, 1)).sum(0)
    return F.silu(out).to(val.dtype), win[1:]


def kda_step(attn: KDA, cfg, x: torch.Tensor, st: dict) -> torch.Tensor:
    h, dk = cfg.kda_heads, cfg.kda_head_dim
    q, k, v = linear(attn.q_proj, x), linear(attn.k_proj, x), linear(attn.v_proj, x)
    q, st["cq"] = short_conv(attn.conv_w[0], q, st["cq"])
    k, st["ck"] = short_conv(attn.conv_w[1], k, st["ck"])
    v, st["cv"] = short_conv(attn.conv_w[2], v, st["cv"])
    q = q.view(h, dk).float() * dk**-0.5
    k = k.view(h, dk).float()
    v = v.view(h, dk).float()
    g = (-F.softplus(linear(attn.g_proj, x).float())).view(h, dk)
    beta = torch.sigmoid(F.linear(x, attn.beta_proj.weight).float())
    s = st["S"] * g.exp()[:, :, None]
    pred = (s * k[:, :, None]).sum(1)
    s = s + beta[:, None, None] * k[:, :, None] * (v - pred)[:, None, :]
    o = (s * q[:, :, None]).sum(1)
    st["S"] = s
    return linear(attn.o_proj, o.reshape(h * dk).to(BF16))


def mla_step(attn: MLA, cfg, x: torch.Tensor, st: dict) -> torch.Tensor:
    """Materialized form: K/V for every cached token through kv_b (the oracle, not the fast path)."""
    h = cfg.mla_heads
    pos = st["c_kv"].shape[0]
    q = linear(attn.q_proj, x).view(h, cfg.qk_nope + cfg.qk_rope)
    q_nope = q[:, : cfg.qk_nope].float()
    kv = linear(attn.kv_a, x)
    cos, sin = rope_cos_sin(pos, cfg.qk_rope, cfg.rope_theta, x.device)
    q_rope = apply_rope(q[:, cfg.qk_nope :], cos, sin).float()
    k_rope = apply_rope(kv[cfg.kv_lora :], cos, sin)
    st["c_kv"] = torch.cat([st["c_kv"], kv[None, : cfg.kv_lora]], 0)
    st["k_rope"] = torch.cat([st["k_rope"], k_rope[None]], 0)
    kvb = linear(attn.kv_b, st["c_kv"]).view(-1, h, cfg.qk_nope + cfg.v_head).float()
    k_nope, v = kvb[..., : cfg.qk_nope], kvb[..., cfg.qk_nope :]
    scale = (cfg.qk_nope + cfg.qk_rope) ** -0.5
    scores = (
        torch.einsum("hd,lhd->lh", q_nope, k_nope) + torch.einsum("hd,ld->lh", q_rope, st["k_rope"].float())
    ) * scale
    p = torch.softmax(scores, dim=0)
    o = torch.einsum("lh,lhd->hd", p, v)
    return linear(attn.o_proj, o.reshape(h * cfg.v_head).to(BF16))


def routing_sets(logits: torch.Tensor, k: int, ulps: float = TIE_ULPS, spread: float = TIE_SPREAD
                 ) -> list[list[int]]:
    """Every top-k expert set a faithful implementation may choose: the experts above the k-th logit by more
    than the tie band are in every set, and any of those within the band of it may fill the remaining places.
    The band is the wider of `ulps` bf16 ulps at the k-th logit (a logit summed in another order rounds an ulp
    or more apart) and `spread` x the logits' standard deviation: a kernel whose router input is within the
    state tolerances (~1% off in bf16) moves every logit by about 1% of that deviation, whatever the binade.
    On the H200 the seed swapped the k-th expert at a 10-ulp gap of 0.039 (0.046 std) at a k-th logit of 0.77,
    where 8 ulps are only 0.037 std; at logits in [1, 2) 8 ulps are ~0.07 std and never raised a false alarm.
    The first set is the plain top-k (equal logits to the lower index); then, up to MAX_SETS_PER_LAYER in all,
    the sets that differ from it in at most MAX_SWAPS experts, by how much logit they give up (the sum of
    those swapped out minus those swapped in): the swaps a kernel's rounding is likeliest to make come first,
    whichever of several equal logits it drops. (Lexicographic order, used before, never offered dropping the
    first of three experts tied at the k-th place within its 8 sets.)"""
    values = logits.float().tolist()
    order = sorted(range(len(values)), key=lambda e: (-values[e], e))
    if k >= len(values):
        return [order]
    if not all(map(math.isfinite, values)):
        return [order[:k]]   # garbage in (a candidate's non-finite state): no tie to resolve
    kth = values[order[k - 1]]
    tol = max(ulps * bf16_ulp(kth, kth), spread * float(logits.detach().float().std()))
    certain = [e for e in order if values[e] > kth + tol]
    uncertain = [e for e in order if abs(values[e] - kth) <= tol]
    places = k - len(certain)
    chosen, others = uncertain[:places], uncertain[places:places + MAX_SETS_PER_LAYER]   # deeper never ranks in
    ranked = []
    for swaps in range(min(MAX_SWAPS, len(chosen), len(others)) + 1):
        for out in itertools.combinations(chosen, swaps):
            for into in itertools.combinations(others, swaps):
                given_up = sum(values[e] for e in out) - sum(values[e] for e in into)
                ranked.append((given_up, swaps, [e for e in chosen if e not in out] + list(into)))
    ranked.sort(key=lambda r: (r[0], r[1]))   # stable: equal losses keep the enumeration order
    return [certain + tail for _, _, tail in ranked[:MAX_SETS_PER_LAYER]]


def route(moe: MoE, cfg, x: torch.Tensor, choice: int = 0) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Softmax over bf16 router logits in fp32, top-k (equal values to the lower expert index, as the
    kernel breaks ties), renormalised and scaled; with the number of valid expert sets at this input.

    `choice` picks another valid set (routing_sets) when the top-k boundary is a near-tie: the checker
    accepts a candidate that matches any of them. torch.topk leaves the order of equal values open (on CUDA
    it differs between calls and list lengths), so the sets come from one explicit ordering.
    """
    logits = F.linear(x, moe.router.weight).float()
    probs = torch.softmax(logits, dim=-1)
    sets = routing_sets(logits, cfg.n_active)
    idx = torch.tensor(sets[min(choice, len(sets) - 1)], device=x.device)
    w = probs[idx]
    return w / (w.sum() + 1e-9) * cfg.routed_scaling, idx, len(sets)


def bf16_ulp(a: float, b: float) -> float:
    """One bf16 ulp at the larger magnitude of a and b (8 significant bits)."""
    return 2.0 ** (math.floor(math.log2(max(abs(a), abs(b), 1e-30))) - 7)


def routing_margin_ulps(moe: MoE, cfg, x: torch.Tensor) -> float:
    """Gap between the k-th and (k+1)-th bf16 router logits, in bf16 ulps at that magnitude.

    An implementation that sums the same logit in another order may round it one ulp apart, so at
    a margin of one ulp or less the top-k set itself is ambiguous (both choices are correct).
    """
    logits = F.linear(x, moe.router.weight).float()
    if cfg.n_active >= logits.numel():
        return float("inf")
    top = torch.topk(logits, cfg.n_active + 1).values
    kth, nxt = top[-2].item(), top[-1].item()
    if not (math.isfinite(kth) and math.isfinite(nxt)):
        return float("inf")   # garbage in (a candidate's non-finite state): no tie to resolve
    return (kth - nxt) / bf16_ulp(kth, nxt)


def moe_step(moe: MoE, cfg, x: torch.Tensor, margins: list[float] | None = None, choice: int = 0,
             sets: list[int] | None = None) -> torch.Tensor:
    if margins is not None:
        margins.append(routing_margin_ulps(moe, cfg, x))
    w, idx, n_sets = route(moe, cfg, x, choice)
    if sets is not None:
        sets.append(n_sets)
    xf = x.float()

    def ffn(gate: QuantExperts, up: QuantExperts, down: QuantExperts, e: int) -> torch.Tensor:
        act = F.silu(xf @ expert_weight(gate, e)) * (xf @ expert_weight(up, e))
        return act @ expert_weight(down, e)

    out = torch.zeros(cfg.hidden, dtype=torch.float32, device=x.device)
    for j in range(cfg.n_active):
        out = out + w[j] * ffn(moe.gate, moe.up, moe.down, int(idx[j]))
    for s in range(cfg.n_shared):
        out = out + ffn(moe.s_gate, moe.s_up, moe.s_down, s)
    return out.to(BF16)


def block_step(blk: Block, cfg, x: torch.Tensor, st: dict, margins: list[float] | None = None,
               choice: int = 0, sets: list[int] | None = None) -> torch.Tensor:
    attn = kda_step if blk.kind == "K" else mla_step
    h = x + attn(blk.attn, cfg, rmsnorm(x, blk.attn_norm), st)
    return h + moe_step(blk.moe, cfg, rmsnorm(h, blk.moe_norm), margins, choice, sets)


class ReferenceModel(KimiBlocks):
    """The oracle: `step(hidden, state) -> (hidden, state)`, state updated as upstream does.

    After each step `routing_margins` holds every layer's top-k margin (see routing_margin_ulps) and
    `routing_sets` how many expert sets are valid at each layer (more than one at a near-tie).
    `choices` maps a layer to which of its valid sets to route by (0, the plain top-k, elsewhere); the
    checker evaluates those branches too.
    """

    routing_margins: list[float] = []
    routing_sets: list[int] = []

    @torch.no_grad()
    def step(self, hidden: torch.Tensor, state: list[dict], choices: dict[int, int] | None = None
             ) -> tuple[torch.Tensor, list[dict]]:
        prev = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        margins: list[float] = []
        sets: list[int] = []
        choices = choices or {}
        try:
            for i, (blk, st) in enumerate(zip(self.blocks, state, strict=True)):
                hidden = block_step(blk, self.cfg, hidden, st, margins, choices.get(i, 0), sets)
            self.routing_margins, self.routing_sets = margins, sets
        finally:
            torch.backends.cuda.matmul.allow_tf32 = prev
        return hidden, state
