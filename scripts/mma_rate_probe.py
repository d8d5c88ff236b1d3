"""The tensor pipe's rate in A elements per SM cycle: mma.sync m16n8k16 against wgmma m64nNk16 (issue 28, step 1).

scripts/mma_rate_probe.cu says why and what each kernel does. Each kernel runs at two loop lengths; the
difference, divided by the extra instructions, gives the time per instruction with launch cost cancelled.
The SM clock is read from the blocks' own clock64 counts over the same difference. Rates are per SM
(2 blocks x 256 threads on each, as the seed):
  A elements per cycle   what a GEMV consumes (one use per weight), the figure that decides the dequant loop
  flops per cycle        2 x M x N x K per instruction, to compare with the published dense fp16 peak
and "chunk step µs" is the tensor-core time of one seed chunk step (32 KB packed = 65,536 weights per block,
2 blocks per SM) at that rate, to set beside tc_gemv_probe.py's 1.06 µs (mma.sync) and 1.45 µs (seed loop).

Usage: python3 scripts/mma_rate_probe.py [--reps 15]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import cupy
import numpy
from sm90a_module import load_sm90a

SOURCE = Path(__file__).with_suffix(".cu")
THREADS, BLOCKS_PER_SM = 256, 2
SHORT, LONG = 64, 320                    # loop trips of the two launches
WEIGHTS_PER_STEP_PER_SM = 2 * 32 * 1024 * 2   # 2 blocks x 32 KB packed x 2 weights per byte

# kernel: (instructions per loop trip per warp or warpgroup, issuers per block, M, N, K)
KERNELS = {
    "mma_sync_rate": (8, THREADS // 32, 16, 8, 16),
    "wgmma_rate_n8": (32, THREADS // 128, 64, 8, 16),
    "wgmma_rate_n16": (32, THREADS // 128, 64, 16, 16),
    "wgmma_rate_n32": (32, THREADS // 128, 64, 32, 16),
    "wgmma_rate_n64": (32, THREADS // 128, 64, 64, 16),
}


def run(kernel, grid: int, iters: int) -> tuple[float, float]:
    """(seconds, median cycles of the blocks' loops) of one launch."""
    out = cupy.zeros(grid * THREADS, dtype=cupy.float32)
    cycles = cupy.zeros(grid, dtype=cupy.int64)
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    kernel((grid,), (THREADS,), (numpy.int32(iters), out, cycles))
    end.record()
    end.synchronize()
    if not bool(cupy.isfinite(out).all()):
        raise SystemExit("a probe produced a non-finite sum")
    return cupy.cuda.get_elapsed_time(start, end) / 1e3, float(cupy.median(cycles.astype(cupy.float64)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args()
    mod = load_sm90a(SOURCE)
    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    grid = sms * BLOCKS_PER_SM
    print(f"{cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()} · {sms} SMs · grid {grid} x {THREADS}")
    print(f"{'kernel':16} {'ns/instr':>9} {'SM GHz':>7} {'A elem/cyc/SM':>14} {'flop/cyc/SM':>12} "
          f"{'x mma.sync':>10} {'chunk step µs':>14}")
    base = None
    for name, (per_trip, issuers, m, n, k) in KERNELS.items():
        f = mod.get_function(name)
        run(f, grid, SHORT)   # warm-up
        per_instr, clocks = [], []
        for _ in range(args.reps):
            (t_short, c_short), (t_long, c_long) = run(f, grid, SHORT), run(f, grid, LONG)
            extra = (LONG - SHORT) * per_trip           # instructions per issuer
            per_instr.append((t_long - t_short) / extra)
            clocks.append((c_long - c_short) / (t_long - t_short))
        t, ghz = statistics.median(per_instr), statistics.median(clocks) / 1e9
        issued_per_sm = BLOCKS_PER_SM * issuers       # issuers in flight per SM, each one instruction per t
        a_per_cycle = issued_per_sm * m * k / (t * ghz * 1e9)
        flops = a_per_cycle * 2 * n
        base = base or a_per_cycle
        step_us = WEIGHTS_PER_STEP_PER_SM / a_per_cycle / (ghz * 1e3)
        print(f"{name:16} {t * 1e9:9.2f} {ghz:7.2f} {a_per_cycle:14.1f} {flops:12.0f} {a_per_cycle / base:10.2f} "
              f"{step_us:14.3f}")
    print("A elem/cyc/SM: weights consumed per SM cycle (one use each in a GEMV); chunk step µs: one seed chunk "
          "step's tensor work at that rate (tc_gemv_probe.py measured 1.06 with mma.sync, 1.45 for the seed loop)")


if __name__ == "__main__":
    main()
