// The tensor pipe's rate for the dequant GEMV's shape of work (issue 28, step 1): how many fp16 A elements
// (int4 weights once unpacked) an SM consumes per cycle through mma.sync m16n8k16, and through Hopper's
// wgmma m64nNk16 with A in registers and B in shared memory, for N = 8, 16, 32 and 64.
//
// Why: scripts/tc_gemv_probe.cu's mma.sync loop ran at 1.06 µs per chunk step on the H200 against the seed's
// 1.45 (1.37x), not the 2.5-3.2x predicted. Its issue rate is below half, so the HMMA rate bounds it:
// 128 m16n8k16 per sub-partition per chunk step in ~2,100 cycles is ~16 cycles each, where the prediction
// assumed 7-8. A GEMV gives each weight one use (N = 8 columns carry 8 quant groups), so what counts is
// A elements per cycle, and wgmma is the only other tensor path for 16-bit activations.
//
// Kernels (grid: SMs x 2 blocks x 256 threads, as the seed; each thread's operands are live registers and the
// results are written out, so nothing is optimized away; the data are arbitrary, the rate does not depend
// on them):
//   mma_sync_rate   each warp issues `iters` x 8 independent m16n8k16 (8 accumulators hide the latency)
//   wgmma_rate<N>   each warpgroup issues `iters` x 2 batches of 16 wgmma m64nNk16 (A from registers, B a
//                   16 x N tile in shared memory, no swizzle), the two batches into two accumulator sets, so
//                   one drains while the next issues (commit per batch, wait_group 1)
// Each block also records clock64 over its loop, so the driver reports the SM clock it ran at.
//
// Build check: nvcc -arch=sm_90a -cubin -Xptxas -v scripts/mma_rate_probe.cu. Run: python3 scripts/mma_rate_probe.py
// (NVRTC, -arch=sm_90a: wgmma needs the architecture-specific target).

constexpr int THREADS = 256;

// fp16 pairs in [1, 2): varied per lane, never Inf or NaN (random bits made the first H200 run's sums non-finite)
__device__ __forceinline__ unsigned lane_bits(int i) {
  return 0x3c003c00u | ((unsigned)(threadIdx.x * 2654435761u + i) & 0x03ff03ffu);
}

__device__ __forceinline__ void mma16816(float (&d)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                         unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

extern "C" __global__ void __launch_bounds__(THREADS, 2) mma_sync_rate(int iters, float* out, long long* cycles) {
  const unsigned a0 = lane_bits(0), a1 = lane_bits(1), a2 = lane_bits(2), a3 = lane_bits(3);
  const unsigned b0 = lane_bits(4), b1 = lane_bits(5);
  float acc[8][4] = {};
  const long long t0 = clock64();
  for (int i = 0; i < iters; ++i) {
#pragma unroll
    for (int j = 0; j < 8; ++j) mma16816(acc[j], a0, a1 + j, a2, a3, b0, b1);
  }
  const long long t1 = clock64();
  float s = 0.0f;
#pragma unroll
  for (int j = 0; j < 8; ++j) s += acc[j][0] + acc[j][1] + acc[j][2] + acc[j][3];
  out[blockIdx.x * THREADS + threadIdx.x] = s;
  if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
}

// ---- wgmma ----

// Shared-memory matrix descriptor (PTX ISA, "Matrix Descriptor Format"): start address, leading- and
// stride-dimension byte offsets (all >> 4), no swizzle.
__device__ __forceinline__ unsigned long long smem_desc(const void* p, unsigned lead_bytes, unsigned stride_bytes) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(p));
  return (unsigned long long)((addr & 0x3FFFF) >> 4) | ((unsigned long long)((lead_bytes & 0x3FFFF) >> 4) << 16) |
         ((unsigned long long)((stride_bytes & 0x3FFFF) >> 4) << 32);
}

template <int N>
struct Wgmma;

// D (64 x 8, 4 floats per thread) += A (64 x 16, registers) x B (16 x 8, shared memory).
template <>
struct Wgmma<8> {
  static __device__ __forceinline__ void run(float (&d)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                             unsigned long long desc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, %8, p, 1, 1, 0;\n}"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc));
  }
};

// D (64 x 16, 8 floats per thread) += A (64 x 16, registers) x B (16 x 16, shared memory).
template <>
struct Wgmma<16> {
  static __device__ __forceinline__ void run(float (&d)[8], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                             unsigned long long desc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7}, "
                 "{%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc));
  }
};

// D (64 x 32, 16 floats per thread) += A (64 x 16, registers) x B (16 x 32, shared memory).
template <>
struct Wgmma<32> {
  static __device__ __forceinline__ void run(float (&d)[16], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                             unsigned long long desc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
                 "{%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                 "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
                 "+f"(d[15])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc));
  }
};

// D (64 x 64, 32 floats per thread) += A (64 x 16, registers) x B (16 x 64, shared memory).
template <>
struct Wgmma<64> {
  static __device__ __forceinline__ void run(float (&d)[32], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                             unsigned long long desc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
                 "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                 "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
                 "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),
                 "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),
                 "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc));
  }
};

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int Pending>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(Pending) : "memory"); }

// Keeps an accumulator live across asm statements the compiler cannot see into.
template <int R>
__device__ __forceinline__ void touch(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

constexpr int BATCH = 16;   // wgmma per commit group

// B: one 16 x N tile per warpgroup, K-major core matrices of 8 (n) x 16 bytes (8 k): the two k halves are
// `lead` = N * 16 bytes apart, consecutive groups of 8 n are 128 bytes apart.
template <int N>
__device__ __forceinline__ void wgmma_rate_body(int iters, float* out, long long* cycles) {
  __shared__ __align__(128) unsigned short b_tile[2][16 * 64];   // fp16 bits: small values, 2^-10 .. 7 x 2^-10
  for (int i = threadIdx.x; i < 2 * 16 * 64; i += THREADS) (&b_tile[0][0])[i] = (unsigned short)(0x1400 + i % 7);
  __syncthreads();
  const int wg = threadIdx.x / 128;
  const unsigned long long desc = smem_desc(b_tile[wg], N * 16, 128);
  const unsigned a0 = lane_bits(0), a1 = lane_bits(1), a2 = lane_bits(2), a3 = lane_bits(3);
  float d0[N / 2] = {}, d1[N / 2] = {};
  const long long t0 = clock64();
  for (int i = 0; i < iters; ++i) {   // two batches per trip, one per accumulator set: one drains, one issues
    wgmma_fence();
#pragma unroll
    for (int j = 0; j < BATCH; ++j) Wgmma<N>::run(d0, a0, a1, a2, a3, desc);
    wgmma_commit();
    wgmma_wait<1>();
    wgmma_fence();
#pragma unroll
    for (int j = 0; j < BATCH; ++j) Wgmma<N>::run(d1, a0, a1, a2, a3, desc);
    wgmma_commit();
    wgmma_wait<1>();
  }
  wgmma_wait<0>();
  touch(d0);
  touch(d1);
  const long long t1 = clock64();
  float s = 0.0f;
#pragma unroll
  for (int j = 0; j < N / 2; ++j) s += d0[j] + d1[j];
  out[blockIdx.x * THREADS + threadIdx.x] = s;
  if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
}

extern "C" __global__ void __launch_bounds__(THREADS, 2) wgmma_rate_n8(int iters, float* out, long long* cycles) {
  wgmma_rate_body<8>(iters, out, cycles);
}
extern "C" __global__ void __launch_bounds__(THREADS, 2) wgmma_rate_n16(int iters, float* out, long long* cycles) {
  wgmma_rate_body<16>(iters, out, cycles);
}
extern "C" __global__ void __launch_bounds__(THREADS, 2) wgmma_rate_n32(int iters, float* out, long long* cycles) {
  wgmma_rate_body<32>(iters, out, cycles);
}
extern "C" __global__ void __launch_bounds__(THREADS, 2) wgmma_rate_n64(int iters, float* out, long long* cycles) {
  wgmma_rate_body<64>(iters, out, cycles);
}
