"""Where the time of a Kimi step goes: time the kernel with the attention or the MoE half skipped.

attention = full - skip_attn; moe = full - skip_moe; barriers + launch ~= both skipped. Variants are
not correct by design (skipped work); only their time is read. Usage: python scripts/kimi_phase_profile.py
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from megakernel_agent.sandbox.candidate import Candidate  # noqa: E402
from megakernel_agent.sandbox.timing import time_steps  # noqa: E402
from megakernel_agent.tasks.kimi_linear.megakernel import build_megakernel  # noqa: E402
from megakernel_agent.tasks.kimi_linear.task import KimiTask  # noqa: E402

VARIANTS = {"full": {}, "skip attention": {"SKIP_ATTN": "1"}, "skip MoE": {"SKIP_MOE": "1"},
            "barriers only": {"SKIP_ATTN": "1", "SKIP_MOE": "1"}}


def main() -> None:
    dev = torch.device("cuda:0")
    task = KimiTask("full")
    source = (ROOT / task.spec.seed_kernel).read_text()
    knobs = {k: str(v) for k, v in Candidate(source=source).resolved_knobs().items()}
    ref = task.build_reference(dev, 0)
    model = None
    times: dict[str, dict[int, float]] = {}
    for name, extra in VARIANTS.items():
        kernel = build_megakernel(source, task.cfg, {**knobs, **extra})
        model = task.build_candidate(ref, kernel) if model is None else model.attach(kernel)
        times[name] = {}
        for ctx in (2048, 16384):
            gpu, _ = time_steps(task, model, ctx, 3, 20, 5, 3, dev)
            times[name][ctx] = statistics.median(gpu)
    t = Table(title="Kimi seed: µs per step by variant (median of 5 x 20 steps)")
    for col in ("variant", "ctx 2048", "ctx 16384"):
        t.add_column(col, justify="right")
    for name, row in times.items():
        t.add_row(name, f"{row[2048]:.1f}", f"{row[16384]:.1f}")
    for part, minus in (("attention (full - skip attention)", "skip attention"), ("MoE (full - skip MoE)", "skip MoE")):
        t.add_row(part, *(f"{times['full'][c] - times[minus][c]:.1f}" for c in (2048, 16384)))
    Console(width=140).print(t)


if __name__ == "__main__":
    main()
