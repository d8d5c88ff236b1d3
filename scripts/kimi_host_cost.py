"""Where the host time of a Kimi `step()` goes: the whole call, the binding with the launch left out,
and the cooperative launch call alone (the driver), in µs per call (medians of several batches); then
the same on a stream created by the caller (torch's default stream is the legacy one).

The GPU is kept busy by the real steps, so no call waits for the device. With --apis, the launch APIs
are timed too, on empty kernels of the Kimi kernel's launch shape (grid, 256 threads, ~109 KB of
dynamic shared memory) with a by-value struct of the ABI's size or of one pointer:
cuLaunchCooperativeKernel, cuLaunchKernelEx with the cooperative attribute (what the binding uses),
plain cuLaunchKernel for reference (not valid for a grid that synchronises), plus the ctypes call
floor and the torch view the binding makes per step. Usage:
python scripts/kimi_host_cost.py [--calls 200] [--batches 7] [--apis]
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from megakernel_agent.sandbox.candidate import Candidate  # noqa: E402
from megakernel_agent.tasks.cuda_runtime import (  # noqa: E402
    CU_LAUNCH_ATTRIBUTE_COOPERATIVE,
    LaunchAttribute,
    LaunchConfig,
    compile_kernel,
    current_stream,
    driver,
)
from megakernel_agent.tasks.kimi_linear.abi import params_type  # noqa: E402
from megakernel_agent.tasks.kimi_linear.megakernel import build_megakernel  # noqa: E402
from megakernel_agent.tasks.kimi_linear.task import KimiTask  # noqa: E402

EMPTY_KERNELS = r"""
struct Big { unsigned long long w[BIG_WORDS]; };
struct Small { unsigned long long w[1]; };
#define BODY if (p.w[0] == 1ull && threadIdx.x == 0 && blockIdx.x == 0) *(volatile int*)0 = 1;
extern "C" __device__ unsigned long long launch_threads = 256, launch_blocks_per_sm = 2,
  launch_dynamic_smem = DYN, scratch_bytes = 0, counter_words = 0;
extern "C" __global__ void big(const __grid_constant__ Big p) { extern __shared__ int s[]; BODY }
extern "C" __global__ void small(const __grid_constant__ Small p) { extern __shared__ int s[]; BODY }
"""


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


def launch_api_rows(calls: int, batches: int, device: torch.device, dyn_smem: int) -> list[tuple[str, float]]:
    """Host µs per call of each launch API on empty kernels with the Kimi launch shape."""
    big_bytes = ctypes.sizeof(params_type(4))
    options = ("-std=c++17", f"-DBIG_WORDS={big_bytes // 8}", f"-DDYN={dyn_smem}")
    kernels = {name: compile_kernel(EMPTY_KERNELS, name, options) for name in ("big", "small")}
    drv = driver()
    lib = drv.lib
    lib.cuLaunchCooperativeKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 2
    lib.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
    grid = drv.sm_count() * 2
    stream = current_stream(device)
    attr = LaunchAttribute(id=CU_LAUNCH_ATTRIBUTE_COOPERATIVE)
    attr.value[0] = 1
    rows = []
    for name, kernel in kernels.items():
        block = (ctypes.c_ulonglong * (big_bytes // 8 if name == "big" else 1))()
        argv = (ctypes.c_void_p * 1)(ctypes.cast(block, ctypes.c_void_p))
        fn = ctypes.c_void_p(kernel.handle)
        fixed = (fn, grid, 1, 1, 256, 1, 1, dyn_smem)
        cfg = LaunchConfig((grid, 1, 1), (256, 1, 1), dyn_smem, stream, ctypes.pointer(attr), 1)
        cfg_ptr = ctypes.cast(ctypes.pointer(cfg), ctypes.c_void_p)
        argv_ptr = ctypes.cast(argv, ctypes.c_void_p)
        apis = {
            "cuLaunchCooperativeKernel": lambda f=fixed, a=argv: lib.cuLaunchCooperativeKernel(*f, stream, a),
            "cuLaunchKernelEx (cooperative)": lambda f=fn, c=cfg_ptr, a=argv_ptr: drv.launch(c, f, a, None),
            "cuLaunchKernel (not cooperative)": lambda f=fixed, a=argv: lib.cuLaunchKernel(*f, stream, a, None),
        }
        for what, call in apis.items():
            drv.check(call(), what)
            us = per_call_us(call, calls, batches, device)
            rows.append((f"{what}, {name} params ({ctypes.sizeof(block)} B)", us))
    libc = ctypes.CDLL(None)
    libc.labs.argtypes, libc.labs.restype = [ctypes.c_long], ctypes.c_long
    rows.append(("ctypes call of libc labs (the foreign-call floor)",
                 per_call_us(lambda: libc.labs(-1), calls, batches, device)))
    cache = torch.empty(20480, 512, dtype=torch.bfloat16, device=device)
    rows.append(("torch as_strided view (the binding makes two per step)",
                 per_call_us(lambda: cache.as_strided((2049, 512), (512, 1)), calls, batches, device)))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--batches", type=int, default=7)
    ap.add_argument("--apis", action="store_true", help="also time the launch APIs on empty kernels")
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
    rows.append(("the cooperative launch call alone", per_call_us(lambda: launcher.launch(stream), args.calls,
                                                                 args.batches, dev)))
    side = torch.cuda.Stream(dev)   # does the legacy default stream's implicit synchronisation cost the driver?
    with torch.cuda.stream(side):
        rows.append(("step() on a created (non-default) stream", per_call_us(full_step, args.calls, args.batches, dev)))
        side_handle = current_stream(dev)
        rows.append(("the launch call alone on that stream",
                     per_call_us(lambda: launcher.launch(side_handle), args.calls, args.batches, dev)))
    if args.apis:
        rows += launch_api_rows(args.calls, args.batches, dev, model._kernel.contract.dynamic_smem)
    t = Table(title=f"Host cost per Kimi step (ctx {ctx}, {args.calls} calls x {args.batches} batches, medians)")
    t.add_column("what")
    t.add_column("µs per call", justify="right")
    for name, us in rows:
        t.add_row(name, f"{us:.1f}")
    Console(width=120).print(t)


if __name__ == "__main__":
    main()
