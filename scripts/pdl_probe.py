"""The boundary between two decode steps, and programmatic dependent launch (PDL) under a cooperative launch.

Issue 28, probe first. scripts/pdl_probe.cu says what the kernel does. For each mode (the seed's plain
cooperative launch; + PDL with the dependents released at exit; + PDL with an explicit trigger as the last
phase starts) and each phase length, this driver launches the kernel back to back (as a decode loop does) and
reports:
- µs per launch: CUDA events around the whole run, divided by the launches (what `bench` measures);
- kernel: per launch, the first block's entry to the last block's done (what the seed's stamps add up to);
- boundary: µs per launch minus kernel, the time no block of either step is working;
- dispatch → previous done: the next launch's first block entry minus the previous launch's last done (negative:
  dispatched while the previous grid still ran), and the same for the dependency met (after griddepcontrol.wait);
- ramp: the next launch's last block entry minus its first (the grid's dispatch spread).
A mode the driver refuses is reported with its error; a mode whose grid barrier times out (the grid was not
co-resident) is reported as such. Medians over the launches after the first `--warmup`.

Usage: python3 scripts/pdl_probe.py [--launches 200] [--phases 20] [--phase-us 5,10]
"""

from __future__ import annotations

import argparse
import ctypes
import sys
from pathlib import Path

import cupy
import numpy
from cluster_probe import SEED_DYN_SMEM
from sm90a_module import load_sm90a

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from megakernel_agent.tasks.cuda_runtime import (  # noqa: E402
    CU_LAUNCH_ATTRIBUTE_COOPERATIVE,
    LaunchAttribute,
    LaunchConfig,
    driver,
)

SOURCE = Path(__file__).with_suffix(".cu")
THREADS, BLOCKS_PER_SM = 256, 2
CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6
MODES = {"plain": 0, "pdl-exit": 1, "pdl-early": 2}
TIMEOUT_NS = 200_000_000


class Params(ctypes.Structure):
    """The kernel's Params, field for field (natural alignment, as the C struct)."""

    _fields_ = [
        ("barrier", ctypes.c_void_p), ("stamps", ctypes.c_void_p), ("phase_ns", ctypes.c_uint64),
        ("timeout_ns", ctypes.c_uint64), ("status", ctypes.c_void_p),
        ("phases", ctypes.c_int32), ("mode", ctypes.c_int32), ("launch", ctypes.c_int32),
    ]



def run_mode(func: int, grid: int, smem: int, mode: str, phases: int, phase_us: float, launches: int,
             warmup: int) -> dict[str, float] | str:
    """Back-to-back launches in one mode; the medians, or why the mode did not run."""
    barrier = cupy.zeros(1, dtype=cupy.uint32)
    status = cupy.zeros(1, dtype=cupy.int32)
    stamps = cupy.zeros(launches * grid * 3, dtype=cupy.uint64)
    attrs = (LaunchAttribute * 2)()
    attrs[0].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE
    attrs[0].value[0] = 1
    attrs[1].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    attrs[1].value[0] = 1
    n_attrs = 1 if mode == "plain" else 2
    cfg = LaunchConfig((grid, 1, 1), (THREADS, 1, 1), smem, None, ctypes.cast(attrs, ctypes.POINTER(LaunchAttribute)),
                       n_attrs)
    params = Params(barrier.data.ptr, stamps.data.ptr, int(phase_us * 1000), TIMEOUT_NS, status.data.ptr,
                    phases, MODES[mode], 0)
    args = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.pointer(params), ctypes.c_void_p))
    drv = driver()
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    cupy.cuda.Device().synchronize()
    start.record()
    for i in range(launches):
        params.launch = i   # cuLaunchKernelEx copies the parameters at the call
        rc = drv.launch(ctypes.c_void_p(ctypes.addressof(cfg)), ctypes.c_void_p(func),
                        ctypes.c_void_p(ctypes.addressof(args)), None)
        if rc:
            cupy.cuda.Device().synchronize()
            return f"refused at launch {i}: {drv.error_name(rc)}"
    stop.record()
    stop.synchronize()
    if int(status.get()[0]):
        return "not co-resident (a grid barrier timed out)"
    per_launch = cupy.cuda.get_elapsed_time(start, stop) * 1000 / launches
    s = stamps.get().reshape(launches, grid, 3).astype(numpy.int64)[warmup:]
    entered, met, done = s[..., 0], s[..., 1], s[..., 2]
    kernel = (done.max(axis=1) - entered.min(axis=1)) / 1e3
    prev_done = done.max(axis=1)[:-1]
    return {
        "µs/launch": per_launch,
        "kernel": float(numpy.median(kernel)),
        "boundary": per_launch - float(numpy.median(kernel)),
        "dispatch − prev done": float(numpy.median((entered.min(axis=1)[1:] - prev_done) / 1e3)),
        "met − prev done": float(numpy.median((met.min(axis=1)[1:] - prev_done) / 1e3)),
        "ramp": float(numpy.median((entered.max(axis=1) - entered.min(axis=1)) / 1e3)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--launches", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--phases", type=int, default=20, help="phases per launch (the seed has 22, 21 barriers)")
    ap.add_argument("--phase-us", default="5,10", help="comma-separated phase lengths to try (µs)")
    ap.add_argument("--smem", type=int, default=SEED_DYN_SMEM, help="dynamic shared memory per block (bytes)")
    args = ap.parse_args()
    func = int(load_sm90a(SOURCE).get_function("pdl_probe").kernel.ptr)
    drv = driver()
    drv.set_max_dynamic_smem(func, args.smem)
    if drv.occupancy(func, THREADS, args.smem) < BLOCKS_PER_SM:
        raise SystemExit(f"{BLOCKS_PER_SM} blocks of {args.smem} B shared memory do not fit an SM")
    grid = drv.sm_count() * BLOCKS_PER_SM
    print(f"{cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()} · grid {grid} × {THREADS} · "
          f"{args.smem} B dynamic smem · {args.launches} launches ({args.warmup} warm-up) × {args.phases} phases")
    keys = ("µs/launch", "kernel", "boundary", "dispatch − prev done", "met − prev done", "ramp")
    print(f"{'mode':10} {'phase µs':>8} " + " ".join(f"{k:>20}" for k in keys))
    for phase_us in (float(x) for x in args.phase_us.split(",")):
        for mode in MODES:
            got = run_mode(func, grid, args.smem, mode, args.phases, phase_us, args.launches, args.warmup)
            if isinstance(got, str):
                print(f"{mode:10} {phase_us:8.1f} {got}")
            else:
                print(f"{mode:10} {phase_us:8.1f} " + " ".join(f"{got[k]:20.2f}" for k in keys))


if __name__ == "__main__":
    main()
