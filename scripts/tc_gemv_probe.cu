// Compute-only cost of the int4 dequant-GEMV inner loop (issue 28, step 1): the seed's fp16-FMA loop
// against a tensor-core loop, on weights resident in shared memory (no DRAM, no copies, no barriers).
//
// What it does: each block of a persistent grid (SMs x 2 blocks x 256 threads, as the seed) copies one
// shared-memory image from global memory, then runs `steps` chunk steps on it. A chunk step is the
// seed's: 32 KB of packed int4 weights per block (256 k x 256 output columns, two quant groups of 128 k),
// 4 KB per warp. Chunk c reads slot c % 2 of the image, quant groups 2(c % 8) and 2(c % 8) + 1, and
// x[256(c % 8) .. +256], so 8 steps are one GEMV with K = 2048 (16 groups) and N = 256, with weights
// that repeat every two chunks. Each kernel writes its per-warp partial sums; the host adds them.
//
//   seed_probe  the seed's gemv_chunk loop until 2026-12-06 (since then DP2A on int16 x), rewritten here with
//               its data layout (kernels/kimi_linear/seed.cu): a lane holds 16 bytes = 16 columns x 2 k of one packed row, LOP3 builds 1024 + q
//               (or 1024 + 16q), HADD2 / HFMA2 makes q exact, HFMA2 accumulates q*x in fp16 over 16 products,
//               and scale and zero point are applied per lane per slab in fp32.
//   tc_probe    mma.sync m16n8k16, f16 x f16 -> f32. Weights are the A operand (M = 16 output columns, K = 16);
//               a lane's A fragment (8 nibbles) is one 32-bit word of an MMA-native layout that the binding
//               would write once at load time. One SHF and four LOP3 turn it into the four f16x2 registers:
//               (w & 0x000F000F) | 0x6400 is 1024 + q for the nibbles at bits 0-3 and 16-19, and
//               (w & 0x00F000F0) | 0x5400 is 64 + q for those at bits 4-7 and 20-23 (fp16 64 has an ulp of
//               1/16); w >> 8 exposes the other four. The offsets are not subtracted: MMA k-slots 0-7 carry
//               1024 + q and slots 8-15 carry 64 + q, so a group's sum is sum(q x) + O with
//               O = 1024 sum(x[slots 0-7]) + 64 sum(x[slots 8-15]), folded out with the zero point.
//               The activation vector is the B operand (N = 8). Its 8 columns are 8 K-slices: the k-blocks
//               of a warp's j-th quant group of a period (c % 8 == j) have x in column j and zeros elsewhere,
//               so the accumulator keeps 8 groups apart and the fp32 fold
//                   y += s * (acc - (z * S + O)),  S = sum(x over the group)
//               runs once per 8 groups, each lane folding its own 4 (row, group) pairs per m-tile: no
//               per-element scale multiply, and no fold per group.
//               Warps: warp w takes the chunk's group w / 4 (k half) and m-tiles 4(w % 4) .. +3 (64 columns).
//               The per-period scales, zeros, S and O lie in shared memory beside the ring slots.
//   tile_probe  mma.sync as tc_probe, on the seed's own image (no new weight layout): a lane loads two packed
//               rows of 16 columns, one PRMT per m-tile makes the word tc_probe's binding would have written,
//               the fold runs once per chunk (see tile_chunk). Its row loads conflict 4-way in shared memory.
//   tile_swz_probe  the same on an image whose rows have their 16-byte column chunks XOR-swizzled (a layout
//               the binding could write instead): conflict-free loads, nothing else changes.
//   tile_defer_probe  tile_swz_probe with tc_probe's deferred fold: chunk j of a period multiplies x in B
//               column j, so the accumulators keep the period's chunks apart, and the fold runs once per
//               period on all lanes (lane t folds columns 2t, 2t + 1) instead of once per chunk on lanes t = 0.
//
// Knobs: none (shapes are fixed by the seed's chunk). Build check: nvcc -arch=sm_90a -cubin -Xptxas -v
// scripts/tc_gemv_probe.cu. Run: python3 scripts/tc_gemv_probe.py (compiles this file with CuPy).

#include <cuda_fp16.h>

// ================================ shapes and shared-memory images ================================

constexpr int THREADS = 256, WARPS = THREADS / 32, BLOCKS_PER_SM = 2;
constexpr int TILE = 256;                               // output columns per block
constexpr int GROUP = 128;                              // k per quant group
constexpr int CHUNK_K = 256;                            // k per chunk step
constexpr int CHUNK_BYTES = CHUNK_K / 2 * TILE;         // packed weights of one chunk: 32 KB
constexpr int PERIOD = 8;                               // chunks until x, scales and zeros repeat = MMA N
constexpr int UNIT_K = PERIOD * CHUNK_K;                // K of the GEMV that 8 steps compute
constexpr int UNIT_GROUPS = UNIT_K / GROUP;
constexpr int SLAB = 16;                                // seed: packed rows per warp per chunk
constexpr int MT = 4;                                   // tc: m-tiles (16 columns each) per warp
constexpr int KB = GROUP / 16;                          // tc: k-blocks (MMA K = 16) per warp per chunk
static_assert(WARPS * SLAB * 2 == CHUNK_K && CHUNK_K == 2 * GROUP, "seed: a warp's slab lies in one group");
static_assert((WARPS / 2) * MT * 16 == TILE, "tc: four warps cover the tile's columns for each k half");
static_assert(KB % 2 == 0, "tc: B fragments load two k-blocks per 16-byte read");

// seed image: ring slots (packed row r of a chunk = k 2r (low nibble), 2r + 1 (high), 256 columns),
// bf16 scales [group][column], bf16 zeros [group][column], fp16 x [k].
constexpr int SEED_W = 0;
constexpr int SEED_S = SEED_W + 2 * CHUNK_BYTES;
constexpr int SEED_Z = SEED_S + UNIT_GROUPS * TILE * 2;
constexpr int SEED_X = SEED_Z + UNIT_GROUPS * TILE * 2;
constexpr int SEED_BYTES = SEED_X + UNIT_K * 2;

// tc image: ring slots of words [k half][m quad][kb][lane][mt]; scales and zeros in fold order
// [k half][m quad][mt pair][lane][mt][4] (bf16); x in B-fragment order [group][kb pair][t][8 halves];
// per (k half, t) the float4 {S, O} of the lane's two groups; 256 zero bytes at 64 mod 128.
constexpr int TC_WARP_BYTES = KB * 32 * MT * 4;         // one warp's share of a chunk: 4 KB
constexpr int TC_W = 0;
constexpr int TC_S = TC_W + 2 * CHUNK_BYTES;
constexpr int TC_FOLD_BYTES = 2 * (WARPS / 2) * (MT / 2) * 32 * 16;
constexpr int TC_Z = TC_S + TC_FOLD_BYTES;
constexpr int TC_X = TC_Z + TC_FOLD_BYTES;
constexpr int TC_X_GROUP_BYTES = GROUP * 2;
constexpr int TC_SUMS = TC_X + UNIT_GROUPS * TC_X_GROUP_BYTES;
constexpr int TC_ZERO = TC_SUMS + 2 * 4 * 16 + 64;
constexpr int TC_BYTES = TC_ZERO + TC_X_GROUP_BYTES;
static_assert(TC_WARP_BYTES * WARPS == CHUNK_BYTES, "tc: the warps' shares make up the chunk");
static_assert(TC_X % 128 == 0 && TC_X_GROUP_BYTES % 128 == 0 && TC_ZERO % 128 == 64,
              "tc: active and zero B reads fall in opposite bank halves");
static_assert(SEED_BYTES % 16 == 0 && TC_BYTES % 16 == 0, "images copy as uint4");
static_assert(BLOCKS_PER_SM * (TC_BYTES + 1024) <= 228 * 1024 && BLOCKS_PER_SM * (SEED_BYTES + 1024) <= 228 * 1024,
              "two blocks per SM");

// Read by the driver, which checks its own copy of these numbers against them.
extern "C" __device__ const int probe_layout[] = {THREADS, BLOCKS_PER_SM, CHUNK_BYTES, PERIOD, UNIT_K,
                                                 GROUP, SEED_BYTES, TC_BYTES, TC_ZERO};

// ================================ helpers ================================

__device__ __forceinline__ unsigned and_or(unsigned a, unsigned mask, unsigned bits) {
  unsigned d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "r"(mask), "r"(bits));   // (a & mask) | bits
  return d;
}
__device__ __forceinline__ __half2 as_half2(unsigned v) {
  __half2 h;
  memcpy(&h, &v, sizeof(h));
  return h;
}
__device__ __forceinline__ float bf16_lo(unsigned w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(unsigned w) { return __uint_as_float(w & 0xffff0000u); }

// Copy this block's image (one of n_images, by block index) into shared memory.
__device__ void stage_image(const uint4* images, int n_images, int bytes, uint4* smem) {
  const uint4* src = images + (size_t)(blockIdx.x % n_images) * (bytes / 16);
  for (int i = threadIdx.x; i < bytes / 16; i += THREADS) smem[i] = src[i];
  __syncthreads();
}

// ================================ seed loop ================================

// acc (this lane's 16 columns) += the seed's gemv_chunk over this warp's slab of chunk c.
__device__ __forceinline__ void seed_chunk(const unsigned char* sm, int c, float (&acc)[16]) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, seg = lane & 15, par = lane >> 4;
  const int j = c % PERIOD, group = 2 * j + warp / (WARPS / 2);
  const int row0 = warp * SLAB + par;                   // this lane's packed rows: row0 + 2i
  const unsigned char* wp = sm + SEED_W + (c & 1) * CHUNK_BYTES + row0 * TILE + seg * 16;
  uint4 w[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) w[i] = *reinterpret_cast<const uint4*>(wp + 2 * i * TILE);
  const uint4* sp = reinterpret_cast<const uint4*>(sm + SEED_S + group * TILE * 2 + seg * 32);
  const uint4* zp = reinterpret_cast<const uint4*>(sm + SEED_Z + group * TILE * 2 + seg * 32);
  const uint4 sraw[2] = {sp[0], sp[1]}, zraw[2] = {zp[0], zp[1]};
  const __half* xh = reinterpret_cast<const __half*>(sm + SEED_X) + j * CHUNK_K;
  const __half2 lo_bias = as_half2(0x64006400u), sixteenth = as_half2(0x2C002C00u), hi_bias = as_half2(0xD400D400u);
  __half2 a[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) a[i] = __float2half2_rn(0.0f);
  float xsum = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const __half2 xp = *reinterpret_cast<const __half2*>(xh + 2 * (row0 + 2 * i));
    const __half2 xe = __low2half2(xp), xo = __high2half2(xp);
    xsum += __low2float(xp) + __high2float(xp);
    const unsigned v[4] = {w[i].x, w[i].y, w[i].z, w[i].w};
#pragma unroll
    for (int q = 0; q < 4; ++q) {   // columns 4q..4q+3: a[2q] holds (4q, 4q+2), a[2q+1] holds (4q+1, 4q+3)
      const unsigned hi_bytes = v[q] >> 8;
      a[2 * q] = __hfma2(__hsub2(as_half2(and_or(v[q], 0x000F000Fu, 0x64006400u)), lo_bias), xe, a[2 * q]);
      a[2 * q] = __hfma2(__hfma2(as_half2(and_or(v[q], 0x00F000F0u, 0x64006400u)), sixteenth, hi_bias), xo, a[2 * q]);
      a[2 * q + 1] = __hfma2(__hsub2(as_half2(and_or(hi_bytes, 0x000F000Fu, 0x64006400u)), lo_bias), xe, a[2 * q + 1]);
      a[2 * q + 1] =
          __hfma2(__hfma2(as_half2(and_or(hi_bytes, 0x00F000F0u, 0x64006400u)), sixteenth, hi_bias), xo, a[2 * q + 1]);
    }
  }
  const unsigned sw[8] = {sraw[0].x, sraw[0].y, sraw[0].z, sraw[0].w, sraw[1].x, sraw[1].y, sraw[1].z, sraw[1].w};
  const unsigned zw[8] = {zraw[0].x, zraw[0].y, zraw[0].z, zraw[0].w, zraw[1].x, zraw[1].y, zraw[1].z, zraw[1].w};
#pragma unroll
  for (int q = 0; q < 4; ++q) {   // y[col] += scale * (sum q*x - zero * sum x)
    const float2 f02 = __half22float2(a[2 * q]), f13 = __half22float2(a[2 * q + 1]);
    acc[4 * q + 0] += bf16_lo(sw[2 * q]) * (f02.x - bf16_lo(zw[2 * q]) * xsum);
    acc[4 * q + 1] += bf16_hi(sw[2 * q]) * (f13.x - bf16_hi(zw[2 * q]) * xsum);
    acc[4 * q + 2] += bf16_lo(sw[2 * q + 1]) * (f02.y - bf16_lo(zw[2 * q + 1]) * xsum);
    acc[4 * q + 3] += bf16_hi(sw[2 * q + 1]) * (f13.y - bf16_hi(zw[2 * q + 1]) * xsum);
  }
}

// ================================ tensor-core loop ================================

// The four f16x2 registers of an A fragment from the lane's 8 nibbles: {row g, slots 2t, 2t+1} = 1024 + q,
// {row g+8, 2t, 2t+1} = 1024 + q, {row g, 2t+8, 2t+9} = 64 + q, {row g+8, 2t+8, 2t+9} = 64 + q.
__device__ __forceinline__ void mma_int4(float (&d)[4], unsigned w, unsigned b0, unsigned b1) {
  const unsigned u = w >> 8;
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(and_or(w, 0x000F000Fu, 0x64006400u)), "r"(and_or(u, 0x000F000Fu, 0x64006400u)),
        "r"(and_or(w, 0x00F000F0u, 0x54005400u)), "r"(and_or(u, 0x00F000F0u, 0x54005400u)), "r"(b0), "r"(b1));
}

// acc[mt] += this warp's k-blocks of chunk c (its k half's group) x x, in column c % PERIOD.
__device__ __forceinline__ void tc_chunk(const unsigned char* sm, int c, float (&acc)[MT][4]) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int j = c % PERIOD, group = 2 * j + (warp >> 2);
  const uint4* wp = reinterpret_cast<const uint4*>(sm + TC_W + (c & 1) * CHUNK_BYTES + warp * TC_WARP_BYTES) + lane;
  const uint4* bp =
      reinterpret_cast<const uint4*>(sm + (g == j ? TC_X + group * TC_X_GROUP_BYTES : TC_ZERO) + 16 * t);
#pragma unroll
  for (int kp = 0; kp < KB / 2; ++kp) {
    const uint4 b = bp[4 * kp];                         // {b0, b1} of k-blocks 2kp and 2kp + 1
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const uint4 w = wp[32 * (2 * kp + e)];            // this lane's words of m-tiles 0..3
      const unsigned b0 = e ? b.z : b.x, b1 = e ? b.w : b.y;
      mma_int4(acc[0], w.x, b0, b1);
      mma_int4(acc[1], w.y, b0, b1);
      mma_int4(acc[2], w.z, b0, b1);
      mma_int4(acc[3], w.w, b0, b1);
    }
  }
}

// y[mt][r] (rows g, g + 8 of m-tile mt) += the 8-group period's scaled sums in acc; acc is cleared.
// acc[mt] = {(g, group of column 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1)}, the order of the fold image.
__device__ __forceinline__ void tc_fold(const unsigned char* sm, float (&acc)[MT][4], float (&y)[MT][2]) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, t = lane & 3;
  const float4 so = reinterpret_cast<const float4*>(sm + TC_SUMS)[(warp >> 2) * 4 + t];   // S0, O0, S1, O1
  const uint4* sp = reinterpret_cast<const uint4*>(sm + TC_S) + warp * (MT / 2) * 32 + lane;
  const uint4* zp = reinterpret_cast<const uint4*>(sm + TC_Z) + warp * (MT / 2) * 32 + lane;
#pragma unroll
  for (int p = 0; p < MT / 2; ++p) {
    const uint4 s = sp[32 * p], z = zp[32 * p];
    const unsigned sw[4] = {s.x, s.y, s.z, s.w}, zw[4] = {z.x, z.y, z.z, z.w};
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float (&d)[4] = acc[2 * p + e];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const unsigned sv = sw[2 * e + r], zv = zw[2 * e + r];
        float& out = y[2 * p + e][r];
        out = fmaf(bf16_lo(sv), d[2 * r] - fmaf(bf16_lo(zv), so.x, so.y), out);
        out = fmaf(bf16_hi(sv), d[2 * r + 1] - fmaf(bf16_hi(zv), so.z, so.w), out);
      }
      d[0] = d[1] = d[2] = d[3] = 0.0f;
    }
  }
}

// ================================ tensor cores on the seed's own layout ================================

// The loop the seed could run without a new weight layout: the ring slot as the seed's copies fill it
// (packed row r = k 2r, 2r + 1 of 256 columns, 256 B apart), read by 16-byte loads as the seed reads it.
// A warp takes a column half (128 columns, 8 m-tiles) and a slab pair (64 k, 4 k-blocks) of the chunk.
// Per k-block a lane loads two packed rows (2t and 2t + 1 of the block) at its 16 columns 16g .. 16g + 15:
// the four rows of a load are 256 B apart, so each row's 128 B fill one shared-memory wavefront (no bank
// conflict). One PRMT per m-tile then puts two columns x two rows into the word `mma_int4` reads:
//     m-tile i: row g = column 16g + 2i, row g + 8 = column 16g + 2i + 1 (of the warp's half),
//     lane t's k-slots 2t, 2t + 1, 2t + 8, 2t + 9 = k 4t, 4t + 2, 4t + 1, 4t + 3 (of the k-block),
// so the B operand is x[4t .. 4t + 3] of the k-block, two PRMTs of one 8-byte load, in column 0 (lanes
// g = 0; the others hold zeros). Slots 0-7 carry 1024 + q (even k), slots 8-15 carry 64 + q (odd k): the
// fold subtracts O = 1024 E + 64 D with E and D the sums of x over the even and odd k of the warp's
// slabs (per-slab sums made once when x is staged), and the zero point with S = E + D.
// The fold runs once per chunk, on the lanes t = 0 that hold column 0 (16 columns each).
constexpr int TT_COLS = TILE / 2;                       // tile loop: columns per warp
constexpr int TT_MT = TT_COLS / 16;                     // m-tiles per warp
constexpr int TT_K = 2 * 2 * SLAB;                      // k per warp per chunk: two slabs
constexpr int TT_KB = TT_K / 16;                        // k-blocks per warp per chunk
constexpr int TT_SLAB_SUMS = UNIT_K / (2 * SLAB);       // one {even, odd} sum of x per slab of the unit
constexpr float LO_BIAS = 1024.0f, HI_BIAS = 64.0f;     // the fp16 magic numbers' offsets (even, odd k)
static_assert(2 * (CHUNK_K / TT_K) == WARPS, "tile: two column halves x four slab pairs make up the chunk");
static_assert(GROUP % TT_K == 0, "tile: a warp's two slabs lie in one quant group");

__device__ __forceinline__ unsigned prmt(unsigned a, unsigned b, unsigned sel) {
  unsigned d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));   // bytes of {b, a} chosen by sel
  return d;
}

// d += this warp's slab pair of chunk c, read from the seed image, with x in B column `col` (lanes g = col
// load it; the others read their zero B registers from `zero8`, 8 zero bytes: no branch around the load).
// Bank conflicts: a 16-byte load is served 8 lanes at a time, and lanes 8p .. 8p + 7 are g = 2p, 2p + 1 with
// t = 0..3, i.e. two column chunks at four packed rows 256 B apart: four lanes per bank group, 4 passes.
// SWIZZLED reads an image whose packed row r holds its 16-byte column chunk c at position c ^ (r & 6):
// lane (g, t) then finds its chunk at g ^ 2t (r & 6 = 2t for its rows), eight distinct positions per 8 lanes.
template <bool SWIZZLED>
__device__ __forceinline__ void tile_chunk(const unsigned char* sm, const uint2* zero8, int c, int col,
                                           float (&d)[TT_MT][4]) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int j = c % PERIOD, half = warp & 1, k0 = (warp >> 1) * TT_K;
  const int chunk = (half * TT_COLS) / 16 + (SWIZZLED ? g ^ (2 * t) : g);
  const unsigned char* wp = sm + SEED_W + (c & 1) * CHUNK_BYTES + (k0 / 2 + 2 * t) * TILE + 16 * chunk;
  const __half* xp = reinterpret_cast<const __half*>(sm + SEED_X) + j * CHUNK_K + k0 + 4 * t;
#pragma unroll
  for (int kb = 0; kb < TT_KB; ++kb) {
    const uint4 r0 = *reinterpret_cast<const uint4*>(wp + 8 * kb * TILE);
    const uint4 r1 = *reinterpret_cast<const uint4*>(wp + (8 * kb + 1) * TILE);
    const uint2 xv = *(g == col ? reinterpret_cast<const uint2*>(xp + 16 * kb) : zero8);
    const unsigned b0 = prmt(xv.x, xv.y, 0x5410u), b1 = prmt(xv.x, xv.y, 0x7632u);   // {x0, x2}, {x1, x3}
    const unsigned w0[4] = {r0.x, r0.y, r0.z, r0.w}, w1[4] = {r1.x, r1.y, r1.z, r1.w};
#pragma unroll
    for (int i = 0; i < TT_MT; ++i) mma_int4(d[i], prmt(w0[i >> 1], w1[i >> 1], i & 1 ? 0x7632u : 0x5410u), b0, b1);
  }
}

// y (a lane's 16 columns 16g ..) += the scaled sums in d of B columns n < COLS, column n holding the warp's
// slab pair of the period's chunk j0 + n; d is cleared. Lane t folds columns 2t and 2t + 1: D row g of m-tile
// i is column 2i of the lane's 16, row g + 8 is column 2i + 1. COLS = 1 is the once-per-chunk fold on lanes
// t = 0; COLS = PERIOD folds a whole period once, spread over all lanes.
template <int COLS>
__device__ __forceinline__ void tile_fold(const unsigned char* sm, const float2* slab_sums, int j0, float (&d)[TT_MT][4],
                                          float (&y)[16]) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int half = warp & 1, k0 = (warp >> 1) * TT_K;
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const int n = 2 * t + e;
    if (n < COLS) {
      const int j = j0 + n, slab = (j * CHUNK_K + k0) / (2 * SLAB), group = 2 * j + k0 / GROUP;
      const float even = slab_sums[slab].x + slab_sums[slab + 1].x, odd = slab_sums[slab].y + slab_sums[slab + 1].y;
      const float S = even + odd, O = LO_BIAS * even + HI_BIAS * odd;
      const int first = group * TILE + half * TT_COLS + 16 * g;
      const uint4* sp = reinterpret_cast<const uint4*>(sm + SEED_S + first * 2);
      const uint4* zp = reinterpret_cast<const uint4*>(sm + SEED_Z + first * 2);
      const uint4 s0 = sp[0], s1 = sp[1], z0 = zp[0], z1 = zp[1];
      const unsigned sw[8] = {s0.x, s0.y, s0.z, s0.w, s1.x, s1.y, s1.z, s1.w};
      const unsigned zw[8] = {z0.x, z0.y, z0.z, z0.w, z1.x, z1.y, z1.z, z1.w};
#pragma unroll
      for (int i = 0; i < TT_MT; ++i) {   // word i of the scales holds columns 2i (low) and 2i + 1 (high)
        y[2 * i] = fmaf(bf16_lo(sw[i]), d[i][e] - fmaf(bf16_lo(zw[i]), S, O), y[2 * i]);
        y[2 * i + 1] = fmaf(bf16_hi(sw[i]), d[i][2 + e] - fmaf(bf16_hi(zw[i]), S, O), y[2 * i + 1]);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < TT_MT; ++i) d[i][0] = d[i][1] = d[i][2] = d[i][3] = 0.0f;
}

// ================================ kernels ================================

// out[block][warp][column]: the warp's partial sums after `steps` chunk steps (steps % PERIOD == 0).
extern "C" __global__ void __launch_bounds__(THREADS, BLOCKS_PER_SM)
seed_probe(const uint4* images, int n_images, int steps, float* out) {
  extern __shared__ uint4 smem[];
  stage_image(images, n_images, SEED_BYTES, smem);
  const unsigned char* sm = reinterpret_cast<const unsigned char*>(smem);
  float acc[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) acc[i] = 0.0f;
#pragma unroll 1
  for (int c = 0; c < steps; ++c) seed_chunk(sm, c, acc);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
  for (int i = 0; i < 16; ++i) acc[i] += __shfl_down_sync(0xffffffffu, acc[i], 16);
  if (lane < 16) {
    float4* dst = reinterpret_cast<float4*>(out + ((size_t)blockIdx.x * WARPS + warp) * TILE + lane * 16);
#pragma unroll
    for (int i = 0; i < 4; ++i) dst[i] = make_float4(acc[4 * i], acc[4 * i + 1], acc[4 * i + 2], acc[4 * i + 3]);
  }
}

// out[block][k half][column]: each k half's sums after `steps` chunk steps (steps % PERIOD == 0).
extern "C" __global__ void __launch_bounds__(THREADS, BLOCKS_PER_SM)
tc_probe(const uint4* images, int n_images, int steps, float* out) {
  extern __shared__ uint4 smem[];
  stage_image(images, n_images, TC_BYTES, smem);
  const unsigned char* sm = reinterpret_cast<const unsigned char*>(smem);
  float acc[MT][4], y[MT][2];
#pragma unroll
  for (int m = 0; m < MT; ++m) {
    acc[m][0] = acc[m][1] = acc[m][2] = acc[m][3] = 0.0f;
    y[m][0] = y[m][1] = 0.0f;
  }
#pragma unroll 1
  for (int c = 0; c < steps; ++c) {
    tc_chunk(sm, c, acc);
    if (c % PERIOD == PERIOD - 1) tc_fold(sm, acc, y);
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2;
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int r = 0; r < 2; ++r) {   // the four lanes of a row hold its eight groups, two each
      y[m][r] += __shfl_xor_sync(0xffffffffu, y[m][r], 1);
      y[m][r] += __shfl_xor_sync(0xffffffffu, y[m][r], 2);
    }
  if ((lane & 3) == 0) {
    float* dst = out + ((size_t)blockIdx.x * WARPS + (warp >> 2)) * TILE + (warp & 3) * MT * 16 + g;
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      dst[16 * m] = y[m][0];
      dst[16 * m + 8] = y[m][1];
    }
  }
}

// out[block][warp][column]: each warp's sums of its column half after `steps` chunk steps (steps % PERIOD == 0).
// DEFER puts chunk j of a period in B column j and folds once per period; otherwise column 0, fold per chunk.
template <bool SWIZZLED, bool DEFER>
__device__ void tile_run(const uint4* images, int n_images, int steps, float* out) {
  extern __shared__ uint4 smem[];
  __shared__ float2 slab_sums[TT_SLAB_SUMS];
  __shared__ uint2 zero8;
  if (threadIdx.x == 0) zero8 = make_uint2(0u, 0u);
  stage_image(images, n_images, SEED_BYTES, smem);
  const unsigned char* sm = reinterpret_cast<const unsigned char*>(smem);
  if (threadIdx.x < TT_SLAB_SUMS) {   // what staging x would add: per slab, sum x over even and odd k
    const __half2* xs = reinterpret_cast<const __half2*>(sm + SEED_X) + threadIdx.x * SLAB;
    float2 e = make_float2(0.0f, 0.0f);
    for (int r = 0; r < SLAB; ++r) {
      const float2 v = __half22float2(xs[r]);
      e.x += v.x;
      e.y += v.y;
    }
    slab_sums[threadIdx.x] = e;
  }
  __syncthreads();
  float d[TT_MT][4], y[16];
#pragma unroll
  for (int i = 0; i < TT_MT; ++i) d[i][0] = d[i][1] = d[i][2] = d[i][3] = 0.0f;
#pragma unroll
  for (int i = 0; i < 16; ++i) y[i] = 0.0f;
#pragma unroll 1
  for (int c = 0; c < steps; ++c) {
    const int j = c % PERIOD;
    if (DEFER) {
      tile_chunk<SWIZZLED>(sm, &zero8, c, j, d);
      if (j == PERIOD - 1) tile_fold<PERIOD>(sm, slab_sums, 0, d, y);
    } else {
      tile_chunk<SWIZZLED>(sm, &zero8, c, 0, d);
      tile_fold<1>(sm, slab_sums, j, d, y);
    }
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
  for (int i = 0; i < 16; ++i) {   // the four lanes t of a row g hold its columns' sums over different chunks
    y[i] += __shfl_xor_sync(0xffffffffu, y[i], 1);
    y[i] += __shfl_xor_sync(0xffffffffu, y[i], 2);
  }
  if ((lane & 3) == 0) {
    float4* dst = reinterpret_cast<float4*>(out + ((size_t)blockIdx.x * WARPS + warp) * TILE + (warp & 1) * TT_COLS +
                                            16 * (lane >> 2));
#pragma unroll
    for (int i = 0; i < 4; ++i) dst[i] = make_float4(y[4 * i], y[4 * i + 1], y[4 * i + 2], y[4 * i + 3]);
  }
}

extern "C" __global__ void __launch_bounds__(THREADS, BLOCKS_PER_SM)
tile_probe(const uint4* images, int n_images, int steps, float* out) {
  tile_run<false, false>(images, n_images, steps, out);
}

extern "C" __global__ void __launch_bounds__(THREADS, BLOCKS_PER_SM)
tile_swz_probe(const uint4* images, int n_images, int steps, float* out) {
  tile_run<true, false>(images, n_images, steps, out);
}

extern "C" __global__ void __launch_bounds__(THREADS, BLOCKS_PER_SM)
tile_defer_probe(const uint4* images, int n_images, int steps, float* out) {
  tile_run<true, true>(images, n_images, steps, out);
}
