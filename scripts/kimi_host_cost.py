"""Where the host time of a Kimi `step()` goes: the whole call, the binding with the launch left out,
and the cooperative launch call alone (the driver), in µs per call (medians of several batches).

The GPU is kept busy by the real steps, so no call waits for the device. Usage:
python scripts/kimi_host_cost.py [--calls 200] [--batches 7]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from sandbox.candidate import Candidate  # noqa: E402
from tasks.cuda_runtime import current_stream  # noqa: E402
from tasks.kimi_linear.megakernel import build_megakernel  # noqa: E402
from tasks.kimi_linear.task import KimiTask  # noqa: E402


def per_call_us(fn, calls: int, batches: int, device: torch.device) -> float:
    """Median over batches of host µs per call; the device is drained between batches."""
    out = []
    for _ in range(batches):
        torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - t0) * 1e6 / calls)
    torch.cuda.synchronize(device)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--batches", type=int, default=7)
    args = ap.parse_args()
    dev = torch.device("cuda:0")
    task = KimiTask("full")
    source = (ROOT / task.spec.seed_kernel).read_text()
    knobs = {k: str(v) for k, v in Candidate(source=source).resolved_knobs().items()}
    model = task.build_candidate(task.build_reference(dev, 0), build_megakernel(source, task.cfg, knobs))
    ctx = 2048
    hidden, state = task.make_inputs(0, ctx, dev)
    box = {"hidden": hidden, "state": state}

    def full_step() -> None:   # chained like the timing loop: the context grows by one token per call
        box["hidden"], box["state"] = model.step(box["hidden"], box["state"])

    full_step()   # packs the parameter block and places the cache
    launcher = model._launcher
    stream = current_stream(dev)
    rows = [("step() as called", per_call_us(full_step, args.calls, args.batches, dev))]
    real_launch = launcher.launch
    launcher.launch = lambda s: None
    try:
        rows.append(("binding without the launch", per_call_us(full_step, args.calls, args.batches, dev)))
    finally:
        launcher.launch = real_launch
    rows.append(("cuLaunchCooperativeKernel alone", per_call_us(lambda: launcher.launch(stream), args.calls,
                                                                 args.batches, dev)))
    t = Table(title=f"Host cost per Kimi step (ctx {ctx}, {args.calls} calls x {args.batches} batches, medians)")
    t.add_column("what")
    t.add_column("µs per call", justify="right")
    for name, us in rows:
        t.add_row(name, f"{us:.1f}")
    Console(width=120).print(t)


if __name__ == "__main__":
    main()
