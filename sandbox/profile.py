"""What one step does on the GPU: the kernels it launches (CUPTI), and a stamped build's phase timeline."""

from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile

from megakernel_agent.tasks.base import Task
from megakernel_agent.traces.results import LaunchCount, PhaseTimeline

from .phases import MAX_STAMP_BLOCKS, check_stamps, marked_phases, phase_timeline, stamp_area, step_phases

PROFILE_WARMUP, PROFILE_STEPS = 2, 7


def count_launches(step, device: torch.device) -> LaunchCount:
    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize(device)
    names, copies = [], 0
    for ev in prof.events():
        if ev.device_type != torch.autograd.DeviceType.CUDA:
            continue
        if ev.name.startswith(("Memcpy", "Memset")):
            copies += 1
        else:
            names.append(ev.name)
    return LaunchCount(kernels=len(names), names=sorted(set(names)), memcpys=copies)


def profile_phases(task: Task, model, ctx: int, grid: int, device: torch.device, steps: int = PROFILE_STEPS,
                   seed: int = 0) -> PhaseTimeline:
    """The phase timeline at `ctx` of a model running a -DPHASE_STAMPS=1 build: every step runs at `ctx` (the
    state rewound) on a fresh token (a step's output is never the next input); its stamps are read after it.

    A kernel whose schedule has another number of grid barriers than the task's phases (a candidate may add
    or merge phases) gets its phases numbered instead of named, with no bytes attributed."""
    blocks = min(grid, MAX_STAMP_BLOCKS)
    hidden, state = task.make_inputs(seed, ctx, device)
    model.step(hidden, state)   # the binding allocates its scratch on the first step
    stamps, events = stamp_area(task.scratch(model))
    stamps.zero_()
    model.step(task.make_token(seed, device), task.rewind(state, ctx))
    torch.cuda.synchronize(device)
    names, nbytes = task.phase_names(), task.phase_bytes(ctx)
    marked = marked_phases(stamps.cpu(), blocks)
    if marked != len(names):
        names, nbytes = [f"phase {i + 1}" for i in range(marked)], [0] * marked
    rows, per_phase = stamps[: 2 * len(names) + 1], events[: len(names)]   # what the phases use, and a row more
    runs = []
    for i in range(1, PROFILE_WARMUP + steps):
        rows.zero_()
        per_phase.zero_()
        model.step(task.make_token(seed + i, device), task.rewind(state, ctx))
        torch.cuda.synchronize(device)
        if i >= PROFILE_WARMUP:
            stamped = rows.cpu()
            check_stamps(stamped, blocks, len(names))
            runs.append(step_phases(stamped, per_phase.cpu(), blocks, len(names)))
    return phase_timeline(ctx, names, nbytes, blocks, runs)
