"""Per-phase timeline of one Kimi step from in-kernel %globaltimer stamps (built with -DPHASE_STAMPS=1).

Each block stamps when it arrives at a grid barrier and when it leaves it. For phase i:
span = last arrival at barrier i - first release from barrier i-1 (the phase's critical path),
mean = the average block's own work time, wait = last release - last arrival (the barrier itself).
Medians over several steps. Usage: python scripts/kimi_phase_stamps.py [KERNEL.cu] [--ctx 2048 16384]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from sandbox.candidate import Candidate  # noqa: E402
from tasks.kimi_linear.megakernel import build_megakernel  # noqa: E402
from tasks.kimi_linear.task import KimiTask  # noqa: E402

MAX_STAMPS, MAX_STAMP_BLOCKS = 128, 1024   # as in the kernel
KDA_PHASES = ["kda project", "kda delta", "kda o_proj", "router+shared", "routed gate/up", "down"]
MLA_PHASES = ["mla project", "absorb q", "attention", "merge+absorb v", "mla o_proj", "router+shared",
              "routed gate/up", "down"]


def phase_names(pattern: tuple[str, ...]) -> list[str]:
    names = []
    for i, kind in enumerate(pattern):
        names += [f"L{i} {n}" for n in (KDA_PHASES if kind == "K" else MLA_PHASES)]
    return names


def step_spans(stamps: torch.Tensor, blocks: int, phases: int) -> list[tuple[float, float, float]]:
    """(span, mean block work, barrier wait) in µs per phase from one step's stamps."""
    t = stamps[: 2 * phases, :blocks].double() / 1000.0     # rows: start, arrive0, release0, ..., end
    rows = []
    for i in range(phases):
        begin, arrive = t[2 * i], t[2 * i + 1]
        span = (arrive.max() - begin.min()).item()
        mean = (arrive - begin).mean().item()
        wait = (t[2 * i + 2].max() - arrive.max()).item() if 2 * i + 2 < 2 * phases else 0.0
        rows.append((span, mean, wait))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("kernel", nargs="?", default=None)
    ap.add_argument("--ctx", type=int, nargs="+", default=[2048, 16384])
    ap.add_argument("--steps", type=int, default=7)
    args = ap.parse_args()
    dev = torch.device("cuda:0")
    task = KimiTask("full")
    source = (ROOT / (args.kernel or task.spec.seed_kernel)).read_text()
    knobs = {k: str(v) for k, v in Candidate(source=source).resolved_knobs().items()}
    ref = task.build_reference(dev, 0)
    model = task.build_candidate(ref, build_megakernel(source, task.cfg, {**knobs, "PHASE_STAMPS": "1"}))
    names = phase_names(task.cfg.pattern)
    blocks = torch.cuda.get_device_properties(dev).multi_processor_count * int(knobs.get("BLOCKS_PER_SM", 1))
    per_ctx: dict[int, list[list[tuple[float, float, float]]]] = {}
    for ctx in args.ctx:
        hidden, state = task.make_inputs(0, ctx, dev)
        runs = []
        for i in range(args.steps + 2):
            hidden, state = model.step(hidden, task.rewind(state, ctx))
            torch.cuda.synchronize(dev)
            raw = model._scratch[-8 * MAX_STAMPS * MAX_STAMP_BLOCKS:].view(torch.int64)
            raw = raw.view(MAX_STAMPS, MAX_STAMP_BLOCKS)
            if i >= 2:
                runs.append(step_spans(raw.cpu(), blocks, len(names)))
        per_ctx[ctx] = runs
    t = Table(title=f"Per-phase timeline, µs (median of {args.steps} steps; {blocks} blocks)")
    t.add_column("phase")
    for ctx in args.ctx:
        for col in ("span", "mean", "barrier"):
            t.add_column(f"{col} @{ctx}", justify="right")
    totals = {ctx: [0.0, 0.0] for ctx in args.ctx}
    for i, name in enumerate(names):
        cells = []
        for ctx in args.ctx:
            med = [statistics.median(r[i][j] for r in per_ctx[ctx]) for j in range(3)]
            totals[ctx][0] += med[0]
            totals[ctx][1] += med[2]
            cells += [f"{v:.1f}" for v in med]
        t.add_row(name, *cells)
    t.add_row("total", *[c for ctx in args.ctx for c in (f"{totals[ctx][0]:.1f}", "", f"{totals[ctx][1]:.1f}")])
    Console(width=160).print(t)


if __name__ == "__main__":
    main()
