"""How fast a persistent grid streams int4 weight tiles into shared memory, by layout and copy method.

The seed's GEMV phases read a block's unit as 256-byte stripes of rows that lie a whole matrix row
apart (one column tile of a row-major matrix), with 16-byte cp.async per thread into a two-slot ring.
This probe times that pattern against the same bytes laid out contiguously, and against bulk copies
(cp.async.bulk with an mbarrier: one instruction per contiguous run instead of one per 16 bytes).
Each of the grid's blocks (2 per SM) streams a 72 KB unit in chunks of 32 + 32 + 8 KB, as a routed
gate/up unit does, phase after phase in one launch (the ring carries across phases). µs per phase =
(time of a 12-phase launch - time of a 4-phase launch) / 8: launch cost and ramp cancel, and both
launches outlast CuPy's ~8 us host cost per launch, so the GPU never waits for the host. Each launch
starts where the last one stopped in a ring of 12 regions that together exceed L2, so every byte
comes from HBM. This is the steady-state rate of the memory side alone.
Usage: python scripts/stream_probe.py [--reps 50]
"""

from __future__ import annotations

import argparse
import statistics

import cupy
import numpy
from rich.console import Console
from rich.table import Table

SOURCE = r"""
constexpr int UNIT = 72 * 1024, CHUNK = 32 * 1024, CHUNKS = 3, THREADS = 256, ROWS = UNIT / 256;

__device__ __forceinline__ unsigned smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ int chunk_bytes(int c) { return c < 2 ? CHUNK : UNIT - 2 * CHUNK; }

// Source of row r (0..ROWS) of this block's unit in one region: contiguous, or one 256-byte stripe of a
// row-major matrix with `row_bytes` per row (block b owns column tile b % tiles of a band of rows).
__device__ __forceinline__ const unsigned char* row_src(const unsigned char* region, int r, int row_bytes) {
  if (STRIDED) {
    const int tiles = row_bytes / 256, tile = blockIdx.x % tiles, band = blockIdx.x / tiles;
    return region + ((size_t)band * ROWS + r) * row_bytes + (size_t)tile * 256;
  }
  return region + (size_t)blockIdx.x * UNIT + (size_t)r * 256;
}

__device__ void issue(int q, unsigned char* slot, unsigned long long* bar, const unsigned char* base,
                      size_t region_bytes, int nregions, int first, int row_bytes) {
  const int c = q % CHUNKS;
  const unsigned char* region = base + (size_t)((first + q / CHUNKS) % nregions) * region_bytes;
  const int rows = chunk_bytes(c) / 256, row0 = c * (CHUNK / 256);
  if (!BULK) {
    for (int i = threadIdx.x; i < rows * 16; i += THREADS) {
      const unsigned dst = smem_addr(slot + i * 16);
      const unsigned char* src = row_src(region, row0 + i / 16, row_bytes) + (i % 16) * 16;
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
    return;
  }
  if (threadIdx.x >= 32) return;
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  if (threadIdx.x == 0)
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                 ::"r"(smem_addr(bar)), "r"(chunk_bytes(c)) : "memory");
  __syncwarp();
  const int run = STRIDED ? 256 : chunk_bytes(c), runs = chunk_bytes(c) / run;
  for (int i = threadIdx.x; i < runs; i += 32)
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 ::"r"(smem_addr(slot + i * run)), "l"(row_src(region, row0 + i * run / 256, row_bytes)), "r"(run),
                   "r"(smem_addr(bar)) : "memory");
}

__device__ void wait_slot(int q, int total, unsigned long long* bar, unsigned& parity) {
  if (!BULK) {
    if (q + 1 < total) asm volatile("cp.async.wait_group 1;" ::: "memory");
    else asm volatile("cp.async.wait_group 0;" ::: "memory");
    __syncthreads();
    return;
  }
  unsigned done = 0;
  while (!done)
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                 : "=r"(done) : "r"(smem_addr(bar)), "r"(parity) : "memory");
  parity ^= 1;
}

extern "C" __global__ void __launch_bounds__(THREADS, 2)
probe(const unsigned char* base, size_t region_bytes, int nregions, int first, int phases, int row_bytes,
      unsigned* out) {
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned long long* bars = reinterpret_cast<unsigned long long*>(smem + 2 * CHUNK);
  if (BULK && threadIdx.x == 0) {
    for (int s = 0; s < 2; ++s)
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(bars + s)) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  const int total = phases * CHUNKS;
  unsigned parity[2] = {0, 0}, acc = 0;
  for (int q = 0; q < 2 && q < total; ++q)
    issue(q, smem + q * CHUNK, bars + q, base, region_bytes, nregions, first, row_bytes);
  for (int q = 0; q < total; ++q) {
    const int s = q & 1;
    wait_slot(q, total, bars + s, parity[s]);
    const uint4* v = reinterpret_cast<const uint4*>(smem + s * CHUNK);
    for (int i = threadIdx.x; i < chunk_bytes(q % CHUNKS) / 16; i += THREADS) acc ^= v[i].x ^ v[i].w;
    __syncthreads();
    if (q + 2 < total) issue(q + 2, smem + s * CHUNK, bars + s, base, region_bytes, nregions, first, row_bytes);
    else if (!BULK) asm volatile("cp.async.commit_group;" ::: "memory");
  }
  if (acc == 0x12345678u) out[blockIdx.x] = acc;   // keeps the reads; practically never stores
}
"""

METHODS = {  # name: (STRIDED, BULK)
    "strided cp.async 16 B (seed)": (1, 0),
    "strided bulk, 256 B runs": (1, 1),
    "contiguous cp.async 16 B": (0, 0),
    "contiguous bulk, 1 run per chunk": (0, 1),
}


def time_launches(kernel, grid, smem, args_for, reps: int, threads: int = 256) -> float:
    """Median µs of one launch over `reps` batches of 10 launches (CUDA events)."""
    times = []
    for rep in range(reps):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        for i in range(10):
            kernel((grid,), (threads,), args_for(rep * 10 + i), shared_mem=smem)
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end) * 1000.0 / 10)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=50)
    args = ap.parse_args()
    dev = cupy.cuda.Device()
    sms = dev.attributes["MultiProcessorCount"]
    grid, unit, nregions = 2 * sms, 72 * 1024, 12
    rows = unit // 256   # a unit's rows; a strided layout needs whole bands of them for every column tile
    region_bytes = max([grid * unit] + [-(-grid // (rb // 256)) * rows * rb for rb in (1024, 2304, 4096)])
    base = cupy.random.randint(0, 255, size=region_bytes * nregions, dtype=cupy.uint8)
    out = cupy.zeros(grid, dtype=cupy.uint32)
    smem = 2 * 32 * 1024 + 64

    def launch_args(phases: int, row_bytes: int, first: int) -> tuple:
        return (base, numpy.uint64(region_bytes), numpy.int32(nregions), numpy.int32(first % nregions),
                numpy.int32(phases), numpy.int32(row_bytes), out)

    t = Table(title=f"Streaming {grid} blocks x 72 KB per phase ({grid * unit / 1e6:.1f} MB) into a 2-slot ring, "
                    f"µs per phase and TB/s (medians of {args.reps} x 10 launches)")
    for col in ("method", "row bytes", "µs per phase", "TB/s"):
        t.add_column(col, justify="left" if col == "method" else "right")
    for name, (strided, bulk) in METHODS.items():
        mod = cupy.RawModule(code=SOURCE, options=("-std=c++17", f"-DSTRIDED={strided}", f"-DBULK={bulk}"))
        kern = mod.get_function("probe")
        kern.max_dynamic_shared_size_bytes = smem
        for row_bytes in ((1024, 2304, 4096) if strided else (0,)):
            rb = max(row_bytes, 256)
            long, short = (time_launches(kern, grid, smem, lambda i, n=n, rb=rb: launch_args(n, rb, n * i), args.reps)
                           for n in (12, 4))
            phase = (long - short) / 8
            t.add_row(name, str(row_bytes or "-"), f"{phase:.2f}", f"{grid * unit / phase / 1e6:.2f}")
    Console(width=140).print(t)


if __name__ == "__main__":
    main()
