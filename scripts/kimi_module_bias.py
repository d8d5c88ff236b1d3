"""Identical builds timed against each other: does a loaded module (or a model's buffers) carry its own bias?

Why: the sandbox's byte-identical controls have read 0.994x-1.008x with bootstrap intervals that exclude 1.000x
(BENCHMARKS.md, thirty-ninth to forty-fourth sessions), and the same two kernels' difference moved by ~1 µs/token
between leases (forty-sixth and forty-seventh sessions). The worker loads each build once and times every sample
of it through that one module, so anything fixed per load (where its code lies, hence how it meets the
instruction caches) is fixed for the whole compare: a bias the interval cannot see. Here one cubin (the seed's,
compiled once) is loaded as --copies separate modules and their chains are timed over --rounds interleaved
rounds, in three ways, all through one model (the module swapped per chain by model.attach, as the worker does):
  - fixed:    each copy one load, for every round (the worker before the forty-seventh session);
  - rotated:  each copy's rounds take its loads in turn (sandbox.build.Placements, as the worker does now);
  - reloaded: each copy loaded afresh every round (the earlier loads kept loaded).
Per way and copy it prints the median µs/token, the median of the per-round differences from copy 0 and how
many rounds that difference kept its sign: a copy that is slower round after round is a per-load bias.
(The forty-seventh session's first runs, at 6666f77, also had a model per copy, and named fixed "shared".)
Usage: python scripts/kimi_module_bias.py [KERNEL.cu] [--copies 4] [--rounds 12] [--ctx 2048] [--steps 20]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import torch  # noqa: E402
from kimi_chain_stamps import run_chain, sandbox_cubin  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from megakernel_agent.sandbox.build import Placements  # noqa: E402
from megakernel_agent.tasks.cuda_runtime import load_kernel  # noqa: E402
from megakernel_agent.tasks.kimi_linear.task import KimiTask  # noqa: E402

WAYS = ("fixed", "rotated", "reloaded")


def time_way(way: str, task: KimiTask, reference, cubin: bytes, args) -> list[list[float]]:
    """µs/token per copy and round for one way; the copies' order rotates each round."""
    def load():
        return load_kernel(cubin, task.spec.entry, task.spec.declarations)

    copies = [Placements(load, load()) for _ in range(args.copies)]
    fixed = [p.next() for p in copies]
    model = task.build_candidate(reference, fixed[0])
    times: list[list[float]] = [[] for _ in copies]
    kept = []   # reloaded: every load stays loaded, so no later one can take its place
    for r in range(args.rounds):
        order = list(range(len(copies)))
        for i in order[r % len(order):] + order[: r % len(order)]:
            if way == "fixed":
                kernel = fixed[i]
            elif way == "rotated":
                kernel = copies[i].next()
            else:
                kernel = load()
                kept.append(kernel)
            us, _ = run_chain(task, model.attach(kernel), args.ctx, args.steps, args.warmup, args.seed + 1000 * r)
            times[i].append(us)
    return times


def way_table(way: str, times: list[list[float]]) -> Table:
    """Per copy: median, min-max, median per-round difference from copy 0 and its sign count."""
    t = Table(title=f"{way}: identical cubins, chained µs/token over interleaved rounds")
    for col in ("copy", "median", "min-max", "vs copy 0 (median of rounds)", "rounds slower / faster than copy 0"):
        t.add_column(col, justify="right")
    for i, us in enumerate(times):
        diffs = [a - b for a, b in zip(us, times[0], strict=True)]
        t.add_row(str(i), f"{statistics.median(us):.2f}", f"{min(us):.1f}-{max(us):.1f}",
                  "" if i == 0 else f"{statistics.median(diffs):+.2f}",
                  "" if i == 0 else f"{sum(d > 0 for d in diffs)} / {sum(d < 0 for d in diffs)}")
    return t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("kernel", nargs="?", default=None)
    ap.add_argument("--copies", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--ways", nargs="+", choices=WAYS, default=list(WAYS))
    args = ap.parse_args()
    dev = torch.device("cuda:0")
    task = KimiTask("full")
    reference = task.build_reference(dev, 0)
    source = (ROOT / (args.kernel or task.spec.seed_kernel)).read_text()
    console = Console(width=160)
    cubin = sandbox_cubin(task, source)
    for way in args.ways:
        console.print(way_table(way, time_way(way, task, reference, cubin, args)))


if __name__ == "__main__":
    main()
