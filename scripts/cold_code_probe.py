"""What a cold code path costs while device memory is saturated (issue 28; scripts/cold_code_probe.cu says how).

The seed's per-block stamps (BENCHMARKS.md, twenty-eighth session) show a chunk step that is 1.5-2.3 µs slower
on the blocks that run one extra ~150-instruction path, once per layer, while the grid streams its weights. This
times one call of an 8 KB straight-line body on every block (one thread each), after L2 is evicted, in four modes:

  cold, idle       its code from device memory, nothing else in flight
  warm, idle       called once before, so its code is in the SM's instruction cache
  cold, saturated  as cold, with ~1 GB of L2 prefetches queued by the grid just before the call
  warm, saturated  as warm, with the same prefetches queued

If the reading is right, "cold, saturated" is microseconds longer than "cold, idle", and both warm modes are
close to the chain's own time (512 dependent FFMAs). Then "warm, N between" runs N other 8 KB bodies between the
warm-up and the timed call (memory idle): the N at which the call turns cold sizes the SM's instruction cache,
against the seed's 173 KB of code. Each mode is timed over `--launches` launches; the table
shows the median over launches of the blocks' median and of their slowest.

Usage: python3 scripts/cold_code_probe.py [--launches 9] [--mb-per-block 4]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import cupy
import numpy
from sm90a_module import load_sm90a

SOURCE = Path(__file__).with_suffix(".cu")
THREADS, BLOCKS_PER_SM = 128, 2
PIECE = 256 << 10                   # the .cu's bytes per L2 prefetch
COPIES = 16                         # the .cu's instances of the cold body: launch n calls copy n % COPIES
MODES = {"cold, idle": 0, "warm, idle": 1, "cold, saturated": 2, "warm, saturated": 3}
L2_EVICT_FACTOR = 8                 # the eviction buffer is this many times the L2
BETWEEN = (2, 4, 8, 12, 15)         # other bodies (8 KB of code each) run between a warm-up and the timed call


def launch(kernel, grid: int, buf: cupy.ndarray, per_block: int, mode: int, copy: int, evict: cupy.ndarray,
           between: int = 0) -> numpy.ndarray:
    """Evict L2, run one launch in `mode` on body `copy` (with `between` other bodies after the warm-up), and
    return every block's timed call in µs."""
    evict.fill(mode + 1)
    out = cupy.zeros(grid, dtype=cupy.uint64)
    sink = cupy.zeros(grid, dtype=cupy.float32)
    args = (buf, numpy.uint64(per_block), numpy.int32(mode), numpy.int32(copy % COPIES), numpy.int32(between),
            numpy.float32(1.0), out, sink)
    kernel((grid,), (THREADS,), args)
    cupy.cuda.runtime.deviceSynchronize()
    return out.get().astype(numpy.float64) / 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--launches", type=int, default=9)
    ap.add_argument("--mb-per-block", type=int, default=4, help="L2 prefetches each block queues when saturating")
    args = ap.parse_args()
    dev = cupy.cuda.Device()
    sms, l2 = dev.attributes["MultiProcessorCount"], dev.attributes["L2CacheSize"]
    grid = sms * BLOCKS_PER_SM
    per_block = args.mb_per_block << 20
    if per_block % PIECE:
        raise SystemExit(f"--mb-per-block must make whole {PIECE >> 10} KB pieces")
    kernel = load_sm90a(SOURCE).get_function("cold_probe")
    buf = cupy.zeros(grid * per_block, dtype=cupy.uint8)
    evict = cupy.zeros(L2_EVICT_FACTOR * l2 // 4, dtype=cupy.int32)
    name = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    print(f"{name} · {sms} SMs · L2 {l2 >> 20} MB · grid {grid} · {grid * per_block >> 20} MB of prefetches when "
          f"saturating · {args.launches} launches per mode")
    launches = iter(range(1 << 30))                   # launch n calls body copy n % COPIES
    launch(kernel, grid, buf, per_block, 0, next(launches), evict)   # module load and first-launch costs
    print(f"{'mode':18} {'median block µs':>16} {'slowest block µs':>17}")
    runs = [(label, mode, 0) for label, mode in MODES.items()]
    runs += [(f"warm, {n} between", MODES["warm, idle"], n) for n in BETWEEN]
    for label, mode, between in runs:
        medians, slowest = [], []
        for _ in range(args.launches):
            t = launch(kernel, grid, buf, per_block, mode, next(launches), evict, between)
            medians.append(float(numpy.median(t)))
            slowest.append(float(t.max()))
        print(f"{label:18} {statistics.median(medians):16.2f} {statistics.median(slowest):17.2f}")
    print("one thread per block times one call of 512 dependent FFMAs (8 KB of code); L2 evicted before each launch")


if __name__ == "__main__":
    main()
