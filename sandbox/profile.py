"""Count the kernels one step launches, with torch.profiler's CUDA activity (CUPTI)."""

from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile

from traces.results import LaunchCount


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
