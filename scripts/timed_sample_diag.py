"""Explain a refused timed sample of the Kimi seed: replay its chain to the verified step, then compare the
kernel's step with the reference routed by every set that swaps the top-k's last places at one layer
(however wide the margin), printing each layer's router logits around the boundary.

Usage: python scripts/timed_sample_diag.py SEED CTX STEP [KERNEL.cu] [--knob NAME=VALUE ...]
(weights seed 0, as the worker uses; knobs as the refused candidate had them, the rest at their defaults)
A match with a swap whose margin lies outside the checker's tie band means the band is too narrow for this
kernel's rounding; no match anywhere means the kernel is wrong at this input.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from megakernel_agent.sandbox import checks, timing  # noqa: E402
from megakernel_agent.sandbox.candidate import Candidate  # noqa: E402
from megakernel_agent.tasks.base import clone_state  # noqa: E402
from megakernel_agent.tasks.kimi_linear import reference as ref_mod  # noqa: E402
from megakernel_agent.tasks.kimi_linear import task as task_mod  # noqa: E402
from megakernel_agent.tasks.kimi_linear.megakernel import build_megakernel  # noqa: E402
from megakernel_agent.tasks.kimi_linear.task import KimiTask  # noqa: E402

DEV = torch.device("cuda:0")


def router_inputs(ref, hidden, state) -> list[torch.Tensor]:
    """Each layer's router logits on the reference's own path from (hidden, state)."""
    logits, st = [], clone_state(state)
    for blk, layer in zip(ref.blocks, st, strict=True):
        attn = ref_mod.kda_step if blk.kind == "K" else ref_mod.mla_step
        h = hidden + attn(blk.attn, ref.cfg, ref_mod.rmsnorm(hidden, blk.attn_norm), layer)
        x = ref_mod.rmsnorm(h, blk.moe_norm)
        logits.append(F.linear(x, blk.moe.router.weight).float())
        hidden = h + ref_mod.moe_step(blk.moe, ref.cfg, x)
    return logits


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("seed", type=int)
    ap.add_argument("ctx", type=int)
    ap.add_argument("step", type=int)
    ap.add_argument("kernel", nargs="?", type=Path, default=ROOT / "kernels/kimi_linear/seed.cu")
    ap.add_argument("--knob", action="append", default=[], metavar="NAME=VALUE", help="a knob value (repeatable)")
    ap.add_argument("--search", type=int, default=0, metavar="RUNS",
                    help="also run the checker's own near-tie search with up to RUNS reference runs and RUNS sets "
                         "per layer (each still within reference.MAX_SWAPS swaps), and print the nearest branches")
    args = ap.parse_args()
    seed, ctx, step = args.seed, args.ctx, args.step
    task = KimiTask("full")
    source = args.kernel.read_text()
    try:
        chosen = {name: int(value) for name, value in (k.split("=", 1) for k in args.knob)}
    except ValueError:
        ap.error(f"--knob takes NAME=INTEGER, got {args.knob}")
    knobs = Candidate(source=source, knobs=chosen).resolved_knobs()
    print(f"knobs {knobs}")
    ref = task.build_reference(DEV, 0)
    model = task.build_candidate(ref, build_megakernel(source, task.cfg, {k: str(v) for k, v in knobs.items()}))
    tokens, state = timing._chain(task, seed, ctx, step + 1, DEV)
    for token in tokens[:step]:
        _, state = model.step(token, state)
    before = clone_state(state)
    out, after = model.step(tokens[step].clone(), clone_state(before))
    got = task.observables(out, after, ctx + step)
    k = task.cfg.n_active
    for i, logits in enumerate(router_inputs(ref, tokens[step], before)):
        top = torch.sort(logits, descending=True).values[: k + 3].tolist()
        ulp = ref_mod.bf16_ulp(top[k - 1], top[k - 1])
        print(f"layer {i}: logits k-2..k+2 {[round(v, 5) for v in top[k - 3:k + 2]]}  std {logits.std().item():.4f}  "
              f"margin {(top[k - 1] - top[k]) / ulp:.1f} ulps of the k-th ({ulp:.2e})")
    valid = ref_mod.routing_sets
    ref_mod.routing_sets = lambda logits, kk, ulps=None: valid(logits, kk, ulps=1e9)
    try:
        rows = [("plain", None)] + [(f"layer {layer} set {j + 1}", {layer: j}) for layer in range(4) for j in (1, 2, 3)]
        for label, choices in rows:
            o_r, s_r = ref.step(tokens[step].clone(), clone_state(before), choices=choices)
            want = task.observables(o_r, s_r, ctx + step)
            judged = [checks.compare(n, got[n], want[n], task) for n in ("out", "L3.c_kv_row", "L2.S", "L1.S")]
            print(f"  {label:16s} " + "  ".join(f"{c.name} {c.rel_l2:.4f}" for c in judged))
    finally:
        ref_mod.routing_sets = valid
    if args.search:
        search_wider(task, ref, tokens[step], before, got, ctx + step, step, args.search)


def search_wider(task, ref, hidden, before, got, ctx: int, step: int, runs: int) -> None:
    """The checker's best-first search over valid expert sets (the same tie band), with its caps raised: did
    the caps hide the set this kernel chose? Prints the nearest branches by the checker's own distance (every
    tensor, cosine gates, the continuation slack of a step after the first; at most 1.0 passes)."""
    slack = task.spec.continuation_slack if step else 1.0   # as sandbox.timing judges a timed sample

    def distance(out, st) -> float:
        want = task.observables(out, st, ctx)
        return checks._distance([checks.compare(n, got[n], want[n], task, slack) for n in want])

    caps = task_mod.MAX_TIE_VARIANTS, ref_mod.MAX_SETS_PER_LAYER
    task_mod.MAX_TIE_VARIANTS, ref_mod.MAX_SETS_PER_LAYER = runs, runs
    try:
        o, s = ref.step(hidden.clone(), clone_state(before))
        plain = distance(o, s)
        print(f"search: plain reference {plain:.2f} of the bound; valid sets per layer "
              f"{list(ref.routing_sets)} (capped at {runs})")
        variants = task.reference_variants(ref, hidden, before, distance, start=plain)
        scored = sorted((distance(o, s), label) for label, o, s in variants)
        print(f"search: {len(variants)} runs; nearest: " + "; ".join(f"{d:.2f} {label}" for d, label in scored[:3]))
    finally:
        task_mod.MAX_TIE_VARIANTS, ref_mod.MAX_SETS_PER_LAYER = caps


if __name__ == "__main__":
    main()
