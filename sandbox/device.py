"""Facts about the GPU a worker runs on, including its measured copy bandwidth (the roofline's ceiling)."""

from __future__ import annotations

import statistics

import torch

from megakernel_agent.traces.results import DeviceInfo


def measure_copy_tbs(device: torch.device, nbytes: int = 2 << 30, repeats: int = 10) -> float:
    """Device-to-device copy, bytes read plus bytes written per second, median of repeats (TB/s)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1000.0)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / statistics.median(times) / 1e12


def device_info(device: torch.device) -> DeviceInfo:
    import cupy

    props = torch.cuda.get_device_properties(device)
    driver = cupy.cuda.runtime.driverGetVersion()
    return DeviceInfo(
        name=props.name, sms=props.multi_processor_count, memory_gb=props.total_memory / 2**30,
        l2_mb=getattr(props, "L2_cache_size", 0) / 2**20, copy_tbs=measure_copy_tbs(device),
        driver=f"{driver // 1000}.{driver % 1000 // 10}", cuda=str(torch.version.cuda), torch=torch.__version__,
        cupy=cupy.__version__, capability=f"{props.major}.{props.minor}", uuid=gpu_uuid(props),
    )


def gpu_uuid(props) -> str:
    """The GPU's UUID as nvidia-smi writes it ("GPU-" and 32 hex digits in 5 groups), or "" where torch has none."""
    raw = str(getattr(props, "uuid", "") or "")
    digits = raw.removeprefix("GPU-").replace("-", "")
    if len(digits) != 32:
        return raw
    return "GPU-" + "-".join(digits[a:b] for a, b in ((0, 8), (8, 12), (12, 16), (16, 20), (20, 32)))
