"""Predicted routing (issue 28, step 2): how well can each MoE layer's top-8 be known before its MoE phase?

The router's true input is rmsnorm(h, moe_norm) with h = x + mixer(rmsnorm(x, attn_norm)), x the block's
input; its logits are bf16 (F.linear on bf16) and the top-8 breaks equal logits to the lower expert index
(reference.route / routing_sets). A kernel that knew the top-8 earlier could prefetch those experts' int4
chunks while the mixer runs and fetch only the misses after routing. Predictors scored here, each the same
router applied to something available earlier:
  raw x     router(x)                            at the block's start (the whole mixer ahead of the MoE)
  normed x  router(rmsnorm(x, moe_norm))         at the block's start
  prev h    router(rmsnorm(h_prev, moe_norm))    after the previous layer's mixer (two phases ahead; none at layer 0)

Inputs are the task's own: its reference weights (or upstream's initialisation), decode chains as `bench`
times them (a fresh task token per step, the state carried on), seed j at context ctxs[j % 3]. The step is the
reference's block_step taken apart to expose x and the mixer output; the first step is checked bit for bit
against ReferenceModel.step. Output: the residual stream's scale (||mixer|| / ||x||), recall of the true top-8
by each predictor's top-k' per layer, the bytes that prefetching top-k' implies, and how recall would move if
the mixer output were larger or smaller relative to x (the question whether any of this transfers to a trained
model). CPU only; ~2 s per decode step at full size.

Usage: python scripts/routing_prediction.py [--seeds 12] [--steps 6] [--seed-list S ...]
       [--weights task|upstream] [--weight-seed 0] [--size full|small]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from megakernel_agent.tasks.base import clone_state  # noqa: E402
from megakernel_agent.tasks.kimi_linear.bytes_model import bytes_per_step, int4_bytes  # noqa: E402
from megakernel_agent.tasks.kimi_linear.config import KimiConfig  # noqa: E402
from megakernel_agent.tasks.kimi_linear.inputs import build_model  # noqa: E402
from megakernel_agent.tasks.kimi_linear.modules import Block  # noqa: E402
from megakernel_agent.tasks.kimi_linear.reference import (  # noqa: E402
    ReferenceModel,
    kda_step,
    mla_step,
    moe_step,
    rmsnorm,
    routing_sets,
)
from megakernel_agent.tasks.kimi_linear.task import KimiTask  # noqa: E402

PREFETCH_FACTORS = (1.0, 1.25, 1.5, 2.0, 3.0)   # experts prefetched per layer, in units of top-k (8: 8 ... 24)
MIXER_SCALES = (0.05, 0.1, 0.2, 0.3, 0.5, 1.0, 2.0)   # ||mixer|| / ||x|| imposed in the sensitivity sweep
COPY_TBPS = 4.3                             # H200 device copy bandwidth (DESIGN.md section 4)
CPU = torch.device("cpu")


@dataclass(frozen=True)
class LayerTrace:
    """One MoE layer at one decode step: what each predictor and the true router see."""

    layer: int
    ctx: int
    x: torch.Tensor                 # the block's input (bf16)
    mixer: torch.Tensor             # the KDA / MLA output before the residual add (bf16)
    h: torch.Tensor                 # x + mixer (bf16): the MoE input before its norm
    moe: torch.Tensor               # the MoE output (bf16); h + moe is the next layer's x
    prev_h: torch.Tensor | None     # the previous layer's h (None at layer 0)


@dataclass(frozen=True)
class Score:
    """One predictor at one layer trace, against the plain true top-k."""

    layer: int
    ctx: int
    hits: dict[int, int]            # k' -> true experts among the predictor's top-k' (k' of prefetch_sizes)
    cover_rank: int                 # smallest k' whose top-k' holds every true expert
    logit_corr: float               # Pearson correlation of predicted and true logits


Predictor = Callable[[Block, LayerTrace], torch.Tensor | None]
T = TypeVar("T", LayerTrace, Score)


def router_logits(blk: Block, v: torch.Tensor) -> torch.Tensor:
    """The layer's router exactly as reference.route computes it: bf16 F.linear, then fp32."""
    return F.linear(v, blk.moe.router.weight).float()


PREDICTORS: dict[str, Predictor] = {
    "raw x": lambda blk, t: router_logits(blk, t.x),
    "normed x": lambda blk, t: router_logits(blk, rmsnorm(t.x, blk.moe_norm)),
    "prev h": lambda blk, t: None if t.prev_h is None else router_logits(blk, rmsnorm(t.prev_h, blk.moe_norm)),
}


def ranking(logits: torch.Tensor) -> list[int]:
    """Experts best first, equal logits to the lower index (the reference's tie rule)."""
    values = logits.tolist()
    return sorted(range(len(values)), key=lambda e: (-values[e], e))


def prefetch_sizes(cfg: KimiConfig) -> list[int]:
    """The k' scored: PREFETCH_FACTORS x top-k, at most every expert."""
    return [min(cfg.n_experts, round(f * cfg.n_active)) for f in PREFETCH_FACTORS]


def traced_step(ref: ReferenceModel, x: torch.Tensor, state: list[dict], ctx: int
                ) -> tuple[torch.Tensor, list[LayerTrace]]:
    """reference.block_step for every layer, taken apart to record x, the mixer output and h; `ctx` labels
    the traces with the context their chain started from."""
    cfg, traces, prev_h = ref.cfg, [], None
    for i, (blk, st) in enumerate(zip(ref.blocks, state, strict=True)):
        mixer = (kda_step if blk.kind == "K" else mla_step)(blk.attn, cfg, rmsnorm(x, blk.attn_norm), st)
        h = x + mixer
        moe = moe_step(blk.moe, cfg, rmsnorm(h, blk.moe_norm))
        traces.append(LayerTrace(i, ctx, x, mixer, h, moe, prev_h))
        x, prev_h = h + moe, h
    return x, traces


def check_against_reference(ref: ReferenceModel, x: torch.Tensor, state: list[dict]) -> None:
    """Fail loudly unless traced_step gives ReferenceModel.step's output and states bit for bit."""
    want_out, want_state = ref.step(x.clone(), clone_state(state))
    got_state = clone_state(state)
    got_out = traced_step(ref, x.clone(), got_state, 0)[0]
    same = torch.equal(want_out, got_out) and all(
        torch.equal(a[k], b[k]) for a, b in zip(want_state, got_state, strict=True) for k in a)
    if not same:
        raise RuntimeError("traced_step differs from ReferenceModel.step: the reference has changed")


def decode_chain(task: KimiTask, ref: ReferenceModel, seed: int, ctx: int, steps: int) -> list[LayerTrace]:
    """`steps` decode steps from the task's inputs at (seed, ctx): a fresh task token per step, state carried
    on (as sandbox.timing._chain feeds a timed chain)."""
    x, state = task.make_inputs(seed, ctx, CPU)
    traces: list[LayerTrace] = []
    for i in range(steps):
        token = x if i == 0 else task.make_token(seed + i, CPU)
        traces += traced_step(ref, token, state, ctx)[1]
    return traces


def score(ref: ReferenceModel, predictor: Predictor, t: LayerTrace) -> Score | None:
    """How the predictor's ranking covers the true (plain) top-k at this trace; None where it has no input."""
    blk = ref.blocks[t.layer]
    logits = predictor(blk, t)
    if logits is None:
        return None
    true_logits = router_logits(blk, rmsnorm(t.h, blk.moe_norm))
    truth = set(routing_sets(true_logits, ref.cfg.n_active)[0])
    order = ranking(logits)
    hits = {k: len(truth.intersection(order[:k])) for k in prefetch_sizes(ref.cfg)}
    cover = 1 + max(order.index(e) for e in truth)
    corr = float(torch.corrcoef(torch.stack([logits, true_logits]))[0, 1])
    return Score(t.layer, t.ctx, hits, cover, corr)


def near_tie(ref: ReferenceModel, t: LayerTrace) -> bool:
    """Whether the true top-k is a near-tie (more than one valid set: reference.routing_sets)."""
    blk = ref.blocks[t.layer]
    return len(routing_sets(router_logits(blk, rmsnorm(t.h, blk.moe_norm)), ref.cfg.n_active)) > 1


def norm_ratio(t: LayerTrace) -> float:
    """||mixer|| / ||x||: how far the mixer moves the residual stream."""
    return float(t.mixer.float().norm() / t.x.float().norm())


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """Cosine similarity of two vectors, in fp32."""
    return float(F.cosine_similarity(a.float(), b.float(), dim=0))


def rescaled(t: LayerTrace, ratio: float) -> LayerTrace:
    """The trace with its mixer output scaled to ||mixer|| = ratio * ||x|| (h recomputed, bf16 as the reference)."""
    mixer = (t.mixer.float() * (ratio / norm_ratio(t))).to(t.mixer.dtype)
    return LayerTrace(t.layer, t.ctx, t.x, mixer, t.x + mixer, t.moe, t.prev_h)


def quantile(values: Sequence[float], q: float) -> float:
    """Nearest-rank quantile of a non-empty sample."""
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def spread(values: Sequence[float], fmt: str = ".3f") -> str:
    """'median [min, max]' of a sample."""
    return f"{statistics.median(values):{fmt}} [{min(values):{fmt}}, {max(values):{fmt}}]"


def expert_bytes(cfg: KimiConfig) -> int:
    """One routed expert's gate, up and down weights in W4A16 (bytes_model's accounting)."""
    d, m, g = cfg.hidden, cfg.moe_inter, cfg.group
    return 2 * int4_bytes(d, m, g) + int4_bytes(m, d, g)


def stream_table(ref: ReferenceModel, traces: list[LayerTrace]) -> Table:
    """Per layer (the MLA layer per context): ||mixer|| / ||x||, cos(x, h), ||x||, ||moe|| / ||h|| (why the
    previous layer's h predicts poorly) and how many true top-k sets are near-ties."""
    table = Table(title="Residual stream at each MoE layer: how far the mixer moves x (median \\[min, max])")
    for col in ("layer", "ctx", "n", "||mixer|| / ||x||", "cos(x, h)", "||x||", "||moe|| / ||h||",
                "near-tie top-k"):
        table.add_column(col, justify="right")
    for (layer, ctx), group in by_layer(ref, traces).items():
        ties = sum(near_tie(ref, t) for t in group)
        table.add_row(_layer_name(ref, layer), ctx, str(len(group)), spread([norm_ratio(t) for t in group]),
                      spread([cosine(t.x, t.h) for t in group]),
                      spread([float(t.x.float().norm()) for t in group], ".1f"),
                      spread([float(t.moe.float().norm() / t.h.float().norm()) for t in group], ".2f"),
                      f"{ties}/{len(group)}")
    return table


def by_layer(ref: ReferenceModel, items: Sequence[T]) -> dict[tuple[int, str], list[T]]:
    """Traces or scores by layer; the MLA layer also by context (init_state draws the KDA layers' states
    before the MLA cache, so with one seed they are the same at every context)."""
    out: dict[tuple[int, str], list[T]] = {}
    for item in items:
        ctx = str(item.ctx) if ref.blocks[item.layer].kind == "M" else "all"
        out.setdefault((item.layer, ctx), []).append(item)
    return dict(sorted(out.items()))


def _layer_name(ref: ReferenceModel, layer: int) -> str:
    return f"L{layer} {'KDA' if ref.blocks[layer].kind == 'K' else 'MLA'}"


def recall_table(ref: ReferenceModel, scores: dict[str, list[Score]]) -> Table:
    """Recall of the true top-8 by each predictor's top-8, per layer: mean, min, quantiles, hit histogram."""
    k = ref.cfg.n_active
    table = Table(title=f"Recall of the true top-{k} by the predicted top-{k} (chance: {k / ref.cfg.n_experts:.3f})")
    for col in ("predictor", "layer", "ctx", "n", "mean", "min", "p10", "median", "hits: count",
                "logit corr", f"k' for all {k}: median / p90 / max"):
        table.add_column(col, justify="right")
    for name, group_scores in scores.items():
        for (layer, ctx), group in by_layer(ref, group_scores).items():
            recall = [s.hits[k] / k for s in group]
            hist = Counter(s.hits[k] for s in group)
            covers = [s.cover_rank for s in group]
            table.add_row(name, _layer_name(ref, layer), ctx, str(len(group)), f"{statistics.mean(recall):.3f}",
                          f"{min(recall):.3f}", f"{quantile(recall, 0.1):.3f}", f"{statistics.median(recall):.3f}",
                          " ".join(f"{h}:{hist[h]}" for h in sorted(hist, reverse=True)),
                          spread([s.logit_corr for s in group], ".2f"),
                          f"{statistics.median(covers):.0f} / {quantile(covers, 0.9)} / {max(covers)}")
        table.add_section()
    return table


def prefetch_table(ref: ReferenceModel, scores: dict[str, list[Score]], ctx: int) -> Table:
    """Per predictor and k': coverage per layer, expected misses, P(no miss), and the bytes it implies per step
    (prefetched experts that are not routed to, and routed experts missed and fetched after routing)."""
    cfg = ref.cfg
    e_bytes, n_layers, k, step_mb = expert_bytes(cfg), len(cfg.pattern), cfg.n_active, bytes_per_step(cfg, ctx) / 1e6
    table = Table(title=(f"Prefetching the predicted top-k' (one expert = {e_bytes / 1e6:.2f} MB; per step = "
                         f"{n_layers} layers x the mean per layer; step {step_mb:.0f} MB at ctx {ctx}, "
                         f"µs at {COPY_TBPS} TB/s)"))
    layers = range(n_layers)
    for col in ("predictor", "k'", *(f"cover L{i}" for i in layers), "cover all", "misses / layer",
                "P(no miss)", "wasted MB / step", "missed MB / step", "wasted µs", "% of step bytes"):
        table.add_column(col, justify="right")
    for name, group in scores.items():
        for kp in prefetch_sizes(cfg):
            per_layer = [[s.hits[kp] / k for s in group if s.layer == i] for i in layers]
            misses = statistics.mean(k - s.hits[kp] for s in group)
            wasted = n_layers * (kp - k + misses) * e_bytes
            table.add_row(name, str(kp), *(f"{statistics.mean(c):.3f}" if c else "-" for c in per_layer),
                          f"{statistics.mean(s.hits[kp] / k for s in group):.3f}", f"{misses:.2f}",
                          f"{statistics.mean(s.hits[kp] == k for s in group):.2f}", f"{wasted / 1e6:.1f}",
                          f"{n_layers * misses * e_bytes / 1e6:.1f}", f"{wasted / (COPY_TBPS * 1e6):.1f}",
                          f"{100 * wasted / 1e6 / step_mb:.1f}")
        table.add_section()
    return table


def sweep_table(ref: ReferenceModel, traces: list[LayerTrace]) -> Table:
    """The 'normed x' predictor when every mixer output is rescaled to a given ||mixer|| / ||x|| (its direction
    kept): recall as a function of how far the mixer moves the residual stream, all layers pooled."""
    k, sizes = ref.cfg.n_active, prefetch_sizes(ref.cfg)
    table = Table(title=("Sensitivity: 'normed x' predictor with each mixer output rescaled to ||mixer|| = r ||x|| "
                         "(direction kept), all layers pooled; cover@k' / P(no miss @k')"))
    for col in ("r", f"recall@{k} min", *(f"@{kp}" for kp in sizes)):
        table.add_column(col, justify="right")
    for r in MIXER_SCALES:
        group = [score(ref, PREDICTORS["normed x"], rescaled(t, r)) for t in traces]
        cells = [f"{statistics.mean(s.hits[kp] / k for s in group):.3f} / "
                 f"{statistics.mean(s.hits[kp] == k for s in group):.2f}" for kp in sizes]
        table.add_row(f"{r:g}", f"{min(s.hits[k] / k for s in group):.3f}", *cells)
    return table


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=12, help="fresh input seeds (seed j runs at ctxs[j %% 3])")
    p.add_argument("--seed-list", type=int, nargs="+", help="these seeds instead of fresh ones")
    p.add_argument("--steps", type=int, default=6, help="decode steps per seed (state carried on)")
    p.add_argument("--weights", choices=("task", "upstream"), default="task",
                   help="task: random_weights_(weight seed), what the sandbox checks against; upstream: its init")
    p.add_argument("--weight-seed", type=int, default=0)
    p.add_argument("--size", choices=("full", "small"), default="full")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    console = Console(width=200)
    task = KimiTask(args.size)
    ctxs = task.spec.context_lengths
    seeds = args.seed_list or [random.SystemRandom().randrange(2**31 - 1000) for _ in range(args.seeds)]
    t0 = time.perf_counter()
    ref = build_model(ReferenceModel, task.cfg, seed=args.weight_seed if args.weights == "task" else None, device=CPU)
    console.print(f"weights {args.weights} (seed {args.weight_seed if args.weights == 'task' else 'upstream 1234'}),"
                  f" built in {time.perf_counter() - t0:.1f} s; seeds {seeds}; {args.steps} steps each; "
                  f"contexts {ctxs}; torch threads {torch.get_num_threads()}")
    traces: list[LayerTrace] = []
    with torch.no_grad():
        check_against_reference(ref, *task.make_inputs(seeds[0], ctxs[0], CPU))
        for j, seed in enumerate(seeds):
            traces += decode_chain(task, ref, seed, ctxs[j % len(ctxs)], args.steps)
            console.print(f"  seed {seed} ctx {ctxs[j % len(ctxs)]}: done at {time.perf_counter() - t0:.0f} s")
        scores = {name: [s for t in traces if (s := score(ref, p, t)) is not None] for name, p in PREDICTORS.items()}
        console.print(stream_table(ref, traces))
        console.print(recall_table(ref, scores))
        console.print(prefetch_table(ref, scores, ctxs[len(ctxs) // 2]))
        console.print(sweep_table(ref, traces))
    console.print(f"total {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
