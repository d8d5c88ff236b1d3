"""Measure the optimized-PyTorch baseline's own error against the fp32 reference, per tensor class.

This is the evidence behind the task's tolerances: `python -m tasks.kimi_linear.calibrate --seeds 8`.
Cases whose reference top-k margin is within one bf16 ulp are reported separately (ties).
"""

from __future__ import annotations

import argparse
import statistics

import torch
from rich.console import Console
from rich.table import Table

from ..base import Task
from .task import TIE_ULPS, KimiTask


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--size", default="full")
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--ctx", type=int, default=2048)
    args = ap.parse_args(argv)
    dev = torch.device("cuda:0")
    task = KimiTask(args.size)
    ref = task.build_reference(dev, 0)
    base = task.build_baseline(ref)
    errors: dict[str, list[float]] = {}
    ties = 0
    for seed in range(args.seeds):
        h, st = task.make_inputs(seed, args.ctx, dev)
        o_r, s_r = ref.step(h.clone(), Task.clone_state(st))
        o_b, s_b = base.step(h.clone(), Task.clone_state(st))
        ties += any(m <= TIE_ULPS for m in ref.routing_margins)
        want, got = task.observables(o_r, s_r, args.ctx), task.observables(o_b, s_b, args.ctx)
        for name in want:
            cls = task.tensor_class(name, ref)
            rel = ((got[name].double() - want[name].double()).norm() / want[name].double().norm()).item()
            errors.setdefault(cls, []).append(rel)
    table = Table(title=f"baseline vs fp32 reference, {args.seeds} seeds, ctx {args.ctx} ({ties} with a top-k tie)")
    for col in ("class", "n", "median rel-L2", "max rel-L2", "bound"):
        table.add_column(col, justify="right")
    for cls, vals in sorted(errors.items()):
        table.add_row(cls, str(len(vals)), f"{statistics.median(vals):.4f}", f"{max(vals):.4f}",
                      f"{task.spec.tolerances[cls].rel_l2_max}")
    Console().print(table)


if __name__ == "__main__":
    main()
