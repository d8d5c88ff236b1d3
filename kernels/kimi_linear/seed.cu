// Kimi-Linear W4A16 decode step (3 KDA + 1 MLA layer, each with a 64-expert top-8 MoE) in ONE
// cooperative launch per token.
//
// What it does: every RMSNorm, int4 dequant-GEMV, short conv + SiLU + window update, KDA gated
// delta-rule update, MLA (absorbed form, split context, stable softmax merge, cache append with
// RoPE), MoE routing (softmax, top-k, renormalisation) and the residual adds, for one token.
// Weights are streamed once as int4; no bf16 weight matrix is ever written.
//
// How: a persistent grid (SMs x BLOCKS_PER_SM blocks, all co-resident) walks the phase schedule at
// the bottom of this file; phases are separated by grid-wide barriers (5 per KDA layer, 7 per MLA
// layer; a block arrives, issues the next phase's prefetch, then waits), except that the MoE down
// projections follow a block's gate/up units directly. A GEMV phase is a list of jobs; a job's output
// columns are cut into 256-wide tiles and its input into KSPLIT slices; a block computes one (tile,
// slice) unit with all its warps, writes the partial, and the last block to finish a tile (arrival
// counter) sums the partials in a fixed order and runs the tile's epilogue (RoPE, cache row). The
// output and down projections add their partials into a fixed-point accumulator in L2 instead (integer
// atomics), so their last arrival reads one total per column with the residual it adds it to (with ACC_COUNT
// each word counts its adds, and the add that completes a column finishes it; the MLA merge's parts then add
// the same way).
// Two projections leave the sum to their consumer instead, which takes the finish of a tile off the
// critical path: the KDA delta rule sums the q/k/v/g partials of its head (and applies the conv and
// the decay), and a down unit waits until every K slice of the gate/up tiles its own K slice reads has
// arrived, then sums their partials and applies SwiGLU as it stages its input.
// Deterministic: no float atomics anywhere (integer sums do not depend on the order of arrival).
//
// Weight stream: a block's units are cut into chunks (one 16-row slab per warp) that the TMA engine
// copies (cp.async.bulk, three copies per chunk from the binding's tile-major layout, an mbarrier per
// slot) into a two-slot shared-memory ring: chunk i+1 is in flight while chunk i is computed, and the
// first two chunks of the next phase are issued at the grid barrier (weights do not depend on
// activations), so they land while the block waits and then stages its input vector. The copies
// carry an L2 evict-first policy: the weights are never reused from L2, and what the next step does
// reuse (code, states, partials) then stays resident (-13 µs per step).
//
// MLA attention runs on tensor cores (mma.sync m16n8k16, bf16 in, fp32 accumulate) over the latent
// cache, 16 heads per unit and the context split across the grid; q and the softmax weights enter
// rounded to bf16 (as upstream's bf16 path has them), q's fragments stay in registers and the cache
// tiles land by bulk copies in a shared-memory double buffer. The MLA-only phases (absorb q, attention,
// merge) are not inlined: the kernel body's register allocation then serves the GEMV phases alone (-15 µs
// per step).
//
// Int4 inner loop: integer dot products. The staged input x is int16 in blocks of 32 (x = xi * xs, xs a
// power of two per block). A lane loads 16 bytes = 16 columns x 2 k; with the binding's paired nibbles one
// AND per 4 columns lines up each column's two weights with the pair (xi[2r], xi[2r+1]), and one DP2A adds
// their products to the column's int32 sum, exactly. After its 16 k the lane folds once per column,
// y += scale * xs * (sum q*xi - zero * sum xi) in fp32 (the zero point folds out exactly). A chunk's
// partial sums are folded into a per-warp row in shared memory, so the two matrices of a gate/up pair can
// alternate chunk by chunk.
//
// Dimensions arrive as -D from the task (HIDDEN, KDA_H, ...); knobs below are tuned by the agent
// (declared in the order the tuner should try them: work split first, launch shape last).
// Run: python run_agent.py bench kernels/kimi_linear/seed.cu
//
// @knob KSPLIT_KDA 3 {2,3,4,6,8,9} K slices of the KDA q/k/v/g projections (3: 192 units of 24 slabs = 3 whole chunks)
// @knob KSPLIT_GU 9 {4,6,7,8,9,12} K slices of the routed experts' gate/up (9: 288 units of two whole chunks, + 36 shared = 324)
// @knob KSPLIT_DOWN 3 {1,2,3,4,8} K slices of each expert's down projection (3: 243 units, one per block)
// @knob KSPLIT_SHARED 9 {6,9,12,18,36} K slices of the shared expert's gate/up (in the routed phase)
// @knob KSPLIT_MLA 9 {6,9,12,18} K slices of the MLA q/kv_a projections
// @knob KSPLIT_O 28 {8,16,28,32} K slices of the attention output projections
// @knob PREFETCH 1 {0,1} issue the next phase's first weight chunk before each grid barrier
// @knob ATTN_MAX_SPLITS 160 {64,128,160} most context splits per head group in MLA attention (the grid allows 132)
// @knob BLOCKS_PER_SM 2 {1,2} co-resident blocks per SM (grid = SMs x this)
// @knob THREADS 256 {256,512} threads per block (more warps in flight per block, fewer registers each)
// @knob FOLD_SPLIT 1 {0,1} the two row halves of a GEMV lane pair swap their int32 column sums so each lane folds 8 of its 16 columns (0: each lane folds 16, then the halves add their floats)
// @knob HI_BY_SUB 1 {0,1} the high nibbles' DP2A take the whole packed bytes, and the low nibbles' sums are subtracted once per slab (one LOP3 per weight word instead of two)
// @knob SMEM_BASE 0 {0,48,64} the dynamic shared region (x, sums, weight ring, attention tiles) starts this many bytes past a 128-byte boundary: the static RingSync is padded to 128 + this (48: where the bare RingSync left it, 4 % slower on the H100)
// @knob ACC_COUNT 1 {0,1} the output and down projections' and the MLA merge's accumulator words count their arrivals: the add that completes a column finishes it (0: a tile counter and the tile's last arrival; the merge's parts stored, an arrival counter per head and the last part's fp32 sum)

#include <cuda_bf16.h>
#include <cuda_fp16.h>

// ================================ dimensions and layout ================================

MK_PAIRED_NIBBLES   // the binding pairs each w_q word's nibbles as gemv_chunk's DP2A reads them

#ifndef SKIP_ATTN
#define SKIP_ATTN 0
#endif
#ifndef SKIP_MOE
#define SKIP_MOE 0
#endif
#ifndef PHASE_STAMPS
#define PHASE_STAMPS 0   // profiling switch: 1, each block stamps %globaltimer around every grid barrier (free:
#endif                   // the step's time is unchanged); 2, also at events inside each phase (see Event)

constexpr int WARPS = THREADS / 32;
constexpr int TILE = 256;          // output columns per GEMV tile (16 lanes x 16 columns)
constexpr int SLAB = 16;           // packed weight rows per warp work item (8 per lane half)
constexpr int GROUP_ROWS = QGROUP / 2;
constexpr int C_KDA = KDA_H * KDA_D;
constexpr int MLA_QK = QK_NOPE + QK_ROPE;
constexpr int MLA_Q_N = MLA_H * MLA_QK;
constexpr int KVA_N = KV_LORA + QK_ROPE;
constexpr int KVB_HEAD = QK_NOPE + V_HEAD;
constexpr int KVB_N = MLA_H * KVB_HEAD;
constexpr int MLA_O_K = MLA_H * V_HEAD;
constexpr int N_SLOTS = N_ACTIVE + N_SHARED;     // routed experts + shared experts per token
constexpr int ATT_HG = MLA_H < 16 ? MLA_H : 16;  // heads per attention unit: the M=16 rows of one MMA tile
constexpr int ATT_TT = 32;                       // tokens per attention tile (one per lane in the softmax)
constexpr int ATT_K = KV_LORA + QK_ROPE;         // score dot-product length: latent row, then roped key

__host__ __device__ constexpr int imax(int a, int b) { return a > b ? a : b; }
__host__ __device__ constexpr int tiles_of(int n) { return (n + TILE - 1) / TILE; }
__host__ __device__ constexpr size_t align4(size_t n) { return (n + 3) & ~size_t(3); }
#define NEG_INF (-__int_as_float(0x7f800000))

static_assert(THREADS % 128 == 0 && WARPS >= 8, "need at least 8 warps per block, whole float4 rows of a tile");
static_assert(GROUP_ROWS % SLAB == 0, "a slab must not straddle a quant group");
static_assert(TILE == MK_WEIGHT_TILE, "GEMV tiles are the column tiles of the binding's tile-major weight layout");
static_assert(HIDDEN % 16 == 0 && C_KDA % 16 == 0 && MLA_Q_N % 16 == 0 && KVA_N % 16 == 0, "N % 16");
static_assert(KVB_N % 16 == 0 && MOE_INTER % 16 == 0, "N % 16");
static_assert(QK_NOPE % 16 == 0 && V_HEAD % 16 == 0 && QK_NOPE <= 512 && V_HEAD <= 512, "head dims");
static_assert(KDA_D % 16 == 0 && KDA_D % (THREADS / 16) == 0, "delta-rule thread split");
static_assert(MLA_H % ATT_HG == 0, "attention head groups");
static_assert(KV_LORA % (8 * WARPS) == 0 && QK_ROPE % 16 == 0 && KV_LORA % 16 == 0, "attention MMA tiling");
static_assert(QK_ROPE % 8 == 0 && KV_LORA % 8 == 0, "16-byte cache rows");
static_assert(N_EXPERTS <= THREADS, "one thread per router logit");
static_assert(N_ACTIVE <= 16 && N_SHARED <= 4, "routing slots live in a small shared-memory area");

// Scratch (floats): every intermediate that crosses blocks. Offsets are compile-time.
constexpr size_t OFF_KDA_PART = 0;   // KDA q, k, v, g partials [4][KSPLIT_KDA][C_KDA]: delta rule, then window shift
constexpr size_t OFF_BETA = OFF_KDA_PART + 4 * (size_t)KSPLIT_KDA * C_KDA;
constexpr size_t OFF_ATTN_O = OFF_BETA + align4(KDA_H);
constexpr size_t OFF_LOGITS = OFF_ATTN_O + align4(imax(C_KDA, MLA_O_K));
constexpr size_t OFF_QN = OFF_LOGITS + align4(N_EXPERTS);
constexpr size_t OFF_QR = OFF_QN + (size_t)MLA_H * QK_NOPE;
// q = [q_eff | q_rope] as the attention's MMA A fragments in bf16: words [head group][k step][lane][0-3],
// so a lane's share of a k step is 16 contiguous bytes
constexpr int Q_KSTEPS = ATT_K / 16;
constexpr size_t OFF_QFRAG = OFF_QR + (size_t)MLA_H * QK_ROPE;
constexpr size_t APART_STRIDE = KV_LORA + 2;                             // m, l, ctx[KV_LORA]
constexpr size_t OFF_APART = OFF_QFRAG + (size_t)(MLA_H / ATT_HG) * Q_KSTEPS * 32 * 4;
static_assert(OFF_QFRAG % 4 == 0 && OFF_APART % 4 == 0 && ATT_HG * APART_STRIDE % 4 == 0, "16-byte aligned q fragments and partials");
constexpr size_t OFF_SPLITK = OFF_APART + (size_t)ATTN_MAX_SPLITS * MLA_H * APART_STRIDE;
constexpr size_t GU_PART_FLOATS = (size_t)(N_SHARED * KSPLIT_SHARED + N_ACTIVE * KSPLIT_GU) * 2 * MOE_INTER;
constexpr size_t SPLITK_FLOATS = (size_t)imax(KSPLIT_MLA * (MLA_Q_N + KVA_N), (int)GU_PART_FLOATS);
constexpr size_t OFF_STAMPS = OFF_SPLITK + SPLITK_FLOATS;                 // u64[MAX_STAMPS][MAX_STAMP_BLOCKS]
constexpr int MAX_STAMPS = 128, MAX_STAMP_BLOCKS = 1024, N_EVENTS = 4 + 3 * 6;   // see Event
constexpr size_t OFF_EVENTS = OFF_STAMPS + 2 * (size_t)MAX_STAMPS * MAX_STAMP_BLOCKS;   // u64[MAX_STAMPS/2][N_EVENTS][blocks]
constexpr size_t SCRATCH_FLOATS = PHASE_STAMPS ? OFF_EVENTS + (size_t)MAX_STAMPS * N_EVENTS * MAX_STAMP_BLOCKS : OFF_STAMPS;
constexpr int ABSORB_PARTS = 8;                                          // MLA absorb units per head
constexpr int ABSORB_ROWS = (KV_LORA / 2) / ABSORB_PARTS;                 // packed W_kv_b rows per unit
static_assert((KV_LORA / 2) % ABSORB_PARTS == 0 && ABSORB_PARTS * MLA_O_K <= SPLITK_FLOATS, "absorb parts");
static_assert(ABSORB_ROWS % (32 / (QK_NOPE / 16)) == 0 && ABSORB_ROWS % (32 / (V_HEAD / 16)) == 0 &&
              GROUP_ROWS % 32 == 0, "absorb rows: whole warp iterations, none straddling a quant group");
// Counters (zeroed by the binding once): the tile counters of the phase that runs (MLA project, output
// or down projection) from 0, then one per MLA head (merge, ACC_COUNT 0), then per (slot, tile) the gate/up
// arrivals, then the fixed-point accumulator of the output and down projections (HIDDEN u64: see acc_add, zero
// between phases), then with ACC_COUNT the merge's (MLA_O_K u64), then the grid barrier's.
constexpr int CNT_MERGE = imax(tiles_of(MLA_Q_N) + tiles_of(KVA_N), tiles_of(HIDDEN));
constexpr int CNT_GATE_UP = CNT_MERGE + MLA_H;   // per (slot, tile): gate/up K slices arrived (down waits on them)
constexpr int CNT_ACC = (CNT_GATE_UP + N_SLOTS * tiles_of(MOE_INTER) + 3) / 4 * 4;   // 16-byte aligned
constexpr int CNT_MERGE_ACC = CNT_ACC + 2 * HIDDEN;
constexpr int COUNTER_WORDS = CNT_MERGE_ACC + (ACC_COUNT ? 2 * MLA_O_K : 0) + 32;
static_assert(N_SLOTS * tiles_of(MOE_INTER) <= THREADS, "one clearing thread per gate/up counter");
constexpr int BARRIER_WORD = COUNTER_WORDS - 1;   // the grid barrier's counter; tile counters stay below

// Shared memory: one dynamic buffer, carved per phase kind.
constexpr int X_MAX = imax(imax(HIDDEN, C_KDA), imax(MLA_O_K, N_SLOTS * MOE_INTER));
constexpr int CHUNK_SLABS = WARPS;                                        // one slab per warp
constexpr int CHUNK_ROWS = CHUNK_SLABS * SLAB;
constexpr int CHUNK_GROUPS = (CHUNK_ROWS + GROUP_ROWS - SLAB - 1) / GROUP_ROWS + 1;   // groups a chunk can touch
constexpr size_t RING_W_BYTES = (size_t)CHUNK_ROWS * TILE;               // packed weights of one chunk
constexpr size_t RING_G_BYTES = 2 * (size_t)TILE;                         // one group's bf16 scales (or zeros)
constexpr size_t RING_SLOT = RING_W_BYTES + 2 * CHUNK_GROUPS * RING_G_BYTES;
constexpr int XBLK = 2 * SLAB;                                            // x elements per int16 scale (a slab's k)
constexpr size_t SM_XI = 0;                                               // short[X_MAX]: x as int16 ...
constexpr size_t SM_XS = SM_XI + 2 * (size_t)X_MAX;                       // float[X_MAX / XBLK]: ... times these
constexpr size_t SM_RED = SM_XS + 4 * (size_t)(X_MAX / XBLK);             // float[2][WARPS][TILE]: a unit's per-warp sums
constexpr size_t SM_SUMS = SM_RED + 4 * 2 * (size_t)WARPS * TILE;         // float[2*TILE]
constexpr size_t SM_MISC = SM_SUMS + 4 * 2 * (size_t)TILE;                // flag, routing
constexpr size_t SM_JOBS = SM_MISC + ((256 + 8 * (size_t)N_EXPERTS + 15) & ~size_t(15));   // the phase's job table
constexpr size_t JOBS_BYTES = 2048;
constexpr size_t SM_RING = SM_JOBS + JOBS_BYTES;                          // 2 ring slots
constexpr size_t SM_GEMV_BYTES = SM_RING + 2 * RING_SLOT;
static_assert(X_MAX % XBLK == 0 && HIDDEN % XBLK == 0 && MOE_INTER % XBLK == 0, "whole int16 x blocks");
static_assert(C_KDA % XBLK == 0 && MLA_O_K % XBLK == 0, "stage_floats: whole x blocks");
static_assert(2 * HIDDEN <= 4 * WARPS * TILE, "the fp16 copy of a staged rmsnorm fits the second half of red");
static_assert(SM_XS % 16 == 0 && SM_RED % 16 == 0, "16-byte accesses to x and red");
constexpr int P_STRIDE = ATT_TT + 8;                                      // bf16
constexpr int KEY_STRIDE = ATT_K + 8;                                     // bf16: a token's latent row, then its roped key
constexpr int SC_STRIDE = ATT_TT + 8;                                     // floats; rows 8 banks apart
constexpr size_t KEY_TILE_BYTES = 2 * (size_t)ATT_TT * KEY_STRIDE;
constexpr size_t SA_KEY = 0;                                              // bf16 [2][ATT_TT][KEY_STRIDE]: double buffer
constexpr size_t SA_SC = SA_KEY + 2 * KEY_TILE_BYTES;                     // float [WARPS][16][SC_STRIDE]: per-warp K slices
constexpr size_t SA_PH = SA_SC + 4 * (size_t)WARPS * 16 * SC_STRIDE;      // bf16 [16][P_STRIDE]: p
constexpr size_t SA_STAT = SA_PH + 2 * 16 * (size_t)P_STRIDE;             // float m[16], l[16], alpha[16]
constexpr size_t SM_ATTN_BYTES = SA_STAT + 4 * 3 * 16;
static_assert(4 * ATT_HG * APART_STRIDE <= SA_SC, "a unit's partials are staged in the cache tiles' buffers");
static_assert(KEY_TILE_BYTES % 16 == 0 && SA_PH % 16 == 0, "16-byte aligned attention tiles");
constexpr size_t SM_MERGE_BYTES = 4 * (2 * ATTN_MAX_SPLITS + 2 * ABSORB_ROWS + 2 * THREADS + (size_t)WARPS * V_HEAD + 2);
constexpr size_t DYN_SMEM = imax(imax((int)SM_GEMV_BYTES, (int)SM_ATTN_BYTES), (int)SM_MERGE_BYTES);

MK_LAUNCH_CONTRACT(THREADS, BLOCKS_PER_SM, DYN_SMEM, 4 * SCRATCH_FLOATS, COUNTER_WORDS)

// ================================ small helpers ================================

__device__ __forceinline__ float bf16r(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }
__device__ __forceinline__ float ld_bf16(const bf16* p) {
  return __bfloat162float(__ushort_as_bfloat16(__ldcg(reinterpret_cast<const unsigned short*>(p))));
}
__device__ __forceinline__ float bf16_lo(unsigned w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(unsigned w) { return __uint_as_float(w & 0xffff0000u); }
__device__ __forceinline__ float silu(float v) { return v / (1.0f + expf(-v)); }
__device__ __forceinline__ float sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }
__device__ __forceinline__ float softplus(float v) { return v > 20.0f ? v : log1pf(expf(v)); }
__device__ __forceinline__ bool is_mla_layer(int l) { return (MLA_LAYER_MASK >> l) & 1; }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block in a fixed order (deterministic); `red` holds at least WARPS floats.
__device__ float block_sum(float v, float* red) {
  v = warp_sum(v);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  float s = 0.0f;
  for (int w = 0; w < WARPS; ++w) s += red[w];
  __syncthreads();
  return s;
}

__device__ __forceinline__ void unpack8(uint4 v, float* out) {
  const unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) { out[2 * i] = bf16_lo(w[i]); out[2 * i + 1] = bf16_hi(w[i]); }
}

// Split-K sums of the output and down projections (and with ACC_COUNT the MLA merge's parts) add into a
// fixed-point accumulator in units of 2^-22:
// integer addition is associative, so the total does not depend on the order of arrival (the protocol
// runs a step twice and wants the same bits), and the tile's last arrival reads one total per column
// instead of every unit's partial. The resolution is absolute: a total carries up to 2^-23 of rounding per
// part (the fp32 sum it replaced was relative; BENCHMARKS.md, thirty-first session, has the emulated error).
// A partial of magnitude 2^22 or more, or not finite, adds ACC_POISON instead, and a total that holds one
// reads back as NaN: legal partials (< 2^44 units, at most ACC_MAX_PARTS of them) stay below 2^51 in total,
// and up to ACC_MAX_PARTS poisons (2^54 each) neither wrap nor cancel below 2^53.
// With ACC_COUNT a word also counts its adds in its top bits (ACC_COUNT_UNIT each, at most ACC_MAX_PARTS = 72):
// the add that completes the count returns the column's whole total, so that unit finishes the column with no
// tile counter, no fence and no second load. The sum below the count keeps 2^55 of room: legal partials are
// < 2^40 units (|v| < 2^18), a poison is 2^48, and a total reads back as NaN from 2^47.
constexpr float ACC_ONE = 4194304.0f;                    // 2^22 units per 1.0
constexpr float ACC_LEGAL = ACC_COUNT ? 1099511627776.0f : ACC_ONE * ACC_ONE;   // 2^40 or 2^44 units
constexpr long long ACC_POISON = ACC_COUNT ? 1ll << 48 : 1ll << 54;
constexpr int ACC_MAX_PARTS = ACC_COUNT ? 72 : 128;
constexpr unsigned long long ACC_COUNT_UNIT = 1ull << 56;
__device__ __forceinline__ unsigned long long acc_units(float v) {
  const float u = v * ACC_ONE;
  return (unsigned long long)(fabsf(u) < ACC_LEGAL ? __float2ll_rn(u) : ACC_POISON);   // NaN fails the test too
}
__device__ __forceinline__ void acc_add(unsigned long long* a, float v) { atomicAdd(a, acc_units(v)); }
// ACC_COUNT: add v and one arrival; returns the word as this add left it (a global atomic: the output and
// down projections' pointer comes from the job table in shared memory, and a generic one carries a
// shared-window fallback)
__device__ __forceinline__ unsigned long long acc_add_counted(unsigned long long* a, float v) {
  const unsigned long long d = acc_units(v) + ACC_COUNT_UNIT;
  unsigned long long old;
  asm volatile("atom.global.add.u64 %0, [%1], %2;" : "=l"(old) : "l"(__cvta_generic_to_global(a)), "l"(d) : "memory");
  return old + d;
}
__device__ __forceinline__ unsigned long long acc_parts(unsigned long long a) { return (a + ACC_COUNT_UNIT / 2) >> 56; }
__device__ __forceinline__ float acc_value(unsigned long long a) {
  const long long s = (long long)(ACC_COUNT ? a - acc_parts(a) * ACC_COUNT_UNIT : a);
  return s < ACC_POISON / 2 && s > -ACC_POISON / 2 ? __ll2float_rn(s) * (1.0f / ACC_ONE) : __int_as_float(0x7fffffff);
}

// Arrival counters. The block barrier before an arrival makes the other threads' writes part of its
// release (cumulativity); the block barrier after it passes the acquire on to them. One acq_rel atomic
// replaces __threadfence + atomicAdd + __threadfence (fence.sc.gpu, the strongest and slowest fence).
__device__ __forceinline__ unsigned atomic_add_acq_rel(unsigned* p, unsigned v) {
  unsigned old;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}
__device__ __forceinline__ unsigned atomic_add_release(unsigned* p, unsigned v) {
  unsigned old;
  asm volatile("atom.release.gpu.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}
__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ unsigned ld_relaxed(const unsigned* p) {
  unsigned v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Gate/up partials: the router phase sets them to PART_MARK, a NaN no stored partial carries (published()
// maps it to the canonical NaN), so a reader tells a partial not landed yet from a landed one. Their
// arrival is then relaxed: it needs no fence, which waits for the partials' stores to be acknowledged (an
// L2 round trip on the MoE phase's critical chain: 1.020x / 1.018x, BENCHMARKS.md, thirty-sixth session),
// and it may run ahead of them.
constexpr unsigned PART_MARK = 0x7fa5a5a5u;
__device__ __forceinline__ float published(float v) { return __float_as_uint(v) == PART_MARK ? __int_as_float(0x7fffffff) : v; }
__device__ __forceinline__ bool unlanded(float4 v) {
  return __float_as_uint(v.x) == PART_MARK || __float_as_uint(v.y) == PART_MARK || __float_as_uint(v.z) == PART_MARK ||
         __float_as_uint(v.w) == PART_MARK;
}
__device__ __forceinline__ void st_relaxed(float* p, float v) {
  asm volatile("st.relaxed.gpu.global.f32 [%0], %1;" ::"l"(p), "f"(v) : "memory");
}
__device__ __forceinline__ float4 ld_relaxed4(const float* p) {
  float4 v;
  asm volatile("ld.relaxed.gpu.global.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p) : "memory");
  return v;
}

// A chunk of the weight stream carries its unit's job, tile, K slice and slab range, found once per unit
// (walking the job table on every use cost a dependent chain of shared-memory loads per step). Packed
// into four words: run_jobs keeps three chunks live around the GEMV loop.
struct Chunk {
  int unit;          // global unit index (>= total: none)
  int slab;          // first slab of the chunk
  unsigned place;    // the unit's output tile (bits 0-15) and K slice (16-31) in its job
  unsigned bits;     // job (bits 0-4), matrix of a pair (5), the unit's slabs [s0, s1) (6-15, 16-25)
  __device__ int tile() const { return place & 0xffff; }
  __device__ int split() const { return place >> 16; }
  __device__ int job() const { return bits & 31; }
  __device__ int m() const { return (bits >> 5) & 1; }
  __device__ int s0() const { return (bits >> 6) & 1023; }
  __device__ int s1() const { return bits >> 16; }
};
static_assert(N_SLOTS < 32 && imax(imax(HIDDEN, C_KDA), imax(MLA_O_K, MOE_INTER)) / 2 / SLAB < 1024, "Chunk fields");

// The weight ring is filled by the TMA engine: one thread issues a bulk copy per contiguous piece of a
// chunk (the binding lays every matrix out tile-major, so a chunk's rows are one piece), and a slot's
// mbarrier counts the bytes in. The copying threads no longer stall on issue (16-byte cp.async issue is
// throttled to about the rate the data drains: ~1.5-2.5 µs per 32 KB chunk, on every block's critical
// path), and the copies no longer queue in front of the compute warps' shared-memory loads.
constexpr int RING_COPIES = 3;   // bulk copies per chunk: packed rows, scales, zeros
struct RingSync {
  unsigned long long bar[2];   // one mbarrier per slot (RING_COPIES arrivals per fill)
  unsigned fills[2];           // bulk fills issued into each slot so far (thread 0 writes)
  int total;                   // units of the job table in shared memory (job_table writes)
  int skew;                    // the table's unit u starts on block (u + skew) mod grid
  Chunk head;                  // this block's first chunk of that table (issue_first writes)
};
// The block's only static shared memory (the profiling builds' stamp state included). The dynamic region follows
// it 16-byte aligned (a probe on the H100: static at byte 1024, the region right behind it), so it starts SMEM_BASE
// bytes past a 128-byte boundary. At 48 (where the bare RingSync left it) every buffer of the region started off a
// 32-byte sector and the step ran 4 % slower (H100, BENCHMARKS.md). The weight ring's bulk copies pay all of it (the
// ring alone moved off: 0.96x; everything but the ring: no change): a long bulk copy to an odd multiple of 16 B past
// a sector lands at about half rate (scripts/bulk_align_probe.py); 32 or 64 B past costs nothing there
struct SyncArea {
  RingSync rs;
#if PHASE_STAMPS >= 2
  int stamp_phase;    // the phase this block is in; kept by Barrier::stamp
  int stamp_chunks;   // chunks this block has run in that phase (thread 0's count)
  unsigned char pad[128 + SMEM_BASE - sizeof(RingSync) - 2 * sizeof(int)];
#else
  unsigned char pad[128 + SMEM_BASE - sizeof(RingSync)];
#endif
};
static_assert(sizeof(SyncArea) == 128 + SMEM_BASE, "the dynamic region starts SMEM_BASE past a 128-byte boundary");
__shared__ __align__(16) SyncArea sync_area;
__device__ __forceinline__ unsigned smem_addr(const void* p) { return static_cast<unsigned>(__cvta_generic_to_shared(p)); }
// Weights stream through L2 once per step (226 MB, several times its size) and are never reused from it,
// so the bulk copies mark them evict-first: what the next step reuses stays resident (code, KDA states,
// conv windows, norms, split-K partials). With the default policy the weights flushed all of it.
// The MLA cache tiles are marked evict-first too: their second reader (the other head group) comes
// within the phase, and at 16K the 19 MB cache kept resident crowded out the rest (evict-last: slower).
__device__ __forceinline__ unsigned long long l2_evict_first() {
  unsigned long long policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, unsigned bytes, unsigned long long* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;"
               ::"r"(smem_addr(dst)), "l"(src), "r"(bytes), "r"(smem_addr(bar)), "l"(l2_evict_first()) : "memory");
}
// Before a bulk copy, by its issuing thread: one arrival, and the phase waits for `bytes` more.
__device__ __forceinline__ void expect_bytes(unsigned long long* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
__device__ void ring_init(RingSync* rs) {
  if (threadIdx.x == 0) {
    for (int s = 0; s < 2; ++s) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(&rs->bar[s])), "n"(RING_COPIES) : "memory");
      rs->fills[s] = 0;
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
}
// Every calling thread waits until the slot's latest fill has landed (returns at once if it has, or if
// the slot was never filled). The caller has passed a block barrier since that fill was issued.
__device__ __forceinline__ void ring_wait(const RingSync* rs, int slot) {
  const unsigned bar = smem_addr(&rs->bar[slot]), parity = (rs->fills[slot] - 1u) & 1u;
  unsigned done;
  do {
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                 : "=r"(done) : "r"(bar), "r"(parity) : "memory");
  } while (!done);
}

// ================================ shared-memory views ================================

struct Smem {
  unsigned char* base;
  RingSync* rs;
  __device__ short* xi() const { return reinterpret_cast<short*>(base + SM_XI); }
  __device__ float* xs() const { return reinterpret_cast<float*>(base + SM_XS); }
  __device__ float* red() const { return reinterpret_cast<float*>(base + SM_RED); }
  // fp16 rmsnorm(x) * w for the dense bf16 rows (beta, router): the second half of red, which the
  // unpaired projections that follow a staging never fold into, and the router's phase ends at a barrier
  __device__ __half* xh() const { return reinterpret_cast<__half*>(base + SM_RED + 4 * WARPS * TILE); }
  __device__ float* sums() const { return reinterpret_cast<float*>(base + SM_SUMS); }
  __device__ int* flag() const { return reinterpret_cast<int*>(base + SM_MISC); }
  __device__ int* sel_e() const { return reinterpret_cast<int*>(base + SM_MISC + 16); }
  __device__ float* sel_w() const { return reinterpret_cast<float*>(base + SM_MISC + 16 + 4 * 16); }
  __device__ float* logits() const { return reinterpret_cast<float*>(base + SM_MISC + 256); }   // logits, then probabilities
  __device__ unsigned char* ring(int slot) const { return base + SM_RING + slot * RING_SLOT; }
  __device__ struct Job* jobs() const { return reinterpret_cast<struct Job*>(base + SM_JOBS); }
};

// Everything a phase needs: the parameter block, this layer, and typed views of the scratch.
struct Ctx {
  const KimiParams* p;
  const LayerParams* L;
  const bf16* resid;      // residual input of the attention half (hidden_in for layer 0)
  float* scratch;
  unsigned* counters;
  int ctx_len;
  int layer;
  __device__ float* kda_part() const { return scratch + OFF_KDA_PART; }
  __device__ float* beta() const { return scratch + OFF_BETA; }
  __device__ float* attn_o() const { return scratch + OFF_ATTN_O; }
  __device__ float* logits() const { return scratch + OFF_LOGITS; }
  __device__ float* qn() const { return scratch + OFF_QN; }
  __device__ float* qr() const { return scratch + OFF_QR; }
  __device__ unsigned* qfrag() const { return reinterpret_cast<unsigned*>(scratch + OFF_QFRAG); }
  __device__ float* apart() const { return scratch + OFF_APART; }
  __device__ float* splitk() const { return scratch + OFF_SPLITK; }
  __device__ unsigned long long* acc() const { return reinterpret_cast<unsigned long long*>(counters + CNT_ACC); }
  __device__ unsigned long long* merge_acc() const { return reinterpret_cast<unsigned long long*>(counters + CNT_MERGE_ACC); }
};

// Profiling (PHASE_STAMPS 2): events inside a GEMV phase, stamped by thread 0 (the first four right after a
// __syncthreads): input staged, first chunk landed, a unit's sums reduced (the last counts), all units
// done; then, for each of a block's first six chunks, landed, read by every warp, next chunk issued.
// In the MoE phase the down units' chunks are numbered on from the block's gate/up chunks, "staged" and
// "first chunk" are the gate/up run's, "computed" and "done" the down run's.
// MLA attention stamps the first four too: q loads issued, first cache tile in shared memory, last
// tile's P.V done, partials written (a unit's; the last one counts); and per cache tile, in the chunk
// slots: landed, scores done, softmax done.
// The events cost: the step runs ~7% slower (H100, 2K: +16-19 µs/token; neither the timer read nor the
// global store is the cost: a clock64 kept in shared memory costs the same). Read a phase's order of
// events from them and its length from the barrier stamps of PHASE_STAMPS 1 (BENCHMARKS.md, 2026-12-05).
enum Event { EV_STAGED, EV_FIRST_CHUNK, EV_COMPUTED, EV_DONE, EV_CHUNK };
enum ChunkEvent { CH_LANDED, CH_READ, CH_ISSUED };
constexpr int STAMPED_CHUNKS = 6;
__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ int phase_chunks() {
#if PHASE_STAMPS >= 2
  return sync_area.stamp_chunks;
#else
  return 0;
#endif
}
__device__ __forceinline__ void set_phase_chunks(int k) {
#if PHASE_STAMPS >= 2
  if (threadIdx.x == 0) sync_area.stamp_chunks = k;
#endif
}
__device__ __forceinline__ void mark(const Ctx& cx, int ev) {
#if PHASE_STAMPS >= 2
  if (threadIdx.x == 0 && blockIdx.x < MAX_STAMP_BLOCKS && sync_area.stamp_phase < MAX_STAMPS / 2 && ev < N_EVENTS)
    reinterpret_cast<unsigned long long*>(cx.scratch + OFF_EVENTS)
        [((size_t)sync_area.stamp_phase * N_EVENTS + ev) * MAX_STAMP_BLOCKS + blockIdx.x] = global_ns();
#endif
}
__device__ __forceinline__ void mark_chunk(const Ctx& cx, int chunk, ChunkEvent ev) {
  if (chunk < STAMPED_CHUNKS) mark(cx, EV_CHUNK + 3 * chunk + ev);
}

// ================================ staging the GEMV input ================================

// The GEMV reads x as int16 in blocks of XBLK elements, x = xi * xs with xs a power of two that puts the
// block's largest |x| just below 2^14 (a bf16 x is then exact down to 2^-6 of its block's largest, and the
// rest is rounded at 2^-15 of it: finer than fp16 for the elements that carry the dot product; the spare
// bit lets the rounding reach 2^14 and still fit). `bits`: an upper bound of the block's largest |x| as
// float bits (an unsigned max, so Inf and NaN win): they make xs NaN, and so reach the output. Returns 1 / xs.
__device__ __forceinline__ float x_block_scale(unsigned bits, float* xs) {
  const int e = max((int)(bits >> 23), 14);                                            // |x| < 2^(e - 126)
  *xs = e >= 255 ? __uint_as_float(0x7fc00000u) : __uint_as_float((unsigned)(e - 13) << 23);   // 2^(e - 140)
  return __uint_as_float((unsigned)(267 - min(e, 254)) << 23);                                 // 2^(140 - e)
}
// round(v * inv) in the low 16 bits of a float: v * inv + 1.5 * 2^23 rounds once, to an integer (exact for
// |v * inv| < 2^22; the block's scale keeps it under 2^14). Two of them make a pair with one PRMT.
__device__ __forceinline__ unsigned x_int16_bits(float v, float inv) {
  return __float_as_uint(fmaf(v, inv, 12582912.0f));
}
__device__ __forceinline__ unsigned x_int16_pair(float lo, float hi, float inv) {
  return __byte_perm(x_int16_bits(lo, inv), x_int16_bits(hi, inv), 0x5410);
}
__device__ __forceinline__ unsigned abs_bits(float v) { return __float_as_uint(v) & 0x7fffffffu; }

// x <- bf16(rmsnorm(src) * w) as int16 blocks, and as fp16 (exact for bf16 values in the normal range)
// for the dense rows. Every load (16 bytes per 8 elements) is issued before the block reduction: one L2
// round trip. A block's scale comes from a bound taken before the reduction, r * max|src * w| * (1 + 2^-6)
// (r > 0 scales every element alike; the margin covers the roundings of y = bf16(src * r * w)), so no
// exchange between threads follows it: four threads hold a block, and their maximum is exchanged while
// the block reduction's loads are in flight anyway. Both stagings are out of line (Smem by value): inlined,
// they left the kernel body's register allocation spilling (32-250 bytes, by variant).
__device__ __noinline__ void stage_rmsnorm(const bf16* src, const bf16* w, const Smem sm) {
  constexpr int V = HIDDEN / 8, PER = (V + THREADS - 1) / THREADS;
  static_assert(V % (XBLK / 8) == 0, "stage_rmsnorm: whole x blocks");
  uint4 xv[PER], wv[PER];
  unsigned top[PER];
  float ss = 0.0f;
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int v = threadIdx.x + i * THREADS;
    xv[i] = wv[i] = make_uint4(0, 0, 0, 0);
    if (v < V) {
      xv[i] = __ldcg(reinterpret_cast<const uint4*>(src) + v);
      wv[i] = __ldg(reinterpret_cast<const uint4*>(w) + v);
    }
    float f[8], g[8];
    unpack8(xv[i], f);
    unpack8(wv[i], g);
    top[i] = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) { ss += f[j] * f[j]; top[i] = max(top[i], abs_bits(f[j] * g[j])); }
#pragma unroll
    for (int o = 1; o < XBLK / 8; o <<= 1) top[i] = max(top[i], __shfl_xor_sync(0xffffffffu, top[i], o));
  }
  const float r = 1.0f / sqrtf(block_sum(ss, sm.red()) / HIDDEN + RMS_EPS);
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int v = threadIdx.x + i * THREADS;
    if (v < V) {
      float f[8], g[8], xs;
      unpack8(xv[i], f);
      unpack8(wv[i], g);
      const float inv = x_block_scale(abs_bits(__uint_as_float(top[i]) * r * 1.015625f), &xs);
      if (v % (XBLK / 8) == 0) sm.xs()[v / (XBLK / 8)] = xs;
      uint4 q, h;
      unsigned* qw = &q.x;
      unsigned* hw = &h.x;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float lo = bf16r(f[2 * j] * r * g[2 * j]), hi = bf16r(f[2 * j + 1] * r * g[2 * j + 1]);
        qw[j] = x_int16_pair(lo, hi, inv);
        const __half2 hh = __halves2half2(__float2half_rn(lo), __float2half_rn(hi));
        hw[j] = *reinterpret_cast<const unsigned*>(&hh);
      }
      *reinterpret_cast<uint4*>(sm.xi() + 8 * v) = q;
      *reinterpret_cast<uint4*>(sm.xh() + 8 * v) = h;
    }
  }
  __syncthreads();
}

// x[k0, k1) <- src[k0, k1) as int16 blocks (k0 and k1 whole blocks: eight threads of a warp hold one), every
// 16-byte load in flight before the first block's maximum is exchanged. The rest of x is left as it was.
__device__ __noinline__ void stage_floats(const float* src, int k0, int k1, const Smem sm) {
  constexpr int PER = (imax(C_KDA, MLA_O_K) / 4 + THREADS - 1) / THREADS;
  const int v0 = k0 / 4, v1 = k1 / 4;
  float4 f[PER];
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int v = v0 + threadIdx.x + i * THREADS;
    f[i] = v < v1 ? __ldcg(reinterpret_cast<const float4*>(src) + v) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int v = v0 + threadIdx.x + i * THREADS;
    if (v0 + (threadIdx.x & ~31) + i * THREADS >= v1) break;   // the whole warp is past the slice
    unsigned top = max(max(abs_bits(f[i].x), abs_bits(f[i].y)), max(abs_bits(f[i].z), abs_bits(f[i].w)));
#pragma unroll
    for (int o = 1; o < XBLK / 4; o <<= 1) top = max(top, __shfl_xor_sync(0xffffffffu, top, o));
    if (v >= v1) continue;   // a block past the slice: all eight of its threads
    float xs;
    const float inv = x_block_scale(top, &xs);
    if (v % (XBLK / 4) == 0) sm.xs()[v / (XBLK / 4)] = xs;
    *reinterpret_cast<uint2*>(sm.xi() + 4 * v) =
        make_uint2(x_int16_pair(f[i].x, f[i].y, inv), x_int16_pair(f[i].z, f[i].w, inv));
  }
  __syncthreads();
}

// ================================ int4 GEMV core ================================

// d = c + a.lo16 * b.byte0 + a.hi16 * b.byte1 (lo) or bytes 2, 3 (hi): two int16 activations times two
// unsigned int8 weights, exact in int32.
__device__ __forceinline__ int dp2a_lo(int a, unsigned b, int c) {
  int d;
  asm("dp2a.lo.s32.u32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
__device__ __forceinline__ int dp2a_hi(int a, unsigned b, int c) {
  int d;
  asm("dp2a.hi.s32.u32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// acc[c] += scale_c * xs * (sum_c - zero_c * xsum) over QUADS quads of columns, word j of sw / zw holding the
// bf16 scales / zeros of columns 2j, 2j+1. A quad's last two sums are 16x (high nibbles): their x scale and x
// sum are scaled to match.
template <int QUADS>
__device__ __forceinline__ void fold_columns(float* acc, const int* sum, const unsigned* sw, const unsigned* zw,
                                             int xsum, float x_scale) {
  const float xf = (float)xsum, xf16 = 16.0f * xf, xs16 = 0.0625f * x_scale;
#pragma unroll
  for (int j = 0; j < QUADS; ++j) {
    acc[4 * j + 0] = fmaf(bf16_lo(sw[2 * j]) * x_scale, fmaf(-bf16_lo(zw[2 * j]), xf, (float)sum[4 * j + 0]),
                          acc[4 * j + 0]);
    acc[4 * j + 1] = fmaf(bf16_hi(sw[2 * j]) * x_scale, fmaf(-bf16_hi(zw[2 * j]), xf, (float)sum[4 * j + 1]),
                          acc[4 * j + 1]);
    acc[4 * j + 2] = fmaf(bf16_lo(sw[2 * j + 1]) * xs16, fmaf(-bf16_lo(zw[2 * j + 1]), xf16, (float)sum[4 * j + 2]),
                          acc[4 * j + 2]);
    acc[4 * j + 3] = fmaf(bf16_hi(sw[2 * j + 1]) * xs16, fmaf(-bf16_hi(zw[2 * j + 1]), xf16, (float)sum[4 * j + 3]),
                          acc[4 * j + 3]);
  }
}

// acc (this lane's 16 columns; with FOLD_SPLIT 8 of its pair's) += sum over this warp's slab of the chunk in
// `slot` (rows [slab_begin*SLAB, slab_end*SLAB) of the matrix, columns col0..col0+TILE); x as int16 blocks (xi, xs).
// The binding pairs each word's nibbles (MK_PAIRED_NIBBLES): the word of columns c..c+3 of packed row r
// holds, byte by byte, (c, 2r) (c, 2r+1) (c+1, 2r) (c+1, 2r+1) in its low nibbles and the same of columns
// c+2, c+3 in its high ones. So one AND per half word lines up a column's two weights with the int16 pair
// (x[2r], x[2r+1]) for DP2A: the low nibbles as q, the high ones as 16q (scaled back in the fold). A lane
// sums its 16 columns over its 16 k of the slab in int32 (at most 16 * 15 * 2^14 * 16 < 2^31), and
// folds once: y += scale * xs * (sum q*xi - zero * sum xi), the zero point out exactly. With FOLD_SPLIT the
// two lanes of a column pair (the slab's even and odd rows) first swap half their sums, so each folds 8
// columns over all 32 k (twice the bound, still < 2^31): half the fold's instructions, and no float
// reduction across the halves in fold_chunk (~45 fewer of a chunk step's ~500 per warp, SASS). With HI_BY_SUB
// the high nibbles' DP2A read the whole bytes (q_lo + 16 q_hi, at most 255 * 2^14 * 32 < 2^31 after the
// swap) and the low nibbles' sums come off once per slab: 32 fewer LOP3, 8 more IADD per warp and slab.
__device__ void gemv_chunk(const unsigned char* slot, int N, int col0, int slab_begin, int slab_end,
                           const short* xi, const float* xs, float* acc) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int seg = lane & 15, par = lane >> 4;
  const int slab = slab_begin + warp;
  // Lanes past the tile's last column compute on whatever the slot holds there and fold nothing (FOLD_SPLIT:
  // they take part in the pair swaps, so every shuffle names the whole warp) or return here.
  const bool live = col0 + seg * 16 < N;
  if (slab >= slab_end || (!FOLD_SPLIT && !live)) return;
  const int row0 = slab * SLAB + par;             // this lane's rows: row0 + 2i
  const int gi = (slab * SLAB) / GROUP_ROWS - (slab_begin * SLAB) / GROUP_ROWS;
  const unsigned char* wp = slot + (size_t)(warp * SLAB + par) * TILE + seg * 16;
  uint4 w[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) w[i] = *reinterpret_cast<const uint4*>(wp + (size_t)(2 * i) * TILE);
  const uint4* sp = reinterpret_cast<const uint4*>(slot + RING_W_BYTES + gi * RING_G_BYTES + seg * 32);
  const uint4* zp = reinterpret_cast<const uint4*>(slot + RING_W_BYTES + (CHUNK_GROUPS + gi) * RING_G_BYTES + seg * 32);
  const uint4 sraw[2] = {sp[0], sp[1]}, zraw[2] = {zp[0], zp[1]};   // 16 scales, 16 zeros (bf16)
  const float x_scale = xs[slab];                 // a slab's k is one x block
  const int* xw = reinterpret_cast<const int*>(xi);
  int a[16];
#pragma unroll
  for (int j = 0; j < 16; ++j) a[j] = 0;
  int xsum = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int xp = xw[row0 + 2 * i];              // (x[2r], x[2r+1])
    xsum = dp2a_lo(xp, 0x0101u, xsum);
    const unsigned v[4] = {w[i].x, w[i].y, w[i].z, w[i].w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {   // columns 4j..4j+3: a[4j], a[4j+1] from the low nibbles, 16x a[4j+2], a[4j+3]
      const unsigned lo = v[j] & 0x0F0F0F0Fu, hi = HI_BY_SUB ? v[j] : v[j] & 0xF0F0F0F0u;
      a[4 * j + 0] = dp2a_lo(xp, lo, a[4 * j + 0]);
      a[4 * j + 1] = dp2a_hi(xp, lo, a[4 * j + 1]);
      a[4 * j + 2] = dp2a_lo(xp, hi, a[4 * j + 2]);
      a[4 * j + 3] = dp2a_hi(xp, hi, a[4 * j + 3]);
    }
  }
  if (HI_BY_SUB) {   // whole bytes summed: the high nibbles' sums are those less the low nibbles'
#pragma unroll
    for (int j = 0; j < 4; ++j) { a[4 * j + 2] -= a[4 * j + 0]; a[4 * j + 3] -= a[4 * j + 1]; }
  }
  if (FOLD_SPLIT) {   // the pair's halves add their sums exactly in int32: half `par` keeps columns 8par..8par+7
    const int xall = xsum + __shfl_xor_sync(0xffffffffu, xsum, 16);
    int t[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int keep = par ? a[8 + i] : a[i], give = par ? a[i] : a[8 + i];
      t[i] = keep + __shfl_xor_sync(0xffffffffu, give, 16);
    }
    if (!live) return;
    // word j of this half's scales / zeros holds its columns 2j, 2j+1
    const uint4 s4 = sp[par], z4 = zp[par];
    const unsigned sw[4] = {s4.x, s4.y, s4.z, s4.w}, zw[4] = {z4.x, z4.y, z4.z, z4.w};
    fold_columns<2>(acc, t, sw, zw, xall, x_scale);
    return;
  }
  // y[col] += scale * xs * (sum q*xi - zero * sum xi); word j of sraw/zraw holds columns 2j, 2j+1
  const unsigned sw[8] = {sraw[0].x, sraw[0].y, sraw[0].z, sraw[0].w, sraw[1].x, sraw[1].y, sraw[1].z, sraw[1].w};
  const unsigned zw[8] = {zraw[0].x, zraw[0].y, zraw[0].z, zraw[0].w, zraw[1].x, zraw[1].y, zraw[1].z, zraw[1].w};
  fold_columns<4>(acc, a, sw, zw, xsum, x_scale);
}

// Add this lane's column sums of one chunk into its warp's row of the unit's sums (`row`, this warp's
// own: no block barrier), then zero them. The first chunk of a (unit, matrix) stores instead. With
// FOLD_SPLIT each lane holds 8 whole columns; without, 16 columns of its half, added across the halves here.
__device__ void fold_chunk(float* acc, float* row, bool first) {
  const int lane = threadIdx.x & 31, seg = lane & 15, par = lane >> 4;
  constexpr int QUADS = FOLD_SPLIT ? 2 : 4;   // float4s of columns this lane writes
  if (!FOLD_SPLIT) {
#pragma unroll
    for (int i = 0; i < 16; ++i) acc[i] += __shfl_down_sync(0xffffffffu, acc[i], 16);
  }
  if (FOLD_SPLIT || par == 0) {
    float4* dst = reinterpret_cast<float4*>(row + seg * 16 + (FOLD_SPLIT ? 8 * par : 0));
#pragma unroll
    for (int i = 0; i < QUADS; ++i) {
      float4 v = make_float4(acc[4 * i], acc[4 * i + 1], acc[4 * i + 2], acc[4 * i + 3]);
      if (!first) {
        const float4 o = dst[i];
        v.x += o.x; v.y += o.y; v.z += o.z; v.w += o.w;
      }
      dst[i] = v;
    }
  }
#pragma unroll
  for (int i = 0; i < 16; ++i) acc[i] = 0.0f;
}

// sums[m*TILE + t] = sum over warps of the unit's per-warp rows (fixed order). The caller has passed
// a block barrier since the last fold_chunk.
__device__ void reduce_unit(const float* red, float* sums, int nm) {
  for (int t = threadIdx.x; t < nm * TILE; t += THREADS) {
    const int m = t / TILE, c = t % TILE;
    float v = 0.0f;
    for (int w = 0; w < WARPS; ++w) v += red[(m * WARPS + w) * TILE + c];
    sums[t] = v;
  }
  __syncthreads();
}

// ================================ jobs, units and epilogues ================================

enum Epi { EPI_RESIDUAL, EPI_PARTIALS, EPI_MOE_OUT, EPI_MLA_Q, EPI_MLA_KVA };
enum JobSet { JS_KDA_PROJECT, JS_KDA_OUT, JS_MLA_PROJECT, JS_MLA_OUT, JS_SHARED, JS_ROUTED, JS_DOWN };
__device__ void begin_phase(JobSet set, const struct Ctx& cx, const Smem& sm, bool ahead);
__device__ void job_table(JobSet set, const struct Ctx& cx, const Smem& sm, int skew = 0);

struct Mat {
  const unsigned char* wq;
  const bf16* sc;
  const bf16* zr;
};

// One int4 matrix (or a gate/up pair sharing x and columns) whose K is cut into `ksplit` slices.
struct Job {
  Mat m[2];
  int paired;
  int K, N, ksplit;
  int x_off;           // offset of this job's input in the staged x
  float weight;        // scales this job's accumulator adds (a routed expert's down projection)
  int nslots;          // K-slice arrivals that complete a tile
  float* part;         // [nslots][1 + paired][N] (null with acc)
  unsigned* count;     // [tiles(N)] arrival counters, reset by the last arrival
  int epi;
  unsigned long long* acc;   // EPI_RESIDUAL and EPI_MOE_OUT: the fixed-point accumulator [N] the units add into
  const unsigned* ready;   // null, or per 256-wide tile of the input: arrivals of its producer's units
  int ready_count;         // arrivals that complete an input tile (the producer's K slices)
  const float* gu_part;    // with `ready`: the producer's gate/up partials [ready_count][2][MOE_INTER];
                           // the input is their SwiGLU, staged unit by unit (x_off as in the staged x)
};

static_assert(N_SLOTS * sizeof(Job) <= JOBS_BYTES, "job table must fit its shared-memory area");

__device__ Mat mat_of(const QW& q) { return Mat{q.wq, q.sc, q.zr}; }
// Tile-major layout (the binding's, see abi.py): element (r, col) of a matrix with `rows` rows lies at
// ((col / TILE) * rows + r) * TILE + col % TILE; whole tiles, the last one zero-padded.
__device__ __forceinline__ size_t tm_offset(int rows, int r, int col) {
  return ((size_t)(col / TILE) * rows + r) * TILE + col % TILE;
}
__device__ Mat expert_mat(const QW& q, int e, int K, int N) {
  const size_t padded = (size_t)tiles_of(N) * TILE;
  return Mat{q.wq + (size_t)e * (K / 2) * padded, q.sc + (size_t)e * (K / QGROUP) * padded,
             q.zr + (size_t)e * (K / QGROUP) * padded};
}

__device__ Job make_job(Mat a, int K, int N, int ksplit, float* part, unsigned* count, int epi) {
  Job j;
  j.m[0] = a;
  j.m[1] = a;
  j.paired = 0;
  j.K = K;
  j.N = N;
  j.ksplit = ksplit;
  j.x_off = 0;
  j.weight = 1.0f;
  j.nslots = ksplit;
  j.part = part;
  j.count = count;
  j.epi = epi;
  j.acc = nullptr;
  j.ready = nullptr;
  j.ready_count = 0;
  j.gu_part = nullptr;
  return j;
}

__device__ int job_units(const Job& j) { return tiles_of(j.N) * j.ksplit; }

__device__ void slab_range(const Job& j, int split, int& s0, int& s1) {
  const int slabs = j.K / 2 / SLAB;
  s0 = split * slabs / j.ksplit;
  s1 = (split + 1) * slabs / j.ksplit;
}

// --- epilogues: block-wide, one output column per thread; `a`/`b` are the finished sums ---

__device__ float rope_rotate(float self, float partner, bool odd, int pair, const Ctx& cx) {
  const float ang = (float)cx.ctx_len * cx.p->rope_inv_freq[pair];
  const float cs = cosf(ang), sn = sinf(ang);
  return odd ? self * cs + partner * sn : self * cs - partner * sn;
}

__device__ void epilogue(const Job& jb, int tile, const Ctx& cx, const Smem& sm) {
  const int t = threadIdx.x;
  const int n = tile * TILE + t;
  const bool on = t < TILE && n < jb.N;
  const float* sums = sm.sums();
  if (on) {
    const float a = sums[t];
    switch (jb.epi) {
      case EPI_MLA_Q: {
        const int h = n / MLA_QK, d = n % MLA_QK;
        if (d < QK_NOPE) {
          cx.qn()[h * QK_NOPE + d] = bf16r(a);
        } else {
          const int r = d - QK_NOPE;
          cx.qr()[h * QK_ROPE + r] = bf16r(rope_rotate(bf16r(a), bf16r(sums[t ^ 1]), r & 1, r >> 1, cx));
        }
        break;
      }
      case EPI_MLA_KVA: {
        const size_t row = (size_t)cx.ctx_len;
        if (n < KV_LORA) {
          cx.L->c_kv[row * KV_LORA + n] = __float2bfloat16_rn(a);
        } else {
          const int r = n - KV_LORA;
          cx.L->k_rope[row * QK_ROPE + r] =
              __float2bfloat16_rn(rope_rotate(bf16r(a), bf16r(sums[t ^ 1]), r & 1, r >> 1, cx));
        }
        break;
      }
    }
  }
  __syncthreads();
}

// sums[m*TILE + t] = sum over the tile's partial slots (fixed order: deterministic). A thread owns 4
// columns of one matrix and every P-th slot, with SUM_BATCH loads in flight at a time (one batch covers
// SUM_BATCH * P slots, the MLA projections' at every KSPLIT_MLA value); the P per-thread sums are then
// added in order. Reading the slots one dependent batch at a time cost ~5 µs for 36 slots.
constexpr int SUM_BATCH = 10;
__device__ void sum_partials(const Job& jb, int col0, float* sums, float* red) {
  const int nm = 1 + jb.paired;
  constexpr int Q = TILE / 4;                   // float4 columns of one matrix
  const int P = THREADS / (nm * Q);             // slot phases
  const int q = threadIdx.x % Q, m = (threadIdx.x / Q) % nm, ph = threadIdx.x / (nm * Q);
  float4 tot = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (col0 + 4 * q < jb.N) {
    const float* base = jb.part + (size_t)m * jb.N + col0 + 4 * q;
    const size_t stride = (size_t)nm * jb.N;
    for (int s0 = ph; s0 < jb.nslots; s0 += SUM_BATCH * P) {
      float4 v[SUM_BATCH];
#pragma unroll
      for (int i = 0; i < SUM_BATCH; ++i) {
        const int s = s0 + i * P;
        v[i] = s < jb.nslots ? __ldcg(reinterpret_cast<const float4*>(base + (size_t)s * stride)) : tot;
      }
#pragma unroll
      for (int i = 0; i < SUM_BATCH; ++i)
        if (s0 + i * P < jb.nslots) { tot.x += v[i].x; tot.y += v[i].y; tot.z += v[i].z; tot.w += v[i].w; }
    }
  }
  reinterpret_cast<float4*>(red)[threadIdx.x] = tot;
  __syncthreads();
  for (int t = threadIdx.x; t < nm * TILE; t += THREADS) {
    const int mm = t / TILE, c = t % TILE;
    float v = 0.0f;
    for (int p = 0; p < P; ++p) v += red[4 * ((p * nm + mm) * Q + c / 4) + c % 4];
    sums[t] = v;
  }
  __syncthreads();
}

// A unit's arrival at its tile, after a block barrier: thread 0's acq_rel counter atomic (the release
// covers the block's writes through the barrier; the block barrier after it passes the acquire on).
// True, in every thread, for the tile's last arrival, which resets the counter for the next phase (its
// units are past a grid barrier).
__device__ bool last_arrival(const Job& jb, int tile, const Smem& sm) {
  if (threadIdx.x == 0) {
    const bool last = atomic_add_acq_rel(jb.count + tile, 1u) == (unsigned)(jb.nslots - 1);
    if (last) jb.count[tile] = 0u;
    *sm.flag() = last;
  }
  __syncthreads();
  return *sm.flag();
}

// The residual adds of the output and down projections: a unit adds its partial into the accumulator;
// with ACC_COUNT the add that completes a column's count finishes that column, otherwise the tile's last
// arrival loads each column's total and residual at once (one round trip, where the
// partial sums and then the residual took two), writes hidden_out = bf16(residual + bf16(total)) and
// zeroes the column for the next phase.
__device__ void finish_accumulated(const Job& jb, int tile, const Ctx& cx, const Smem& sm) {
  const int n = tile * TILE + threadIdx.x;
  const bool on = threadIdx.x < TILE && n < jb.N;
  if (ACC_COUNT) {   // the column's last add finishes it (only that unit writes hidden_out[n] in this phase)
    if (on) {
      bf16* const out = cx.p->hidden_out;   // loaded before the atomic, with the residual
      const float resid = ld_bf16((jb.epi == EPI_RESIDUAL ? cx.resid : out) + n);
      const unsigned long long now = acc_add_counted(jb.acc + n, sm.sums()[threadIdx.x] * jb.weight);
      if (acc_parts(now) == (unsigned long long)jb.nslots) {
        jb.acc[n] = 0ull;
        out[n] = __float2bfloat16_rn(resid + bf16r(acc_value(now)));
      }
    }
    return;
  }
  if (on) acc_add(jb.acc + n, sm.sums()[threadIdx.x] * jb.weight);
  __syncthreads();
  if (!last_arrival(jb, tile, sm)) return;
  if (on) {
    const float resid = ld_bf16((jb.epi == EPI_RESIDUAL ? cx.resid : cx.p->hidden_out) + n);
    const float total = acc_value(__ldcg(jb.acc + n));
    jb.acc[n] = 0ull;
    cx.p->hidden_out[n] = __float2bfloat16_rn(resid + bf16r(total));
  }
  __syncthreads();
}

// Publish this unit's partial; the last unit of the tile sums all partials and runs the epilogue.
// EPI_PARTIALS jobs stop at the arrival (relaxed, see PART_MARK; none where the consumer is past a grid
// barrier): their consumer sums the partials itself. The output and down projections (EPI_RESIDUAL, EPI_MOE_OUT)
// add into their accumulator instead: finish_accumulated.
__device__ void finish_unit(const Job& jb, int tile, int split, const Ctx& cx, const Smem& sm) {
  if (jb.epi == EPI_RESIDUAL || jb.epi == EPI_MOE_OUT) {
    finish_accumulated(jb, tile, cx, sm);
    return;
  }
  const int nm = 1 + jb.paired;
  float* sums = sm.sums();
  const int col0 = tile * TILE;
  const bool relaxed = jb.epi == EPI_PARTIALS && jb.count;   // gate/up partials, read in this phase
  for (int t = threadIdx.x; t < TILE; t += THREADS)
    if (col0 + t < jb.N)
      for (int m = 0; m < nm; ++m) {
        float* dst = jb.part + ((size_t)split * nm + m) * jb.N + col0 + t;
        if (relaxed) st_relaxed(dst, published(sums[m * TILE + t]));
        else *dst = sums[m * TILE + t];
      }
  __syncthreads();
  if (jb.epi == EPI_PARTIALS) {
    if (threadIdx.x == 0 && jb.count) atomicAdd(jb.count + tile, 1u);   // relaxed: may run ahead of the stores
    return;
  }
  if (!last_arrival(jb, tile, sm)) return;
  sum_partials(jb, col0, sums, sm.red());
  epilogue(jb, tile, cx, sm);
}

// ---- the weight stream: a block's units in order, each unit's matrices, each matrix in chunks ----

// Job of unit u; `rem` becomes the unit's index inside that job.
__device__ int job_of(const Job* jobs, int u, int& rem) {
  int j = 0;
  rem = u;
  while (rem >= job_units(jobs[j])) { rem -= job_units(jobs[j]); ++j; }
  return j;
}

__device__ Chunk unit_chunk(const Job* jobs, int total, int u) {
  Chunk c{u, 0, 0u, 0u};
  if (u >= total) return c;
  int rem, s0, s1;
  const int j = job_of(jobs, u, rem);
  const int split = rem % jobs[j].ksplit;
  c.place = rem / jobs[j].ksplit | split << 16;
  slab_range(jobs[j], split, s0, s1);
  c.slab = s0;
  c.bits = j | (s0 << 6) | (s1 << 16);
  return c;
}

__device__ Chunk next_chunk(const Job* jobs, int total, Chunk c) {
  if (c.m() < jobs[c.job()].paired) { c.bits |= 32u; return c; }   // a pair alternates its matrices, so
  c.bits &= ~32u;                                                   // both are in flight from the start
  c.slab += CHUNK_SLABS;
  return c.slab < c.s1() ? c : unit_chunk(jobs, total, c.unit + gridDim.x);
}

// The chunk's packed rows and the scales and zeros of the groups it touches into `slot`: three bulk
// copies (each contiguous in the tile-major layout), issued in parallel by lane 0 of warps 0-2 (one
// copy each: an issue takes ~0.2 µs), each arriving on the slot's mbarrier with its byte count.
__device__ __forceinline__ bool ring_issuer() { return (threadIdx.x & 31) == 0 && threadIdx.x < 32 * RING_COPIES; }
__device__ void issue_chunk(const Job* jobs, const Chunk& c, const Smem& sm, int slot) {
  const Job& jb = jobs[c.job()];
  const Mat& mt = jb.m[c.m()];
  const int tile = c.tile();
  const int row0 = c.slab * SLAB, rows = (min(c.slab + CHUNK_SLABS, c.s1()) - c.slab) * SLAB;
  const int g0 = row0 / GROUP_ROWS, ng = (row0 + rows - 1) / GROUP_ROWS - g0 + 1;
  const unsigned w_bytes = rows * TILE, g_bytes = ng * RING_G_BYTES;
  const size_t g_off = ((size_t)tile * (jb.K / QGROUP) + g0) * TILE;
  unsigned char* dst = sm.ring(slot);
  unsigned long long* bar = &sm.rs->bar[slot];
  const int piece = threadIdx.x >> 5;
  const unsigned bytes = piece == 0 ? w_bytes : g_bytes;
  expect_bytes(bar, bytes);
  if (piece == 0) {
    bulk_copy(dst, mt.wq + ((size_t)tile * (jb.K / 2) + row0) * TILE, bytes, bar);
    ++sm.rs->fills[slot];
  } else {
    bulk_copy(dst + RING_W_BYTES + (piece - 1) * CHUNK_GROUPS * RING_G_BYTES, (piece == 1 ? mt.sc : mt.zr) + g_off,
              bytes, bar);
  }
}

// Put this block's first two chunks of `jobs` in flight (slots 0 and 1). Called before the barrier
// that precedes the phase (the next phase's weights are known) or at the start of the phase. Most
// blocks have at most two chunks per phase: their whole share lands while the grid synchronises.
__device__ __noinline__ void issue_first(const Job* jobs, const Smem sm) {
  ring_wait(sm.rs, 0);   // a fill never read (a phase skipped by a profiling switch) must land first
  ring_wait(sm.rs, 1);
  __syncthreads();       // both slots are free: every earlier use of shared memory is over
  if (ring_issuer()) {
    // Other phases write this memory through the generic proxy; the async-proxy copies must come after.
    // (A refill in run_jobs needs no fence: its slot has only been read since the last bulk copy.)
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    const int total = sm.rs->total;
    const Chunk c0 = unit_chunk(jobs, total, (blockIdx.x + gridDim.x - sm.rs->skew) % gridDim.x);
    if (threadIdx.x == 0) sm.rs->head = c0;
    if (c0.unit < total) {
      issue_chunk(jobs, c0, sm, 0);
      const Chunk c1 = next_chunk(jobs, total, c0);
      if (c1.unit < total) issue_chunk(jobs, c1, sm, 1);
    }
  }
  __syncthreads();       // the fill counts are visible to every waiter
}

// x[off + k0, off + k0 + n) <- silu(gate) * up as int16 blocks, gate and up each the sum of `parts` K-slice
// partials ([parts][2][MOE_INTER]) in slot order (deterministic). One (matrix, 4 columns) item per
// thread with SUM_BATCH loads in flight, each loaded again while it holds PART_MARK; the sums meet in
// `red`, free between a block's units.
__device__ void stage_swiglu(const float* part, int parts, int k0, int n, const Smem& sm, int off) {
  float* sums = sm.red();
  const int q4 = n / 4;
  for (int i = threadIdx.x; i < 2 * q4; i += THREADS) {
    const int m = i / q4, c = 4 * (i % q4);
    const float* src = part + (size_t)m * MOE_INTER + k0 + c;
    float4 tot = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int s0 = 0; s0 < parts; s0 += SUM_BATCH) {
      float4 v[SUM_BATCH];
#pragma unroll
      for (int j = 0; j < SUM_BATCH; ++j)
        v[j] = s0 + j < parts ? ld_relaxed4(src + (size_t)(s0 + j) * 2 * MOE_INTER) : tot;
      for (bool again = true; again;) {   // a partial whose arrival ran ahead of it: load it again
        again = false;
#pragma unroll
        for (int j = 0; j < SUM_BATCH; ++j)
          if (s0 + j < parts && unlanded(v[j])) {
            v[j] = ld_relaxed4(src + (size_t)(s0 + j) * 2 * MOE_INTER);
            again = true;
          }
      }
#pragma unroll
      for (int j = 0; j < SUM_BATCH; ++j)
        if (s0 + j < parts) { tot.x += v[j].x; tot.y += v[j].y; tot.z += v[j].z; tot.w += v[j].w; }
    }
    *reinterpret_cast<float4*>(sums + m * n + c) = tot;
  }
  __syncthreads();
  for (int k = threadIdx.x; k < n; k += THREADS) {   // n and k0 + off are whole blocks: a warp holds one
    const float y = silu(sums[k]) * sums[n + k];
    unsigned top = abs_bits(y);
#pragma unroll
    for (int o = 1; o < XBLK; o <<= 1) top = max(top, __shfl_xor_sync(0xffffffffu, top, o));
    float xs;
    const float inv = x_block_scale(top, &xs);
    if (k % XBLK == 0) sm.xs()[(off + k0 + k) / XBLK] = xs;
    sm.xi()[off + k0 + k] = (short)x_int16_bits(y, inv);
  }
  __syncthreads();
}

// A unit whose input arrives during the phase: one thread per input tile its K slice reads waits until
// every K slice of that tile has arrived (relaxed), then the block stages its slice from the producer's
// partials, which stage_swiglu checks have landed.
// The caller has passed a block barrier since the block last read x or `red`.
__device__ void await_input(const Job& jb, const Chunk& c, const Smem& sm) {
  const int k0 = c.s0() * 2 * SLAB, k1 = c.s1() * 2 * SLAB;
  const int t = k0 / TILE + threadIdx.x;   // one thread per input tile, side by side
  if (t <= (k1 - 1) / TILE)
    while (ld_relaxed(jb.ready + t) < (unsigned)jb.ready_count) {}
  __syncthreads();
  stage_swiglu(jb.gu_part, jb.ready_count, k0, k1 - k0, sm, jb.x_off);
}

// Run this block's units from the head chunk issue_first recorded (its first two chunks are in flight
// already) over the job table in shared memory (job_table recorded its unit count). Chunk i is
// computed from slot i % 2 while chunk i+1 lands in the other; chunk i+2 refills the slot as soon as
// every warp has read it, before chunk i's unit is reduced and published.
__device__ __noinline__ void run_jobs(const Job* jobs, const Ctx cx, const Smem sm) {
  const int total = sm.rs->total;
  float acc[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) acc[i] = 0.0f;
  int slot = 0, k = phase_chunks();   // k: the chunk's number in the phase (stamps only)
  Chunk c = sm.rs->head;
  Chunk nx = c.unit < total ? next_chunk(jobs, total, c) : c;
  for (; c.unit < total; slot ^= 1, ++k) {
    ring_wait(sm.rs, slot);
    if (k == 0) mark(cx, EV_FIRST_CHUNK);
    mark_chunk(cx, k, CH_LANDED);
    const Job& jb = jobs[c.job()];
    const int tile = c.tile(), split = c.split();
    if (jb.ready && c.slab == c.s0() && c.m() == 0) await_input(jb, c, sm);
    gemv_chunk(sm.ring(slot), jb.N, tile * TILE, c.slab, min(c.slab + CHUNK_SLABS, c.s1()), sm.xi() + jb.x_off,
               sm.xs() + jb.x_off / XBLK, acc);
    fold_chunk(acc, sm.red() + (c.m() * WARPS + (threadIdx.x >> 5)) * TILE, c.slab == c.s0());
    const Chunk nn = nx.unit < total ? next_chunk(jobs, total, nx) : nx;
    __syncthreads();   // the slot is read, the folds are visible
    mark_chunk(cx, k, CH_READ);
    if (ring_issuer() && nn.unit < total) issue_chunk(jobs, nn, sm, slot);
    mark_chunk(cx, k, CH_ISSUED);
    if (nx.unit != c.unit) {
      reduce_unit(sm.red(), sm.sums(), 1 + jb.paired);
      mark(cx, EV_COMPUTED);
      finish_unit(jb, tile, split, cx, sm);
    }
    c = nx;
    nx = nn;
  }
  set_phase_chunks(k);
  mark(cx, EV_DONE);
}

// bf16 rows (nn.Linear weights, out x in): out[r] = f(bf16(W[r] . x)), one warp per row, run by the
// last blocks of the grid (they get the fewest GEMV units).
__device__ void dense_rows(const bf16* W, int rows, const __half* xh, float* out, bool apply_sigmoid) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int gw = (gridDim.x - 1 - blockIdx.x) * WARPS + warp;
  constexpr int ITERS = (HIDDEN + 255) / 256;
  for (int r = gw; r < rows; r += gridDim.x * WARPS) {
    uint4 raw[ITERS];
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {   // every load of the row in flight before the first use
      const int k = lane * 8 + it * 256;
      raw[it] = k < HIDDEN ? __ldcs(reinterpret_cast<const uint4*>(W + (size_t)r * HIDDEN + k)) : make_uint4(0, 0, 0, 0);
    }
    float s = 0.0f;
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
      const int k = lane * 8 + it * 256;
      if (k >= HIDDEN) continue;
      float wv[8];
      unpack8(raw[it], wv);
#pragma unroll
      for (int i = 0; i < 8; ++i) s += wv[i] * __half2float(xh[k + i]);
    }
    s = warp_sum(s);
    if (lane == 0) out[r] = apply_sigmoid ? sigmoid(bf16r(s)) : bf16r(s);
  }
}

// ================================ phases ================================

// KDA: the q, k, v, g projections as partials (the delta rule sums them and applies the conv, SiLU
// and log decay itself: no tile finish on this phase's critical path), beta.
__device__ Job kda_project_job(const Ctx& cx, int m) {
  return make_job(mat_of(cx.L->proj[m]), HIDDEN, C_KDA, KSPLIT_KDA, cx.kda_part() + (size_t)m * KSPLIT_KDA * C_KDA,
                  nullptr, EPI_PARTIALS);
}

// `ahead`: the first weight chunks were issued before the barrier (here and in every GEMV phase below).
// The input is staged before begin_phase. (With bulk copies, issuing first in the step's first phase
// looked ~5 µs faster in one measurement that was not of this exact kernel: see BENCHMARKS.md.)
__device__ void kda_project(const Ctx& cx, const Smem& sm, bool ahead) {
  stage_rmsnorm(cx.resid, cx.L->attn_norm, sm);
  begin_phase(JS_KDA_PROJECT, cx, sm, ahead);
  mark(cx, EV_STAGED);
  dense_rows(cx.L->beta_w, KDA_H, sm.xh(), cx.beta(), true);
  run_jobs(sm.jobs(), cx, sm);
}

// Column n of KDA projection `which` (q, k, v, g) for this token: the bf16 sum of its K-slice partials.
__device__ float kda_projected(const Ctx& cx, int which, int n) {
  const float* part = cx.kda_part() + (size_t)which * KSPLIT_KDA * C_KDA + n;
  float y = 0.0f;
#pragma unroll
  for (int s = 0; s < KSPLIT_KDA; ++s) y += __ldcg(part + (size_t)s * C_KDA);
  return bf16r(y);
}

// The delta rule's input at column n of `which`: q, k, v through the causal conv over the window
// (oldest row first) and this token, then SiLU; g becomes the log decay. The window itself moves on
// in shift_conv_windows, after every reader.
__device__ float kda_input(const Ctx& cx, int which, int n) {
  if (which == 3) return -softplus(kda_projected(cx, 3, n));
  const bf16* win = cx.L->conv_state[which];
  const bf16* w = cx.L->conv_w + ((size_t)which * C_KDA + n) * CONV_K;
  float acc = 0.0f;
#pragma unroll
  for (int j = 0; j < CONV_K - 1; ++j) acc += ld_bf16(win + (size_t)j * C_KDA + n) * __bfloat162float(w[j]);
  acc += kda_projected(cx, which, n) * __bfloat162float(w[CONV_K - 1]);
  return bf16r(silu(acc));
}

// The conv windows after this token: q, k and v each drop their oldest row and append the projection
// output. Run a grid barrier after the delta rule (the windows' only readers), by the blocks that
// compute no router logits in that phase.
constexpr int ROUTER_BLOCKS = (N_EXPERTS + WARPS - 1) / WARPS;   // dense_rows' last blocks, one warp per row
__device__ void shift_conv_windows(const Ctx& cx) {
  const int blocks = gridDim.x - ROUTER_BLOCKS;
  for (int i = blockIdx.x * THREADS + threadIdx.x; blockIdx.x < blocks && i < 3 * C_KDA; i += blocks * THREADS) {
    const int which = i / C_KDA, n = i % C_KDA;
    bf16* win = cx.L->conv_state[which];
    float hist[CONV_K - 2];
#pragma unroll
    for (int j = 0; j < CONV_K - 2; ++j) hist[j] = ld_bf16(win + (size_t)(j + 1) * C_KDA + n);
    const float y = kda_projected(cx, which, n);
#pragma unroll
    for (int j = 0; j < CONV_K - 2; ++j) win[(size_t)j * C_KDA + n] = __float2bfloat16_rn(hist[j]);
    win[(size_t)(CONV_K - 2) * C_KDA + n] = __float2bfloat16_rn(y);
  }
}

// KDA gated delta rule on (head, 16-column slice): S <- S*exp(g); S += beta k (v - S^T k); o = S^T q.
// A unit first works out its head's q, k, g and its columns' v from the projection partials (every
// unit of a head the same values), with its S loads already in flight.
__device__ void kda_delta(const Ctx& cx, const Smem& sm) {
  constexpr int DS = 16, RG = THREADS / DS, RPT = KDA_D / RG;
  const float qscale = 1.0f / sqrtf((float)KDA_D);
  const int jl = threadIdx.x % DS, rg = threadIdx.x / DS;
  float* red = sm.red();            // [RG][DS] + [DS]
  float* q = red + RG * DS + DS;    // the head's q, k, g [KDA_D] each, then the unit's v [DS]
  float* k = q + KDA_D;
  float* g = k + KDA_D;
  float* v = g + KDA_D;
  for (int u = blockIdx.x; u < KDA_H * (KDA_D / DS); u += gridDim.x) {
    const int h = u / (KDA_D / DS), j0 = (u % (KDA_D / DS)) * DS, j = j0 + jl;
    float* S = cx.L->S + (size_t)h * KDA_D * KDA_D;
    float sv[RPT];
#pragma unroll
    for (int m = 0; m < RPT; ++m) sv[m] = __ldcg(S + (size_t)(rg + m * RG) * KDA_D + j);
    for (int i = threadIdx.x; i < 3 * KDA_D + DS; i += THREADS) {   // q, k, g rows of the head, v columns
      const int part = i / KDA_D;
      q[i] = part < 3 ? kda_input(cx, part == 2 ? 3 : part, h * KDA_D + i % KDA_D)
                      : kda_input(cx, 2, h * KDA_D + j0 + i - 3 * KDA_D);
    }
    __syncthreads();
    float pred = 0.0f;
#pragma unroll
    for (int m = 0; m < RPT; ++m) {
      const int i = rg + m * RG;
      sv[m] *= expf(g[i]);
      pred += sv[m] * k[i];
    }
    red[rg * DS + jl] = pred;
    __syncthreads();
    if (rg == 0) {
      float p = 0.0f;
      for (int r = 0; r < RG; ++r) p += red[r * DS + jl];
      red[RG * DS + jl] = __ldcg(cx.beta() + h) * (v[jl] - p);
    }
    __syncthreads();
    const float upd = red[RG * DS + jl];
    float o = 0.0f;
#pragma unroll
    for (int m = 0; m < RPT; ++m) {
      const int i = rg + m * RG;
      const float sn = sv[m] + k[i] * upd;
      S[(size_t)i * KDA_D + j] = sn;
      o += sn * (q[i] * qscale);
    }
    __syncthreads();
    red[rg * DS + jl] = o;
    __syncthreads();
    if (rg == 0) {
      float s = 0.0f;
      for (int r = 0; r < RG; ++r) s += red[r * DS + jl];
      cx.attn_o()[h * KDA_D + j] = bf16r(s);
    }
    __syncthreads();
  }
}

// Attention output projection plus the first residual add (hidden_out = resid + o W_o).
static_assert(KSPLIT_O <= ACC_MAX_PARTS && N_SLOTS * KSPLIT_DOWN <= ACC_MAX_PARTS, "fixed-point accumulator headroom");
__device__ Job out_proj_job(const Ctx& cx, int slot, int K) {
  Job jb = make_job(mat_of(cx.L->proj[slot]), K, HIDDEN, KSPLIT_O, nullptr, cx.counters, EPI_RESIDUAL);
  jb.acc = cx.acc();
  return jb;
}

// The K range [k0, k1) that covers every unit of this block in the phase's job table, as issue_first
// deals them (k0 >= k1: none).
__device__ void block_k_range(const Job* jobs, const RingSync* rs, int& k0, int& k1) {
  k0 = 1 << 30;
  k1 = 0;
  for (int u = (blockIdx.x + gridDim.x - rs->skew) % gridDim.x; u < rs->total; u += gridDim.x) {
    int rem, s0, s1;
    const int j = job_of(jobs, u, rem);
    slab_range(jobs[j], rem % jobs[j].ksplit, s0, s1);
    k0 = min(k0, jobs[j].x_off + s0 * 2 * SLAB);
    k1 = max(k1, jobs[j].x_off + s1 * 2 * SLAB);
  }
}

// A unit reads only its K slice of o (~150 of 4096 at KSPLIT_O 28), so a block stages only its units'
// slices, once the job table is known. Every block staging all of o (16 KB of the same lines) cost each
// of these phases ~0.5 µs (1.011x against the control, H100; BENCHMARKS.md 2026-12-07).
__device__ void attn_out_proj(const Ctx& cx, const Smem& sm, bool ahead) {
  const bool mla = is_mla_layer(cx.layer);
  begin_phase(mla ? JS_MLA_OUT : JS_KDA_OUT, cx, sm, ahead);
  int k0, k1;
  block_k_range(sm.jobs(), sm.rs, k0, k1);
  stage_floats(cx.attn_o(), k0, k1, sm);
  mark(cx, EV_STAGED);
  run_jobs(sm.jobs(), cx, sm);
}

// MLA: q (+RoPE on the rope half), kv_a -> latent row and roped key appended at row ctx_len.
__device__ Job mla_project_job(const Ctx& cx, int j) {
  if (j == 0) return make_job(mat_of(cx.L->proj[0]), HIDDEN, MLA_Q_N, KSPLIT_MLA, cx.splitk(), cx.counters, EPI_MLA_Q);
  return make_job(mat_of(cx.L->proj[1]), HIDDEN, KVA_N, KSPLIT_MLA, cx.splitk() + (size_t)KSPLIT_MLA * MLA_Q_N,
                  cx.counters + tiles_of(MLA_Q_N), EPI_MLA_KVA);
}

__device__ void mla_project(const Ctx& cx, const Smem& sm, bool ahead) {
  stage_rmsnorm(cx.resid, cx.L->attn_norm, sm);
  begin_phase(JS_MLA_PROJECT, cx, sm, ahead);
  mark(cx, EV_STAGED);
  run_jobs(sm.jobs(), cx, sm);
}

// Int4 row of W_kv_b for the absorbs: 16 columns at `col` of packed row r (latent indices 2r, 2r+1) and
// the scales and zeros of its group. Every load is independent, so a lane has them all in flight at once.
struct AbsorbRow {
  unsigned v[4];
  float s[16], z[16];
  __device__ void load(const QW& W, int r, int col) {
    const uint4 wv = __ldcs(reinterpret_cast<const uint4*>(W.wq + tm_offset(KV_LORA / 2, r, col)));
    const size_t gcol = tm_offset(KV_LORA / QGROUP, r / GROUP_ROWS, col);
    unpack8(__ldg(reinterpret_cast<const uint4*>(W.sc + gcol)), s);
    unpack8(__ldg(reinterpret_cast<const uint4*>(W.sc + gcol + 8)), s + 8);
    unpack8(__ldg(reinterpret_cast<const uint4*>(W.zr + gcol)), z);
    unpack8(__ldg(reinterpret_cast<const uint4*>(W.zr + gcol + 8)), z + 8);
    v[0] = wv.x; v[1] = wv.y; v[2] = wv.z; v[3] = wv.w;
  }
  // paired nibbles (gemv_chunk): column i's weight for latent 2r at bit 16 (i & 1) + 4 ((i >> 1) & 1) of its
  // word, the one for 2r + 1 eight bits above
  __device__ static int shift(int i) { return 16 * (i & 1) + 4 * ((i >> 1) & 1); }
  __device__ float lo(int i) const { return (float)((v[i / 4] >> shift(i)) & 0xfu); }
  __device__ float hi(int i) const { return (float)((v[i / 4] >> (shift(i) + 8)) & 0xfu); }
};

// Columns col and col + 1 (col even) of head h's q = [q_eff | q_rope] into q's attention fragments:
// m16n8k16 A registers, rows g and g + 8 (heads), columns 2c and 2c + 8 of a k step, each as a bf16 pair.
__device__ void store_q_pair(const Ctx& cx, int h, int col, float x, float y) {
  const int row = h % ATT_HG, within = col % 16;
  const int lane = 4 * (row % 8) + (within % 8) / 2, reg = row / 8 + 2 * (within / 8);
  const __nv_bfloat162 q = __floats2bfloat162_rn(x, y);
  cx.qfrag()[(((size_t)(h / ATT_HG) * Q_KSTEPS + col / 16) * 32 + lane) * 4 + reg] = *reinterpret_cast<const unsigned*>(&q);
}

// q_eff[h][c] = sum_d q_nope[h][d] W_kv_b[c, h*KVB_HEAD + d]   (absorbs W_uk into the query).
// Units are (head, part of the latent rows), so the grid shares the work and each unit is one round
// trip: a lane loads its q slice, its weight row and its group's scales together. q_eff and q_rope go
// out as the attention's fragments (store_q_pair); the blocks past the units (counted from the grid's
// end) convert q_rope.
__device__ __noinline__ void mla_absorb_q(const Ctx cx) {
  constexpr int LPR = QK_NOPE / 16, RPS = 32 / LPR;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, seg = lane % LPR;
  const QW& W = cx.L->proj[2];
  for (int i = (gridDim.x - 1 - blockIdx.x) * THREADS + threadIdx.x; i < MLA_H * QK_ROPE / 2; i += gridDim.x * THREADS) {
    const int h = i / (QK_ROPE / 2), col = 2 * (i % (QK_ROPE / 2));
    const float2 v = __ldcg(reinterpret_cast<const float2*>(cx.qr() + h * QK_ROPE + col));
    store_q_pair(cx, h, KV_LORA + col, v.x, v.y);
  }
  for (int u = blockIdx.x; u < MLA_H * ABSORB_PARTS; u += gridDim.x) {
    const int h = u / ABSORB_PARTS, part = u % ABSORB_PARTS;
    const int col = h * KVB_HEAD + seg * 16;
    for (int it = warp; it < ABSORB_ROWS / RPS; it += WARPS) {
      const int r = part * ABSORB_ROWS + it * RPS + lane / LPR;
      AbsorbRow w;
      w.load(W, r, col);
      float q[16];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float4 f = __ldcg(reinterpret_cast<const float4*>(cx.qn() + h * QK_NOPE + seg * 16) + i);
        q[4 * i] = f.x; q[4 * i + 1] = f.y; q[4 * i + 2] = f.z; q[4 * i + 3] = f.w;
      }
      float a[16], zs = 0.0f;
#pragma unroll
      for (int i = 0; i < 16; ++i) { a[i] = w.s[i] * q[i]; zs += w.z[i] * a[i]; }
      float lo = -zs, hi = -zs;
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        lo += w.lo(i) * a[i];
        hi += w.hi(i) * a[i];
      }
#pragma unroll
      for (int o = 1; o < LPR; o <<= 1) {
        lo += __shfl_xor_sync(0xffffffffu, lo, o);
        hi += __shfl_xor_sync(0xffffffffu, hi, o);
      }
      if (seg == 0) store_q_pair(cx, h, 2 * r, lo, hi);
    }
  }
}

// Context split of MLA attention: each split is a whole number of ATT_TT-token tiles (a split of
// 129 tokens cost a fifth 32-token tile for one token), as many splits as the grid holds units.
__device__ int attn_split_tokens(int tokens) {
  const int by_grid = imax(1, (int)gridDim.x / (MLA_H / ATT_HG));
  const int tiles = (tokens + ATT_TT - 1) / ATT_TT;
  const int want = min(ATTN_MAX_SPLITS, min(by_grid, tiles));
  return (tiles + want - 1) / want * ATT_TT;
}
__device__ int attn_splits(int tokens) {
  const int per = attn_split_tokens(tokens);
  return (tokens + per - 1) / per;
}
__device__ int attn_units(int tokens) { return attn_splits(tokens) * (MLA_H / ATT_HG); }

// ---- tensor-core helpers (mma.sync m16n8k16, bf16 in, fp32 accumulate) ----
__device__ __forceinline__ void mma_bf16(float* d, const unsigned* a, unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ unsigned lds32(const bf16* p) { return *reinterpret_cast<const unsigned*>(p); }
// A fragment of a row-major 16 x 16 bf16 tile at `t` (row stride `ld`): rows g, g+8; columns 2c, 2c+8.
__device__ __forceinline__ void load_a(unsigned* a, const bf16* t, int ld) {
  const int g = (threadIdx.x & 31) >> 2, c = threadIdx.x & 3;
  a[0] = lds32(t + g * ld + 2 * c);
  a[1] = lds32(t + (g + 8) * ld + 2 * c);
  a[2] = lds32(t + g * ld + 2 * c + 8);
  a[3] = lds32(t + (g + 8) * ld + 2 * c + 8);
}
// B fragment (16 x 8, k x n) of a bf16 tile stored n-major ([n][k], stride `ld`), as the cache rows are for scores.
__device__ __forceinline__ void load_b_nk(unsigned& b0, unsigned& b1, const bf16* t, int ld) {
  const int g = (threadIdx.x & 31) >> 2, c = threadIdx.x & 3;
  b0 = lds32(t + g * ld + 2 * c);
  b1 = lds32(t + g * ld + 2 * c + 8);
}
// B fragment of a bf16 tile stored k-major ([k][n], stride `ld`), as the cache rows are for P*V: ldmatrix.trans.
__device__ __forceinline__ void load_b_kn(unsigned& b0, unsigned& b1, const bf16* t, int ld) {
  const int l = threadIdx.x & 15;   // lanes 0-7: rows k 0-7, lanes 8-15: rows k 8-15 (16-31 mirror them)
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(t + l * ld));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];" : "=r"(b0), "=r"(b1) : "r"(addr));
}
// Tokens [tt, tt + ATT_TT) of the latent cache and the roped keys into `keys`, one row per token (its
// latent row, then its roped key), by the TMA engine on the weight ring's mbarrier of `buf` (the ring is
// idle in the attention): lanes 0-15 of warps 0 and 1 copy a latent row each (1 KB), the lanes of warp 2
// a roped key each (128 B); lane 0 of each of the three arrives with its warp's bytes. The 16-byte
// cp.async they replace had every thread issue a share, and that issue is throttled to about the rate
// the data drains (the ring's measurement). With bulk copies a tile past the first takes ~3.3 µs at 16K
// instead of ~3.9, and the step is 1.008x faster there on an H100, noise at 2K and 8K (BENCHMARKS.md,
// 2026-12-06). Rows at or past t1 are zeroed through the generic proxy instead, so P is 0 there and
// nothing undefined enters the MMAs; they are read after at least one block barrier.
__device__ __forceinline__ bool key_issuer() { return threadIdx.x < 32 * RING_COPIES; }
__device__ void issue_key_tile(const Ctx& cx, const Smem& sm, bf16* keys, int buf, int tt, int t1) {
  static_assert(RING_COPIES == 3 && ATT_TT == 32, "three issuing warps: two latent halves, one roped half");
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const bool rope = warp == 2;
  const int per_warp = rope ? ATT_TT : ATT_TT / 2, l = rope ? lane : 16 * warp + lane;
  const unsigned row_bytes = rope ? 2 * QK_ROPE : 2 * KV_LORA;
  unsigned long long* bar = &sm.rs->bar[buf];
  const int first = rope ? 0 : 16 * warp, valid = max(0, min(per_warp, t1 - tt - first));
  if (lane == 0) {
    expect_bytes(bar, valid * row_bytes);
    if (warp == 0) ++sm.rs->fills[buf];
  }
  __syncwarp();
  if (lane >= per_warp) return;
  bf16* dst = keys + l * KEY_STRIDE + (rope ? KV_LORA : 0);
  if (tt + l < t1) {
    bulk_copy(dst, rope ? cx.L->k_rope + (size_t)(tt + l) * QK_ROPE : cx.L->c_kv + (size_t)(tt + l) * KV_LORA, row_bytes, bar);
  } else {
#pragma unroll 1
    for (unsigned i = 0; i < row_bytes; i += 16) *reinterpret_cast<uint4*>(reinterpret_cast<unsigned char*>(dst) + i) = make_uint4(0, 0, 0, 0);
  }
}

// A unit's first tile into buffer 0, after a block barrier: every earlier use of this shared memory is over.
// Generic writes must come before the async copies, in shared memory (other phases) and in global memory
// (the new cache row, stored by the MLA projection's epilogue): one proxy fence for both, after the grid
// barrier that published that row; the unit's later tiles are issued by the same threads after it.
__device__ void issue_first_key_tile(const Ctx& cx, const Smem& sm, int t0, int t1) {
  if (key_issuer()) {
    asm volatile("fence.proxy.async.global;\n\tfence.proxy.async.shared::cta;" ::: "memory");
    issue_key_tile(cx, sm, reinterpret_cast<bf16*>(sm.base + SA_KEY), 0, t0, t1);
  }
}
// q's A fragments of head group `group` at k step `ks` (store_q_pair's layout): one 16-byte load per
// lane. Rows past ATT_HG (fewer than 16 heads) are never written: zero. Read as fp32 and converted per
// block, with four 8-byte loads per k step, q was staged 1.6 µs later at 2K and 2.3 at 16K; copies of q
// (fewer blocks per line) gained nothing more (H100, BENCHMARKS.md 2026-12-06).
__device__ void q_fragments(const Ctx& cx, int group, int ks, unsigned* a) {
  const int lane = threadIdx.x & 31, g = lane >> 2;
  const uint4 q = __ldcg(reinterpret_cast<const uint4*>(cx.qfrag() + (((size_t)group * Q_KSTEPS + ks) * 32 + lane) * 4));
  a[0] = q.x; a[1] = q.y; a[2] = q.z; a[3] = q.w;
  if (g >= ATT_HG) a[0] = a[2] = 0u;
  if (g + 8 >= ATT_HG) a[1] = a[3] = 0u;
}

// Split-context attention over the latent cache (absorbed form) on tensor cores, ATT_HG (16) heads
// per unit, online softmax. Per 32-token tile: scores = [q_eff | q_rope] . [c_kv | k_rope] as
// 16 x 32 MMAs (every warp all 4 token n-tiles over its own k steps, q's fragments held in registers
// for the whole unit: re-read from shared memory per tile by 4 warps each, they made the score loop
// shared-memory bound), softmax with one warp per head, then ctx += P . c_kv (each warp owns
// KV_LORA / WARPS columns, accumulators in registers). Cache tiles land by bulk copies in a double buffer:
// tile i + 1 is in flight while tile i is computed. q and p enter rounded to bf16, as upstream's bf16
// path has them: as high + low bf16 pairs (two MMAs each, ~16 bits) the attention took 2.3 µs longer at
// 16K, with the same output error against the fp32 reference (BENCHMARKS.md 2026-12-07); the scalar
// FP32 version of this phase was arithmetic bound (172 µs at 16K). Writes per (split, head): running max
// m, sum l, and the unnormalised context sum_l p_l c_kv[l]. Not inlined: in the kernel body its registers
// (q fragments, P.V accumulators) competed with every other phase's, and the output and KDA projections ran
// ~1 µs slower each.
__device__ __noinline__ void mla_attention(const Ctx cx, const Smem sm) {
  constexpr int NPW = KV_LORA / 8 / WARPS;               // P*V n-tiles per warp
  constexpr int KSTEPS = Q_KSTEPS;
  constexpr int KS_W = (KSTEPS + WARPS - 1) / WARPS;     // score k steps per warp: warp + WARPS * i
  constexpr int HPW = (ATT_HG + WARPS - 1) / WARPS;      // softmax heads per warp
  const float scale = MLA_SCALE;
  bf16* key_buf = reinterpret_cast<bf16*>(sm.base + SA_KEY);
  float* sc = reinterpret_cast<float*>(sm.base + SA_SC);
  bf16* ph = reinterpret_cast<bf16*>(sm.base + SA_PH);
  float* stat = reinterpret_cast<float*>(sm.base + SA_STAT);   // m[16], l[16], alpha[16]
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, c = lane & 3;
  const int tokens = cx.ctx_len + 1;
  const int per = attn_split_tokens(tokens);
  const int units = attn_units(tokens);
  for (int u = blockIdx.x; u < units; u += gridDim.x) {
    const int split = u / (MLA_H / ATT_HG), h0 = (u % (MLA_H / ATT_HG)) * ATT_HG;
    const int t0 = split * per, t1 = min(tokens, t0 + per);
    __syncthreads();   // see issue_first_key_tile
    issue_first_key_tile(cx, sm, t0, t1);
    unsigned qa[KS_W][4];   // [k step][fragment register]
#pragma unroll
    for (int i = 0; i < KS_W; ++i)
      if (i < KSTEPS / WARPS || warp + WARPS * i < KSTEPS) q_fragments(cx, h0 / ATT_HG, warp + WARPS * i, qa[i]);
    for (int i = threadIdx.x; i < 16 * P_STRIDE; i += THREADS) ph[i] = __float2bfloat16_rn(0.0f);
    if (threadIdx.x < 16) { stat[threadIdx.x] = NEG_INF; stat[16 + threadIdx.x] = 0.0f; stat[32 + threadIdx.x] = 1.0f; }
    float acc[NPW][4];
#pragma unroll
    for (int j = 0; j < NPW; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    __syncthreads();   // the first tile's zeroed rows, if any, and the ring's fill count are seen by all
    mark(cx, EV_STAGED);
    for (int tt = t0, buf = 0; tt < t1; tt += ATT_TT, buf ^= 1) {
      const bf16* keys = key_buf + buf * (KEY_TILE_BYTES / 2);
      // the next tile lands in the other buffer during this one's MMAs; its buffer was last read before the
      // previous tile's closing block barrier (only read since its last fill: no proxy fence needed)
      if (tt + ATT_TT < t1 && key_issuer()) issue_key_tile(cx, sm, key_buf + (buf ^ 1) * (KEY_TILE_BYTES / 2), buf ^ 1, tt + ATT_TT, t1);
      ring_wait(sm.rs, buf);   // each thread sees this tile's bytes land; no block barrier needed for them
      const int tile_no = (tt - t0) / ATT_TT;   // stamps: landed, scores done (as "read"), softmax done (as "issued")
      if (tt == t0) mark(cx, EV_FIRST_CHUNK);
      mark_chunk(cx, tile_no, CH_LANDED);
      {   // scores: 16 heads x 32 tokens over this warp's k steps, four independent chains (token n-tiles)
        float part[ATT_TT / 8][4] = {};
#pragma unroll
        for (int i = 0; i < KS_W; ++i) {
          const int k0 = (warp + WARPS * i) * 16;
          if (i < KSTEPS / WARPS || k0 < ATT_K) {
#pragma unroll
            for (int nt = 0; nt < ATT_TT / 8; ++nt) {
              unsigned b0, b1;
              load_b_nk(b0, b1, keys + nt * 8 * KEY_STRIDE + k0, KEY_STRIDE);
              mma_bf16(part[nt], qa[i], b0, b1);
            }
          }
        }
        float* out = sc + warp * 16 * SC_STRIDE + 2 * c;
#pragma unroll
        for (int nt = 0; nt < ATT_TT / 8; ++nt) {
          *reinterpret_cast<float2*>(out + g * SC_STRIDE + nt * 8) = make_float2(part[nt][0], part[nt][1]);
          *reinterpret_cast<float2*>(out + (g + 8) * SC_STRIDE + nt * 8) = make_float2(part[nt][2], part[nt][3]);
        }
      }
      __syncthreads();
      mark_chunk(cx, tile_no, CH_READ);
      {   // online softmax, lane = token; a warp's heads side by side, so their shuffle chains overlap
        float s[HPW], m_old[HPW], m_new[HPW], pr[HPW], psum[HPW];
#pragma unroll
        for (int j = 0; j < HPW; ++j) {
          const int hh = min(warp + j * WARPS, ATT_HG - 1);   // a clamped duplicate is computed, never stored
          s[j] = NEG_INF;
          if (tt + lane < t1) {
            s[j] = 0.0f;
#pragma unroll
            for (int w = 0; w < WARPS; ++w) s[j] += sc[(w * 16 + hh) * SC_STRIDE + lane];
            s[j] *= scale;
          }
          m_old[j] = stat[hh];
        }
#pragma unroll
        for (int j = 0; j < HPW; ++j) m_new[j] = fmaxf(m_old[j], warp_max(s[j]));
#pragma unroll
        for (int j = 0; j < HPW; ++j) {
          pr[j] = s[j] == NEG_INF ? 0.0f : expf(s[j] - m_new[j]);
          psum[j] = warp_sum(pr[j]);
        }
        __syncwarp();   // every lane has read stat before lane 0 rewrites it
#pragma unroll
        for (int j = 0; j < HPW; ++j) {
          const int hh = warp + j * WARPS;
          if (hh < ATT_HG) {
            ph[hh * P_STRIDE + lane] = __float2bfloat16_rn(pr[j]);
            if (lane == 0) {
              const float alpha = expf(m_old[j] - m_new[j]);
              stat[32 + hh] = alpha;
              stat[16 + hh] = stat[16 + hh] * alpha + psum[j];
              stat[hh] = m_new[j];
            }
          }
        }
      }
      __syncthreads();
      mark_chunk(cx, tile_no, CH_ISSUED);
      const float al_g = stat[32 + g], al_g8 = stat[32 + g + 8];
#pragma unroll
      for (int j = 0; j < NPW; ++j) { acc[j][0] *= al_g; acc[j][1] *= al_g; acc[j][2] *= al_g8; acc[j][3] *= al_g8; }
#pragma unroll
      for (int k0 = 0; k0 < ATT_TT; k0 += 16) {
        unsigned a[4];
        load_a(a, ph + k0, P_STRIDE);
#pragma unroll
        for (int j = 0; j < NPW; ++j) {
          unsigned b0, b1;
          load_b_kn(b0, b1, keys + k0 * KEY_STRIDE + (warp * NPW + j) * 8, KEY_STRIDE);
          mma_bf16(acc[j], a, b0, b1);
        }
      }
      __syncthreads();   // the tiles are read; the next token tile may overwrite them
    }
    mark(cx, EV_COMPUTED);
    // (m, l, ctx) of the unit's heads are staged in the tiles' buffers, then leave as one contiguous run of
    // 16-byte stores (whole lines): each warp's float2 stores straight to global memory touched 8 rows per
    // instruction and took 2.6 µs at 2K and 3.6 at 16K from the last tile computed; staged, 1.5 and 2.1
    // (H100, BENCHMARKS.md 2026-12-06).
    float* part = cx.apart() + ((size_t)split * MLA_H + h0) * APART_STRIDE;
    float* out = reinterpret_cast<float*>(sm.base + SA_KEY);
    if (threadIdx.x < ATT_HG) {
      out[threadIdx.x * APART_STRIDE] = stat[threadIdx.x];
      out[threadIdx.x * APART_STRIDE + 1] = stat[16 + threadIdx.x];
    }
#pragma unroll
    for (int j = 0; j < NPW; ++j) {
      const int col = 2 + (warp * NPW + j) * 8 + 2 * c;
      if (g < ATT_HG) *reinterpret_cast<float2*>(out + g * APART_STRIDE + col) = make_float2(acc[j][0], acc[j][1]);
      if (g + 8 < ATT_HG) *reinterpret_cast<float2*>(out + (g + 8) * APART_STRIDE + col) = make_float2(acc[j][2], acc[j][3]);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < ATT_HG * (int)APART_STRIDE / 4; i += THREADS)
      reinterpret_cast<float4*>(part)[i] = reinterpret_cast<const float4*>(out)[i];
    __syncthreads();
    mark(cx, EV_DONE);
  }
}

// The sum over a unit's row warps of column d of o[h]'s part (`red`, [ROW_WARPS][V_HEAD]).
constexpr int MERGE_ROW_WARPS = ABSORB_ROWS / (32 / (V_HEAD / 16)) < WARPS ? ABSORB_ROWS / (32 / (V_HEAD / 16)) : WARPS;
__device__ float merge_part_column(const float* red, int d) {
  float v = 0.0f;
  for (int w = 0; w < MERGE_ROW_WARPS; ++w) v += red[w * V_HEAD + d];
  return v;
}

// ACC_COUNT: each part adds into o[h]'s counted fixed-point words; the add that completes a column's count
// writes it (as finish_accumulated does): one atomic round trip, no partials to store and load again. Its
// closing block barrier is not needed (a next unit of this block writes red only past four); it stays because
// the measured build had it (BENCHMARKS.md, forty-fourth session).
__device__ void merge_finish_counted(const Ctx& cx, int h, const float* red) {
  for (int d = threadIdx.x; d < V_HEAD; d += THREADS) {
    unsigned long long* a = cx.merge_acc() + h * V_HEAD + d;
    const unsigned long long now = acc_add_counted(a, merge_part_column(red, d));
    if (acc_parts(now) == (unsigned long long)ABSORB_PARTS) {
      *a = 0ull;
      cx.attn_o()[h * V_HEAD + d] = bf16r(acc_value(now));
    }
  }
  __syncthreads();
}

// Unit (h, part) stores its partial of o[h]; the part that arrives last (arrival counter) sums them in part order.
__device__ void merge_finish_parts(const Ctx& cx, int h, int part, const float* red, int* last) {
  float* opart = cx.splitk();   // [ABSORB_PARTS][MLA_H][V_HEAD]
  unsigned* count = cx.counters + CNT_MERGE;
  for (int d = threadIdx.x; d < V_HEAD; d += THREADS) opart[((size_t)part * MLA_H + h) * V_HEAD + d] = merge_part_column(red, d);
  __syncthreads();
  if (threadIdx.x == 0) {   // publish as finish_unit does: block barrier, then the counter
    const bool done = atomic_add_acq_rel(count + h, 1u) == ABSORB_PARTS - 1;
    if (done) count[h] = 0u;
    *last = done;
  }
  __syncthreads();
  if (*last)
    for (int d = threadIdx.x; d < V_HEAD; d += THREADS) {
      float v = 0.0f;
      for (int p = 0; p < ABSORB_PARTS; ++p) v += __ldcg(opart + ((size_t)p * MLA_H + h) * V_HEAD + d);
      cx.attn_o()[h * V_HEAD + d] = bf16r(v);
    }
  __syncthreads();
}

// Merge the context splits of each head, then o[h] = ctx[h] W_uv (absorbs the value up-projection).
// Units are (head, part of the latent columns): a unit merges its ctx slice over every split and
// multiplies it by the matching W_uv rows, and its part of o[h] goes into counted fixed-point words (ACC_COUNT;
// otherwise the last part of a head to finish adds the stored parts in a fixed order). One block per head
// used to read every split's whole context serially.
// A unit's latent pairs of every split are loaded with the splits' m and l, before the weights are known:
// after them, 129 splits (8K, 16K) took two round trips for one thread in eight (16K: -1.3 µs, H100).
__device__ __noinline__ void mla_merge_absorb_v(const Ctx cx, const Smem sm) {
  constexpr int LPR = V_HEAD / 16, RPS = 32 / LPR, PAIRS = ABSORB_ROWS, PH = THREADS / PAIRS;
  constexpr int ROW_WARPS = MERGE_ROW_WARPS;
  static_assert(THREADS % PAIRS == 0 && (ABSORB_ROWS % RPS) == 0, "merge thread split");
  float* wts = reinterpret_cast<float*>(sm.base);   // per split: weight exp(m_s - M), after its max
  float* msum = wts + ATTN_MAX_SPLITS;              // per split: sum-exp
  float* ctx = msum + ATTN_MAX_SPLITS;              // [2 * PAIRS] merged latent slice
  float2* acc2 = reinterpret_cast<float2*>(ctx + 2 * PAIRS);   // [PH][PAIRS]
  float* red = reinterpret_cast<float*>(acc2 + PH * PAIRS);    // [ROW_WARPS][V_HEAD]
  float* tot = red + ROW_WARPS * V_HEAD;
  int* last = reinterpret_cast<int*>(tot + 1);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, seg = lane % LPR;
  const int nsplit = attn_splits(cx.ctx_len + 1);
  const QW& W = cx.L->proj[2];
  constexpr int EARLY = 17;   // splits a thread loads at the unit's start: PH x 17 = 136 >= a 264-block grid's 132
  static_assert(ABSORB_PARTS <= ACC_MAX_PARTS, "merge accumulator headroom");
  for (int u = blockIdx.x; u < MLA_H * ABSORB_PARTS; u += gridDim.x) {
    const int h = u / ABSORB_PARTS, part = u % ABSORB_PARTS;
    const int pair = threadIdx.x % PAIRS, ph = threadIdx.x / PAIRS;
    const float2* src = reinterpret_cast<const float2*>(cx.apart() + (size_t)h * APART_STRIDE + 2) + part * PAIRS + pair;
    const int col = h * KVB_HEAD + QK_NOPE + seg * 16;
    float2 x[EARLY];   // this part's latent pairs of every PH-th split, in flight with the splits' m and l
#pragma unroll
    for (int i = 0; i < EARLY; ++i) {
      const int s = ph + i * PH;
      x[i] = s < nsplit ? __ldcg(src + (size_t)s * MLA_H * APART_STRIDE / 2) : make_float2(0.0f, 0.0f);
    }
    for (int s = threadIdx.x; s < nsplit; s += THREADS) {
      const float* pt = cx.apart() + ((size_t)s * MLA_H + h) * APART_STRIDE;
      wts[s] = __ldcg(pt);
      msum[s] = __ldcg(pt + 1);
    }
    __syncthreads();
    if (warp == 0) {
      float M = NEG_INF;
      for (int s = lane; s < nsplit; s += 32) M = fmaxf(M, wts[s]);
      M = warp_max(M);
      float L = 0.0f;
      for (int s = lane; s < nsplit; s += 32) {
        wts[s] = wts[s] == NEG_INF ? 0.0f : expf(wts[s] - M);
        L += wts[s] * msum[s];
      }
      L = warp_sum(L);
      if (lane == 0) *tot = L;
    }
    __syncthreads();
    {   // thread (ph, pair) sums its splits' pairs, weighted
      float2 v = make_float2(0.0f, 0.0f);
#pragma unroll
      for (int i = 0; i < EARLY; ++i)
        if (ph + i * PH < nsplit) { v.x += wts[ph + i * PH] * x[i].x; v.y += wts[ph + i * PH] * x[i].y; }
      for (int s = ph + EARLY * PH; s < nsplit; s += PH) {   // more splits (a larger grid): a round trip each
        const float2 y = __ldcg(src + (size_t)s * MLA_H * APART_STRIDE / 2);
        v.x += wts[s] * y.x; v.y += wts[s] * y.y;
      }
      acc2[ph * PAIRS + pair] = v;
    }
    __syncthreads();
    if (threadIdx.x < PAIRS) {
      float2 v = make_float2(0.0f, 0.0f);
      for (int p = 0; p < PH; ++p) { v.x += acc2[p * PAIRS + threadIdx.x].x; v.y += acc2[p * PAIRS + threadIdx.x].y; }
      ctx[2 * threadIdx.x] = v.x / *tot;
      ctx[2 * threadIdx.x + 1] = v.y / *tot;
    }
    __syncthreads();
    float acc[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) acc[i] = 0.0f;
    for (int it = warp; it < ABSORB_ROWS / RPS; it += WARPS) {
      const int rl = it * RPS + lane / LPR;   // packed row inside the part
      AbsorbRow w;
      w.load(W, part * ABSORB_ROWS + rl, col);
      const float x0 = ctx[2 * rl], x1 = ctx[2 * rl + 1];
#pragma unroll
      for (int i = 0; i < 16; ++i) acc[i] += w.s[i] * ((w.lo(i) - w.z[i]) * x0 + (w.hi(i) - w.z[i]) * x1);
    }
#pragma unroll
    for (int i = 0; i < 16; ++i)
      for (int o = LPR; o < 32; o <<= 1) acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], o);
    if (warp < ROW_WARPS && lane < LPR)
      for (int i = 0; i < 16; ++i) red[warp * V_HEAD + seg * 16 + i] = acc[i];
    __syncthreads();
    if constexpr (ACC_COUNT) merge_finish_counted(cx, h, red);
    else merge_finish_parts(cx, h, part, red, last);
  }
}

// MoE routing from the bf16 router logits: softmax in fp32, top-k (ties to the lower index),
// weights renormalised and scaled. Every block computes it redundantly (no barrier needed). Three
// block barriers: warp 0 holds the logits (softmax statistics by shuffles); RANK_PARTS threads per
// expert count its rank over interleaved slices (unrolled, shuffled together); the k selected lanes
// renormalise in parallel, each adding the weights in index order. The one-thread-per-expert rank
// loop and a serial renormalisation made routing ~2.5 µs of the gate/up phase's critical path.
constexpr int RANK_PARTS = THREADS / N_EXPERTS >= 4 ? 4 : THREADS / N_EXPERTS >= 2 ? 2 : 1;
__device__ void route(const Ctx& cx, const Smem& sm) {
  constexpr int PER_LANE = (N_EXPERTS + 31) / 32, PER_PART = (N_EXPERTS + RANK_PARTS - 1) / RANK_PARTS;
  const int t = threadIdx.x, lane = t & 31;
  float* lg = sm.logits();
  float* prob = lg + N_EXPERTS;   // softmax probability of each expert
  if (t < N_ACTIVE) { sm.sel_e()[t] = 0; sm.sel_w()[t] = 0.0f; }   // NaN logits must not index out of range
  if (t < 32) {
    float v[PER_LANE];
    float mx = NEG_INF;
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) {
      const int e = lane + 32 * i;
      v[i] = e < N_EXPERTS ? __ldcg(cx.logits() + e) : NEG_INF;
      mx = fmaxf(mx, v[i]);
    }
    mx = warp_max(mx);
    float ex[PER_LANE], sum = 0.0f;
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) {
      ex[i] = lane + 32 * i < N_EXPERTS ? expf(v[i] - mx) : 0.0f;
      sum += ex[i];
    }
    const float denom = warp_sum(sum);
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) {
      const int e = lane + 32 * i;
      if (e < N_EXPERTS) { lg[e] = v[i]; prob[e] = ex[i] / denom; }
    }
  }
  __syncthreads();
  const int e = t / RANK_PARTS, part = t % RANK_PARTS;
  const float mine = e < N_EXPERTS ? lg[e] : 0.0f;
  int rank = 0;
#pragma unroll
  for (int i = 0; i < PER_PART; ++i) {
    const int j = part + i * RANK_PARTS;
    if (e < N_EXPERTS && j < N_EXPERTS) {
      const float lj = lg[j];
      rank += (lj > mine) || (lj == mine && j < e);
    }
  }
#pragma unroll
  for (int o = 1; o < RANK_PARTS; o <<= 1) rank += __shfl_xor_sync(0xffffffffu, rank, o);   // every lane takes part
  if (e < N_EXPERTS && part == 0 && rank < N_ACTIVE) { sm.sel_e()[rank] = e; sm.sel_w()[rank] = prob[e]; }
  __syncthreads();
  if (t < 32) {
    const float mine = t < N_ACTIVE ? sm.sel_w()[t] : 0.0f;
    float tot = 0.0f;
#pragma unroll
    for (int j = 0; j < N_ACTIVE; ++j) tot += sm.sel_w()[j];
    __syncwarp();
    if (t < N_ACTIVE) sm.sel_w()[t] = mine / (tot + 1e-9f) * ROUTED_SCALING;
  }
  __syncthreads();
}

// Expert slot j (routed experts 0..N_ACTIVE-1, then the shared ones): its gate/up K slices, where
// their partials lie ([slices][2][MOE_INTER]) and the per-tile counters their arrivals add to.
__device__ int gate_up_slices(int j) { return j < N_ACTIVE ? KSPLIT_GU : KSPLIT_SHARED; }
__device__ float* gate_up_partials(const Ctx& cx, int j) {
  const int before = j < N_ACTIVE ? N_SHARED * KSPLIT_SHARED + j * KSPLIT_GU : (j - N_ACTIVE) * KSPLIT_SHARED;
  return cx.splitk() + (size_t)before * 2 * MOE_INTER;
}

// Gate/up pair of slot j; no epilogue: the down units sum the partials and apply SwiGLU as they stage.
__device__ Job paired_job(const Ctx& cx, Mat gate, Mat up, int j) {
  Job jb = make_job(gate, HIDDEN, MOE_INTER, gate_up_slices(j), gate_up_partials(cx, j),
                    cx.counters + CNT_GATE_UP + j * tiles_of(MOE_INTER), EPI_PARTIALS);
  jb.m[1] = up;
  jb.paired = 1;
  return jb;
}

// Shared experts' gate/up (slot N_ACTIVE + s). They run in the routed phase, as its first jobs: their
// units belong to the grid's first SHARED_UNITS blocks whatever the routing, so those blocks put their
// chunks in flight at the barrier before the router phase.
constexpr int SHARED_UNITS = N_SHARED * tiles_of(MOE_INTER) * KSPLIT_SHARED;
__device__ Job shared_job(const Ctx& cx, int s) {
  return paired_job(cx, expert_mat(cx.L->shared[0], s, HIDDEN, MOE_INTER), expert_mat(cx.L->shared[1], s, HIDDEN, MOE_INTER),
                    N_ACTIVE + s);
}

// Router logits (bf16 rows, on the grid's last blocks). The staged x stays in shared memory for the
// routed phase that follows; the ring keeps the shared experts' first chunks (issued before this
// phase) untouched.
__device__ void moe_router(const Ctx& cx, const Smem& sm) {
  // The gate/up arrival counters: the last layer's down units are past a grid barrier, this layer's
  // gate/up units come after the next one.
  if (blockIdx.x == 0 && threadIdx.x < N_SLOTS * tiles_of(MOE_INTER)) cx.counters[CNT_GATE_UP + threadIdx.x] = 0u;
  const float m = __uint_as_float(PART_MARK);   // every gate/up partial not landed yet (its last readers are
  float4* part = reinterpret_cast<float4*>(cx.splitk());   // past a grid barrier; its writers past the next one)
  for (size_t i = (size_t)blockIdx.x * THREADS + threadIdx.x; i < GU_PART_FLOATS / 4; i += (size_t)gridDim.x * THREADS)
    part[i] = make_float4(m, m, m, m);
  stage_rmsnorm(cx.p->hidden_out, cx.L->moe_norm, sm);
  dense_rows(cx.L->router_w, N_EXPERTS, sm.xh(), cx.logits(), false);
}

// The shared experts, then one paired job per selected routed expert (needs route()).
__device__ Job routed_job(const Ctx& cx, const Smem& sm, int j) {
  if (j < N_SHARED) return shared_job(cx, j);
  const int r = j - N_SHARED, e = sm.sel_e()[r];
  return paired_job(cx, expert_mat(cx.L->expert[0], e, HIDDEN, MOE_INTER), expert_mat(cx.L->expert[1], e, HIDDEN, MOE_INTER), r);
}

// Routed and shared experts' gate/up partials. The routed experts are known only after
// routing, so only the shared units' first chunks could be issued ahead: a shared unit is a gate/up
// pair, so both of its first two chunks belong to it, as they do in this phase's full table. The
// input is not staged again: the router phase left rmsnorm(hidden) * moe_norm in this block's x.
__device__ void moe_routed_gate_up(const Ctx& cx, const Smem& sm) {
  route(cx, sm);
  job_table(JS_ROUTED, cx, sm);
  if (!PREFETCH || blockIdx.x >= SHARED_UNITS) issue_first(sm.jobs(), sm);
  mark(cx, EV_STAGED);
  run_jobs(sm.jobs(), cx, sm);
}

// Down projections of every routed (weighted) and shared expert into one reduction, then the
// second residual add. Needs this block's routing in shared memory (route() in the gate/up phase).
__device__ Job down_job(const Ctx& cx, const Smem& sm, int j) {
  const bool routed = j < N_ACTIVE;
  const Mat m = routed ? expert_mat(cx.L->expert[2], sm.sel_e()[j], MOE_INTER, HIDDEN)
                       : expert_mat(cx.L->shared[2], j - N_ACTIVE, MOE_INTER, HIDDEN);
  Job jb = make_job(m, MOE_INTER, HIDDEN, KSPLIT_DOWN, nullptr, cx.counters, EPI_MOE_OUT);
  jb.acc = cx.acc();
  jb.x_off = j * MOE_INTER;
  jb.ready = cx.counters + CNT_GATE_UP + j * tiles_of(MOE_INTER);
  jb.ready_count = gate_up_slices(j);
  jb.gu_part = gate_up_partials(cx, j);
  jb.weight = routed ? sm.sel_w()[j] : 1.0f;
  jb.nslots = N_SLOTS * KSPLIT_DOWN;
  return jb;
}

// Right after this block's gate/up units, no grid barrier between: each down unit waits for the
// gate/up tiles its K slice reads (await_input) and stages only their SwiGLU; its first chunks are in
// flight meanwhile. The routing computed in the gate/up phase is still in this block's shared memory.
// The down units start on the block after the last one that ran an extra gate/up unit (324 units on
// 264 blocks: blocks 0-59 ran two), so those blocks are the last to get one (blocks 39-59 get none):
// 1.004x-1.015x in three H100 runs (BENCHMARKS.md, thirty-second session; the wait at the MoE phase's
// barrier fell from 1.3-1.6 to 0.7-1.1 µs).
__device__ void moe_down_residual(const Ctx& cx, const Smem& sm) {
  const int busy = sm.rs->total % gridDim.x;   // the grid's first blocks ran one more gate/up unit
  job_table(JS_DOWN, cx, sm, busy);
  issue_first(sm.jobs(), sm);
  run_jobs(sm.jobs(), cx, sm);
}

__device__ int job_count(JobSet set) {
  constexpr int sizes[] = {4, 1, 2, 1, N_SHARED, N_SHARED + N_ACTIVE, N_SLOTS};
  return sizes[set];
}

// A phase's job table in shared memory (local-memory tables cost an L2 round trip per read once
// shared memory has taken most of L1), one job per thread: built serially by one thread it cost
// ~0.3 µs per job on the critical path. The jobs' threads are in warp 0, which adds up their units. Its
// first unit goes to block `skew` (the down table's, past the blocks that ran an extra gate/up unit).
static_assert(N_SLOTS <= 32, "a phase's jobs fit in one warp");
__device__ void job_table(JobSet set, const Ctx& cx, const Smem& sm, int skew) {
  const int j = threadIdx.x, n = job_count(set);
  __syncthreads();   // earlier readers of the table are done
  int units = 0;
  if (j < n) {
    Job jb;
    switch (set) {
      case JS_KDA_PROJECT: jb = kda_project_job(cx, j); break;
      case JS_KDA_OUT: jb = out_proj_job(cx, 4, C_KDA); break;
      case JS_MLA_PROJECT: jb = mla_project_job(cx, j); break;
      case JS_MLA_OUT: jb = out_proj_job(cx, 3, MLA_O_K); break;
      case JS_SHARED: jb = shared_job(cx, j); break;
      case JS_ROUTED: jb = routed_job(cx, sm, j); break;
      case JS_DOWN: jb = down_job(cx, sm, j); break;
    }
    sm.jobs()[j] = jb;
    units = job_units(jb);
  }
  if (j < 32) {
    const int total = __reduce_add_sync(0xffffffffu, units);
    if (j == 0) { sm.rs->total = total; sm.rs->skew = skew; }
  }
  __syncthreads();
}

// Build the phase's job table and put its first chunks in flight, unless the previous phase already
// did both before the barrier (`ahead`).
__device__ void begin_phase(JobSet set, const Ctx& cx, const Smem& sm, bool ahead) {
  if (ahead) return;
  job_table(set, cx, sm);
  issue_first(sm.jobs(), sm);
}

// ================================ the schedule ================================

__device__ Ctx layer_ctx(const KimiParams& p, int l) {
  Ctx cx;
  cx.p = &p;
  cx.L = &p.layer[l];
  cx.resid = l == 0 ? p.hidden_in : p.hidden_out;
  cx.scratch = reinterpret_cast<float*>(p.scratch);
  cx.counters = p.counters;
  cx.ctx_len = p.ctx_len;
  cx.layer = l;
  return cx;
}

// Put the next phase's first weight chunks in flight (weights do not depend on activations).
__device__ void prefetch(JobSet set, const Ctx& cx, const Smem& sm) {
  if (PREFETCH) begin_phase(set, cx, sm, false);
}

// Grid barrier in two halves (the cooperative launch guarantees every block is resident). arrive()
// publishes the block's writes and counts it in; wait() returns once every block has arrived. The
// next phase's prefetch runs in between: issuing two chunks stalls a block for ~3.5 µs (cp.async
// issue is throttled by the memory system), which used to delay its arrival, often on the critical
// path. The counter's top bit flips once per barrier (block 0 adds 2^31 - (blocks - 1), the others
// 1), so the low bits stay 0 from the zeroed buffer on and nothing is ever reset.
// With PHASE_STAMPS each block records when it arrived and when it was released.
struct Barrier {
  unsigned* count;
  unsigned long long* stamps;
  int n;
  unsigned seen;   // thread 0: the counter before this block's arrival
  __device__ void stamp() {
    if (PHASE_STAMPS && threadIdx.x == 0 && n < MAX_STAMPS && blockIdx.x < MAX_STAMP_BLOCKS)
      stamps[(size_t)n * MAX_STAMP_BLOCKS + blockIdx.x] = global_ns();
    ++n;
#if PHASE_STAMPS >= 2
    if (threadIdx.x == 0) { sync_area.stamp_phase = n / 2; sync_area.stamp_chunks = 0; }   // after a release: the phase that begins
#endif
  }
  __device__ void arrive() {
    stamp();
    __syncthreads();
    if (threadIdx.x == 0) seen = atomic_add_release(count, blockIdx.x == 0 ? 0x80000000u - (gridDim.x - 1) : 1u);
  }
  __device__ void wait() {
    if (threadIdx.x == 0)
      while (((seen ^ ld_acquire(count)) & 0x80000000u) == 0) {}
    __syncthreads();
    stamp();
  }
  __device__ void sync() { arrive(); wait(); }
  __device__ void sync(JobSet next, const Ctx& cx, const Smem& sm) { arrive(); prefetch(next, cx, sm); wait(); }
};

extern "C" __global__ void __launch_bounds__(THREADS, BLOCKS_PER_SM)
kimi_decode_step(const __grid_constant__ KimiParams p) {
  Barrier grid{p.counters + BARRIER_WORD, reinterpret_cast<unsigned long long*>(reinterpret_cast<float*>(p.scratch) + OFF_STAMPS), 0, 0};
  grid.stamp();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const Smem sm{smem_raw, &sync_area.rs};
  ring_init(sm.rs);
#pragma unroll 1
  for (int l = 0; l < NUM_LAYERS; ++l) {
    const Ctx cx = layer_ctx(p, l);
    const bool attn = !SKIP_ATTN, moe = !SKIP_MOE;   // profiling switches (-DSKIP_...=1), never knobs
    const bool ahead = PREFETCH && l > 0;             // the previous layer issued this layer's first chunks
    if (is_mla_layer(l)) {
      if (attn) mla_project(cx, sm, ahead);       grid.sync();   // q (+RoPE), cache row append (+RoPE)
      if (attn) mla_absorb_q(cx);                 grid.sync();   // q_eff = W_uk^T q_nope
      if (attn) mla_attention(cx, sm);            grid.sync();   // per-split softmax partials
      if (attn) mla_merge_absorb_v(cx, sm);       grid.sync(JS_MLA_OUT, cx, sm);   // merge splits, o = ctx W_uv
    } else {
      if (attn) kda_project(cx, sm, ahead);       grid.sync();   // q, k, v, g partials, beta
      if (attn) kda_delta(cx, sm);                grid.sync(JS_KDA_OUT, cx, sm);   // conv, decay; S update, o = S^T q
    }
    if (attn) attn_out_proj(cx, sm, PREFETCH);    grid.sync(JS_SHARED, cx, sm);    // hidden = x + o W_o
    if (moe) moe_router(cx, sm);                                 // router logits
    if (attn && !is_mla_layer(l)) shift_conv_windows(cx);       grid.sync();   // (KDA) conv windows move on
    if (moe) moe_routed_gate_up(cx, sm);                         // top-k; shared and routed gate/up, then
    if (moe) moe_down_residual(cx, sm);                          // hidden += sum_e w_e down_e
    if (l + 1 < NUM_LAYERS) grid.sync(is_mla_layer(l + 1) ? JS_MLA_PROJECT : JS_KDA_PROJECT, layer_ctx(p, l + 1), sm);
  }
  grid.stamp();
}
