"""What a cold code path costs while device memory is busy (issue 28; scripts/cold_code_probe.cu says how).

The seed's per-block stamps (BENCHMARKS.md, twenty-eighth session) show a chunk step that is 1.5-2.3 µs slower
on the blocks that run one extra ~150-instruction path, once per layer, while the grid streams its weights. This
times one call of an 8 KB straight-line body on every block (thread 0), after L2 is evicted, in these modes:

  cold                   its code from device memory: 20 other bodies (160 KB) run first, so no SM cache keeps it
  L2                     called first, then 20 other bodies: its code is in L2 but out of the SM's caches
  warm                   called just before, so its code is in the SM's instruction cache
  idle                   nothing else in flight
  L2 load                ~1 GB of L2 prefetches queued by the grid just before (no data comes to the SMs)
  stream (k)             each block keeps k (default 4) x 16 KB bulk copies into shared memory in flight,
                         evict-first in L2, as the seed's weight ring does
  warm, N between        N other 8 KB bodies between the warm-up and the timed call, memory idle

If the reading is right, a cold call under the stream is microseconds longer than a cold idle one, and the warm
calls stay near the chain's own time (512 dependent FFMAs). "L2, stream" against "cold, stream" says whether code
kept in L2 escapes the cost; the stream depth rows say how it grows with the bytes in flight per SM. The N at
which "warm, N between" turns cold sizes the SM's instruction cache, against the seed's 169 KiB of code.

Launches run in rounds, one launch per mode each (a drift in clocks does not line up with a mode). Every mode
times the same body copy in a round and round r takes copy 7r mod 24, so each mode sees every copy once in the
default 24 rounds: where a copy sits in memory (its cache sets) moves a call by up to ~0.8 µs, and it now cancels
out between modes. "warm, 20 between" is the same launch as "L2, idle": the pair is the probe's noise check.
Before any timing, one untimed launch per copy. The table shows, over the rounds, the median of the blocks'
median, fastest and slowest call. All blocks call the same copy: the first fetch of a line goes to memory and
later ones may hit L2, so the slowest block is the figure for a fetch from device memory.

Usage: python3 scripts/cold_code_probe.py [--launches 24] [--mb-per-block 4]
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
COPIES, PIECE, RING, SLOT = 24, 256 << 10, 4, 16 << 10     # the .cu's COPIES, PIECE, RING and SLOT
WARM, L2_LOAD, STREAM = 1, 2, 4                                 # the .cu's mode bits
BETWEEN = (4, 8, 10, 12, 16, 20)    # other bodies (8 KB of code each) run between a warm-up and the timed call
FLUSH = 20                          # other bodies run first to push a copy out of the SM's caches (160 KB)
L2_EVICT_FACTOR = 8                 # the eviction buffer is this many times the L2
COPY_STRIDE = 7                     # round r calls copy (7 r) mod COPIES (7 is prime to 24: every copy in turn)


class Probe:
    """The loaded kernel, its buffers, and the launch count that picks each launch's body copy."""

    def __init__(self, mb_per_block: int):
        dev = cupy.cuda.Device()
        self.sms, self.l2 = dev.attributes["MultiProcessorCount"], dev.attributes["L2CacheSize"]
        self.grid = self.sms * BLOCKS_PER_SM
        self.per_block = mb_per_block << 20
        if self.per_block % PIECE:
            raise SystemExit(f"--mb-per-block must make whole {PIECE >> 10} KB pieces")
        mod = load_sm90a(SOURCE)
        self.kernel = mod.get_function("cold_probe")
        self.kernel.max_dynamic_shared_size_bytes = RING * SLOT
        self.bodies = cupy.ndarray((COPIES,), cupy.uint64, mod.get_global("bodies")).get()
        self.buf = cupy.zeros(self.grid * self.per_block, dtype=cupy.uint8)
        self.evict = cupy.zeros(L2_EVICT_FACTOR * self.l2 // 4, dtype=cupy.int32)
        self.launches = 0

    def launch(self, mode: int, between: int, depth: int, copy: int) -> numpy.ndarray:
        """Evict L2, run one launch that times body `copy`, and return every block's timed call in µs."""
        self.launches += 1
        self.evict.fill(self.launches)
        out = cupy.zeros(self.grid, dtype=cupy.uint64)
        sink = cupy.zeros(self.grid, dtype=cupy.float32)
        args = (self.buf, numpy.uint64(self.per_block), numpy.int32(mode), numpy.int32(depth), numpy.int32(copy),
                numpy.int32(between),
                numpy.uint64(self.bodies[copy]), numpy.float32(1.0), out, sink)
        self.kernel((self.grid,), (THREADS,), args, shared_mem=RING * SLOT if mode & STREAM else 0)
        cupy.cuda.runtime.deviceSynchronize()
        return out.get().astype(numpy.float64) / 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--launches", type=int, default=COPIES, help="launches per mode (rounds; each its own copy)")
    ap.add_argument("--mb-per-block", type=int, default=4, help="bytes each block loads under L2 load or stream")
    args = ap.parse_args()
    probe = Probe(args.mb_per_block)
    runs = {"cold, idle": (0, FLUSH, RING), "L2, idle": (WARM, FLUSH, RING), "warm, idle": (WARM, 0, RING),
            "cold, L2 load": (L2_LOAD, FLUSH, RING), "L2, L2 load": (WARM | L2_LOAD, FLUSH, RING),
            "cold, stream": (STREAM, FLUSH, RING), "L2, stream": (WARM | STREAM, FLUSH, RING),
            "warm, stream": (WARM | STREAM, 0, RING)}
    runs |= {f"cold, stream ({k})": (STREAM, FLUSH, k) for k in (1, 2)}
    runs |= {f"L2, stream ({k})": (WARM | STREAM, FLUSH, k) for k in (1, 2)}
    runs |= {f"warm, {n} between": (WARM, n, RING) for n in BETWEEN}
    name = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    print(f"{name} · {probe.sms} SMs · L2 {probe.l2 >> 20} MB · grid {probe.grid} · {args.launches} launches per "
          f"mode, round robin · {probe.grid * probe.per_block >> 20} MB of L2 prefetches under L2 load")
    for copy in range(COPIES):   # module load, first-launch costs, every copy's first use
        probe.launch(0, 0, RING, copy)
    samples: dict[str, list[numpy.ndarray]] = {label: [] for label in runs}
    for r in range(args.launches):
        copy = (COPY_STRIDE * r) % COPIES   # every mode times the same copy in a round: placement cancels out
        for label, (mode, between, depth) in runs.items():
            samples[label].append(probe.launch(mode, between, depth, copy))
    print(f"{'mode':18} {'median block µs':>16} {'fastest µs':>11} {'slowest µs':>11}")
    for label, times in samples.items():
        row = [statistics.median(float(f(t)) for t in times) for f in (numpy.median, numpy.min, numpy.max)]
        print(f"{label:18} {row[0]:16.2f} {row[1]:11.2f} {row[2]:11.2f}")
    print("thread 0 of each block times one call of 512 dependent FFMAs (8 KB of code); L2 evicted before each launch")


if __name__ == "__main__":
    main()
