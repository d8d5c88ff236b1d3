"""What a bulk copy's shared-memory destination alignment costs: latency and rate by offset past 128 bytes.

The seed's dynamic shared region sat 48 B past a 128-byte boundary until the fiftieth session; putting it on
the boundary made the step ~4 % faster (BENCHMARKS.md), and the weight ring's bulk copies were the suspect.
This probe isolates the copy: every block (2 per SM, as the seed) copies `bytes` from an L2-resident source
(so HBM does not set the rate) into shared memory at `offset` past a 128-byte boundary, waits on its
mbarrier, and repeats. It reports the mean clock cycles from issue to completion seen by one block, alone
on the GPU (latency) and with the whole grid copying (loaded latency), and the grid's aggregate rate.
Usage: python scripts/bulk_align_probe.py [--reps 20]
"""

from __future__ import annotations

import argparse
import statistics

import cupy
import numpy
from rich.console import Console
from rich.table import Table

SOURCE = r"""
__device__ __forceinline__ unsigned smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

// Each block copies `bytes` from its own slice of `src` (which the caller keeps in L2) into shared memory at
// `offset` past a 128-byte boundary, `iters` times, waiting for each copy; out[block] = cycles per copy.
extern "C" __global__ void __launch_bounds__(128, 2)
probe(const unsigned char* src, size_t slice, int bytes, int offset, int iters, unsigned long long* out) {
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ __align__(8) unsigned long long bar;
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(&bar)) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  unsigned char* dst = smem + (128u - smem_addr(smem) % 128u) % 128u + offset;   // whatever precedes the region
  const unsigned char* from = src + (size_t)blockIdx.x * slice;
  unsigned parity = 0;
  long long total = 0;
  for (int i = 0; i < iters; ++i) {
    const long long t0 = clock64();
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                 ::"r"(smem_addr(&bar)), "r"(bytes) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 ::"r"(smem_addr(dst)), "l"(from), "r"(bytes), "r"(smem_addr(&bar)) : "memory");
    unsigned done = 0;
    while (!done)
      asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                   : "=r"(done) : "r"(smem_addr(&bar)), "r"(parity) : "memory");
    parity ^= 1;
    if (i > 0) total += clock64() - t0;   // the first copy warms the path
  }
  out[blockIdx.x] = (unsigned long long)(total / (iters - 1));
  if (blockIdx.x == 0) out[gridDim.x] = smem_addr(dst) % 128u;   // the offset the copies really had
}
"""

OFFSETS = (0, 16, 32, 48, 64, 112)
SIZES = (1024, 4096, 32768)


def timed(kernel, grid: int, smem: int, args: tuple, reps: int) -> tuple[float, float]:
    """(median µs of one launch, median over launches of the mean cycles per copy of its blocks)."""
    times, cycles = [], []
    for _ in range(reps):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        kernel((grid,), (128,), args, shared_mem=smem)
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end) * 1000.0)
        cycles.append(float(args[-1][:grid].mean()))
        if int(args[-1][grid]) != int(args[3]):
            raise SystemExit(f"the copies landed {int(args[-1][grid])} B past 128, not {int(args[3])}")
    return statistics.median(times), statistics.median(cycles)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--iters", type=int, default=200)
    args = ap.parse_args()
    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    grid = 2 * sms
    slice_bytes = max(SIZES)
    src = cupy.random.randint(0, 255, size=grid * slice_bytes, dtype=cupy.uint8)   # ~8.6 MB: stays in L2
    out = cupy.zeros(grid + 1, dtype=cupy.uint64)
    kern = cupy.RawModule(code=SOURCE, options=("-std=c++17",)).get_function("probe")
    smem = max(SIZES) + max(OFFSETS) + 128
    kern.max_dynamic_shared_size_bytes = smem
    t = Table(title=f"One bulk copy from L2 into shared memory at an offset past 128 B: cycles per copy "
                    f"(one block alone; {grid} blocks at once) and the grid's GB/s, medians of {args.reps} launches")
    for col in ("bytes", "offset", "alone, cycles", "loaded, cycles", "loaded GB/s", "vs offset 0"):
        t.add_column(col, justify="right")
    for size in SIZES:
        base_rate = None
        for off in OFFSETS:
            launch = (src, numpy.uint64(slice_bytes), numpy.int32(size), numpy.int32(off), numpy.int32(args.iters), out)
            _, alone = timed(kern, 1, smem, launch, args.reps)
            us, loaded = timed(kern, grid, smem, launch, args.reps)
            rate = grid * size * args.iters / us / 1e3
            base_rate = base_rate or rate
            t.add_row(str(size), str(off), f"{alone:.0f}", f"{loaded:.0f}", f"{rate:.0f}", f"{rate / base_rate:.3f}x")
    Console(width=140).print(t)


if __name__ == "__main__":
    main()
