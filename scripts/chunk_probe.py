"""What one weight-ring chunk step of the seed costs by itself, without the rest of a phase around it.

The phase stamps show a chunk step (8 slabs, one per warp) taking ~2.4 µs in the GEMV phases, while its
instructions alone should issue in ~1 µs at two blocks per SM. This probe runs the seed's own
gemv_chunk / fold_chunk (the kernel source is compiled with the probe appended, full-size dims, seed
knobs) on a persistent grid of the seed's shape, step after step, in five modes:
  compute    gemv_chunk on a chunk resident in shared memory, nothing else
  + fold     gemv_chunk, fold_chunk and the step's block barrier (run_jobs minus the stream)
  + stream   as + fold, and every step refills the slot just read by the seed's three bulk copies (run_jobs' loop)
  stream     the refill alone (with the block barrier a refill needs), and with the fold too
and with 8 slabs (a full chunk) or 2 (a unit's tail chunk). µs per step = (time of a 96-step launch -
time of a 32-step launch) / 64, so launch cost and ramp cancel. Usage: python scripts/chunk_probe.py [SEED.cu]
(default: the seed; an older seed with the fp16-x loop works too)
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import cupy  # noqa: E402
import numpy  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from megakernel_agent.sandbox.candidate import Candidate  # noqa: E402
from megakernel_agent.tasks.kimi_linear.config import FULL  # noqa: E402
from megakernel_agent.tasks.kimi_linear.megakernel import kernel_defines, kernel_prelude  # noqa: E402
from scripts.stream_probe import time_launches  # noqa: E402

PROBE = r"""
__device__ const unsigned long long probe_smem_bytes = SM_GEMV_BYTES, probe_chunk_bytes = RING_SLOT;
// mode bits: 1 compute, 2 fold + block barriers, 4 stream; slabs: warps with a slab per step.
extern "C" __global__ void __launch_bounds__(THREADS, BLOCKS_PER_SM)
chunk_probe(const unsigned char* src, size_t src_bytes, int steps, int mode, int slabs, float* sink) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __shared__ RingSync ring_sync;
  const Smem sm{smem_raw, &ring_sync};
  ring_init(sm.rs);
#if PROBE_INT16_X   // the seed's x as int16 blocks (since its DP2A loop)
  for (int i = threadIdx.x; i < X_MAX; i += THREADS) sm.xi()[i] = (short)(4099 * (i % 7) - 12000);
  for (int i = threadIdx.x; i < X_MAX / XBLK; i += THREADS) sm.xs()[i] = 1.0f / 4096;
#else
  for (int i = threadIdx.x; i < X_MAX; i += THREADS) sm.xh()[i] = __float2half(0.01f * (i % 7));
#endif
  for (int s = 0; s < 2; ++s)
    for (int i = threadIdx.x; i < (int)RING_SLOT / 4; i += THREADS)
      reinterpret_cast<unsigned*>(sm.ring(s))[i] = 0x3c003c00u ^ (i * 2654435761u);
  __syncthreads();
  float acc[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) acc[i] = 0.0f;
  const size_t per_step = (size_t)gridDim.x * RING_SLOT;
  for (int k = 0; k < steps; ++k) {
    const int slot = k & 1;
    if (mode & 4) ring_wait(sm.rs, slot);
#if PROBE_INT16_X
    if (mode & 1) gemv_chunk(sm.ring(slot), TILE, 0, 0, slabs, sm.xi(), sm.xs(), acc);
#else
    if (mode & 1) gemv_chunk(sm.ring(slot), TILE, 0, 0, slabs, sm.xh(), acc);
#endif
    if (mode & 2) fold_chunk(acc, sm.red() + (threadIdx.x >> 5) * TILE, k == 0);
    if (mode & 6) __syncthreads();   // the slot is read (a refill needs it too)
    if ((mode & 4) && ring_issuer()) {   // the seed's three copies: packed rows, scales, zeros
      const int piece = threadIdx.x >> 5;
      const unsigned bytes = piece == 0 ? RING_W_BYTES : CHUNK_GROUPS * RING_G_BYTES;
      const size_t at = piece == 0 ? 0 : RING_W_BYTES + (piece - 1) * CHUNK_GROUPS * RING_G_BYTES;
      const size_t off = (size_t)k * per_step + (size_t)blockIdx.x * RING_SLOT + at;
      const unsigned char* from = src + off % (src_bytes - RING_SLOT);   // 16-byte aligned, never past the end
      expect_bytes(&sm.rs->bar[slot], bytes);
      bulk_copy(sm.ring(slot) + at, from, bytes, &sm.rs->bar[slot]);
      if (piece == 0) ++sm.rs->fills[slot];
    }
  }
  ring_wait(sm.rs, 0);
  ring_wait(sm.rs, 1);
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < 16; ++i) s += acc[i];
  if (s == 1234.5f || ((mode & 2) && sm.red()[threadIdx.x] == 1234.5f)) sink[blockIdx.x] = s;
}
"""

MODES = {"compute": 1, "compute + fold": 3, "compute + fold + stream": 7, "stream": 4, "stream + fold": 6}


def main() -> None:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "kernels/kimi_linear/seed.cu"
    source = path.read_text()
    int16_x = "const short* xi" in source   # the DP2A loop's gemv_chunk (fp16 x before it)
    knobs = {k: str(v) for k, v in Candidate(source=source).resolved_knobs().items()}
    dev = cupy.cuda.Device()
    grid = dev.attributes["MultiProcessorCount"] * int(knobs["BLOCKS_PER_SM"])
    src = cupy.random.randint(0, 255, size=256 << 20, dtype=cupy.uint8)
    sink = cupy.zeros(grid, dtype=cupy.float32)
    t = Table(title=f"One chunk step of {path.name}'s GEMV loop, {grid} blocks x {knobs['THREADS']} threads "
                    "(µs per step, medians of 30 x 10 launches)")
    for col in ("mode", "slabs", "µs per step", "TB/s streamed"):
        t.add_column(col, justify="left" if col == "mode" else "right")
    defines = {**kernel_defines(FULL), **knobs}
    mod = cupy.RawModule(code=kernel_prelude(FULL) + source + PROBE,
                         options=("-std=c++17", f"-DPROBE_INT16_X={int(int16_x)}",
                                  *(f"-D{k}={v}" for k, v in defines.items())))
    kern = mod.get_function("chunk_probe")
    smem, chunk = (int(cupy.ndarray((1,), cupy.uint64, mod.get_global(name)).get()[0])
                   for name in ("probe_smem_bytes", "probe_chunk_bytes"))
    kern.max_dynamic_shared_size_bytes = smem
    threads = int(knobs["THREADS"])
    for name, mode in MODES.items():
        for slabs in (8, 2) if mode & 1 else (8,):
            per = {}
            for steps in (96, 32):
                args = (src, numpy.uint64(src.size), numpy.int32(steps), numpy.int32(mode), numpy.int32(slabs), sink)
                per[steps] = time_launches(kern, grid, smem, lambda _, args=args: args, 30, threads)
            step_us = (per[96] - per[32]) / 64
            streamed = f"{grid * chunk / step_us / 1e6:.2f}" if mode & 4 else "-"
            t.add_row(name, str(slabs), f"{step_us:.3f}", streamed)
    Console(width=120).print(t)


if __name__ == "__main__":
    main()
