// Smoke task: out = x + bf16(rmsnorm(x) @ W), W int4 (HIDDEN x HIDDEN, group QGROUP), one
// cooperative launch.
//
// Every block normalises x into shared memory, then works through (column tile, K slice) units:
// each thread owns 4 adjacent columns (one 32-bit word of packed codes per row) and walks its
// K slice; the last unit of a tile (arrival counter) sums the slices in a fixed order and adds the
// residual. A deliberately plain fp32 dequant path: the knobs leave real speed on the table for
// the tuner (the seed default uses few blocks).
// Run: python run_agent.py bench --task w4a16_gemv
//
// @knob THREADS 256 {128,256,512} threads per block; a tile is 4 x THREADS columns
// @knob BLOCKS_PER_SM 1 {1,2,4} co-resident blocks per SM
// @knob KSPLIT 2 {1,2,4,8,16,32} K slices per tile (parallel units = tiles x KSPLIT)
// @knob UNROLL 4 {1,2,4,8} unroll of the row loop (loads in flight per thread)

#include <cooperative_groups.h>

constexpr int TILE_COLS = THREADS * 4;
constexpr int TILES = (HIDDEN + TILE_COLS - 1) / TILE_COLS;
constexpr int ROWS = HIDDEN / 2;   // packed rows
constexpr int kUnroll = UNROLL;
static_assert(HIDDEN % 4 == 0 && ROWS % KSPLIT == 0, "K split must divide the packed rows");

MK_LAUNCH_CONTRACT(THREADS, BLOCKS_PER_SM, 0, 4 * (size_t)KSPLIT * HIDDEN, TILES)

__device__ __forceinline__ float bf(const bf16* p) { return __bfloat162float(*p); }

extern "C" __global__ void __launch_bounds__(THREADS) gemv_step(const __grid_constant__ GemvParams p) {
  __shared__ float xn[HIDDEN];
  __shared__ float red[THREADS / 32];
  __shared__ int last;

  // RMSNorm (every block, redundantly): xn = bf16(x * rsqrt(mean(x^2) + eps) * w)
  float ss = 0.0f;
  for (int k = threadIdx.x; k < HIDDEN; k += THREADS) { const float v = bf(p.x + k); ss += v * v; }
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = ss;
  __syncthreads();
  float tot = 0.0f;
  for (int w = 0; w < THREADS / 32; ++w) tot += red[w];
  const float r = 1.0f / sqrtf(tot / HIDDEN + RMS_EPS);
  for (int k = threadIdx.x; k < HIDDEN; k += THREADS)
    xn[k] = __bfloat162float(__float2bfloat16_rn(bf(p.x + k) * r * bf(p.norm_w + k)));
  __syncthreads();

  float* part = reinterpret_cast<float*>(p.scratch);   // [KSPLIT][HIDDEN]
  for (int u = blockIdx.x; u < TILES * KSPLIT; u += gridDim.x) {
    const int tile = u / KSPLIT, split = u % KSPLIT;
    const int col = tile * TILE_COLS + threadIdx.x * 4;
    const int r0 = split * (ROWS / KSPLIT), r1 = r0 + ROWS / KSPLIT;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (col < HIDDEN) {
#pragma unroll kUnroll
      for (int r = r0; r < r1; ++r) {
        const unsigned w = *reinterpret_cast<const unsigned*>(p.wq + (size_t)r * HIDDEN + col);
        const int g = (2 * r) / QGROUP;
        const float x0 = xn[2 * r], x1 = xn[2 * r + 1];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float s = bf(p.sc + (size_t)g * HIDDEN + col + j), z = bf(p.zr + (size_t)g * HIDDEN + col + j);
          const unsigned byte = (w >> (8 * j)) & 0xffu;
          acc[j] += (((float)(byte & 0xfu) - z) * s) * x0 + (((float)(byte >> 4) - z) * s) * x1;
        }
      }
      for (int j = 0; j < 4; ++j) part[(size_t)split * HIDDEN + col + j] = acc[j];
    }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
      const unsigned prev = atomicAdd(p.counters + tile, 1u);
      last = prev == KSPLIT - 1;
      if (last) p.counters[tile] = 0u;
    }
    __syncthreads();
    if (last && col < HIDDEN) {
      __threadfence();
      for (int j = 0; j < 4; ++j) {
        float y = 0.0f;
        for (int s = 0; s < KSPLIT; ++s) y += __ldcg(part + (size_t)s * HIDDEN + col + j);
        const float xv = bf(p.x + col + j);
        p.out[col + j] = __float2bfloat16_rn(xv + __bfloat162float(__float2bfloat16_rn(y)));
      }
    }
    __syncthreads();
  }
}
