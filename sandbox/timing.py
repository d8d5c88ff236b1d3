"""Honest timing: CUDA events on the launch stream around many chained steps, after warm-up.

Each sample rewinds the state to the same context length (views, no copies for the candidate), runs
`steps` chained decode steps between two events, and yields µs per step. Host time per step() call
is measured alongside without synchronizing, which is the launch overhead a caller pays.
"""

from __future__ import annotations

import statistics
import time

import torch

from tasks.base import Task
from traces.results import TimingResult

from .stats import spread


def time_steps(task: Task, model, ctx: int, seed: int, steps: int, samples: int, warmup: int,
               device: torch.device) -> tuple[list[float], list[float]]:
    """(µs per step per sample, host µs per step per sample)."""
    hidden, state = task.make_inputs(seed, ctx, device)
    stream = torch.cuda.current_stream(device)
    for _ in range(warmup):
        hidden, state = model.step(hidden, task.rewind(state, ctx))
    torch.cuda.synchronize(device)
    gpu_us, host_us = [], []
    for _ in range(samples):
        state = task.rewind(state, ctx)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        t0 = time.perf_counter()
        for _ in range(steps):
            hidden, state = model.step(hidden, state)
        host = time.perf_counter() - t0
        end.record(stream)
        end.synchronize()
        gpu_us.append(start.elapsed_time(end) * 1000.0 / steps)
        host_us.append(host * 1e6 / steps)
    return gpu_us, host_us


def timing_result(task: Task, ctx: int, steps: int, samples: list[float], host: list[float], copy_tbs: float,
                  baseline: list[float] | None) -> TimingResult:
    med = statistics.median(samples)
    nbytes = task.spec.bytes_per_step[ctx]
    achieved = nbytes / (med * 1e-6) / 1e12
    base_med = statistics.median(baseline) if baseline else None
    return TimingResult(
        ctx=ctx, steps_per_sample=steps, samples_us=samples, median_us=med, spread=spread(samples),
        tok_s=1e6 / med, bytes_per_step=nbytes, achieved_tbs=achieved, roofline=achieved / copy_tbs,
        host_us=statistics.median(host), baseline_median_us=base_med, baseline_samples_us=baseline or [],
        speedup=base_med / med if base_med else None,
    )
