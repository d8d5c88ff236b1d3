// What a cold code path costs while device memory is saturated (issue 28; BENCHMARKS.md, twenty-eighth session).
//
// Why: in the seed's MoE phase a block with a second unit reads its first chunk 2.7-3.5 µs after it lands, a
// block without one 1.2-1.6 µs, and the only difference is a ~150-instruction path (the walk to the next unit)
// that runs once per layer while the grid streams its first chunks. The reading to test: an instruction fetch
// that misses the SM's caches waits in the memory system behind the weight stream.
//
// What it does: one thread per block (the rest exit) times a call of `cold_body`, 512 dependent FFMAs with
// distinct immediates (8 KB of straight-line code, no data loads), with %globaltimer around the call; the
// launch names which of COPIES instances it calls.
//   WARM      call `cold_body` once first, so the timed call finds its code in the instruction cache;
//             With `between` other copies called in between, the warm-up can be pushed out again: how many
//             push it out gives the size of the instruction cache (idle modes only);
//   SATURATE  first queue this block's slice of a large buffer for L2 (`cp.async.bulk.prefetch.L2`, no data
//             comes to the SM), so device memory is busy for the whole call.
// The host evicts L2 (writes a buffer several times its size) before every launch, so a cold call's code comes
// from device memory. The FFMA chain alone takes ~512 x 4 cycles, the same in every mode; the difference
// between modes is the fetch.
//
// Build check: nvcc -arch=sm_90a -cubin -Xptxas -v scripts/cold_code_probe.cu. Run: python3 scripts/cold_code_probe.py

constexpr int BODY = 512;                  // FFMAs in the cold body
constexpr unsigned PIECE = 256u << 10;     // bytes per L2 prefetch
constexpr int WARM = 1, SATURATE = 2;      // mode bits
constexpr int COPIES = 16;                 // instances of the cold body (see cold_body)

// v * (1 + c_i) with a distinct immediate per instruction (the loop is unrolled whole), so nothing folds and every
// FFMA is its own code. COPIES instances with different immediates: launch n calls copy n % COPIES, so a copy's
// code is 15 other copies (120 KB) away from its last use and has left the SM's instruction caches too.
template <int K>
__device__ __noinline__ float cold_body(float v) {
#pragma unroll
  for (int i = 0; i < BODY; ++i) v = fmaf(v, -0.25f - 1.0e-4f * (i % 97) - 1.0e-6f * (i / 97) - 1.0e-7f * K, v);
  return v;
}

template <int K>
__device__ __forceinline__ float body_of(int copy, float v) {
  if constexpr (K < COPIES) return copy == K ? cold_body<K>(v) : body_of<K + 1>(copy, v);
  return v;
}

__device__ __forceinline__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// `between`: with WARM, the other copies (copy + 1, copy + 2, ...) called after the warm-up and before the timed
// call, 8 KB of code each; the timed call turns cold once they have pushed its code out of the caches.
extern "C" __global__ void cold_probe(const unsigned char* buf, unsigned long long per_block, int mode, int copy,
                                      int between, float seed, unsigned long long* out_ns, float* sink) {
  if (threadIdx.x != 0) return;
  float v = seed + blockIdx.x;
  if (mode & WARM) {
    v = body_of<0>(copy, v);
    for (int i = 1; i <= between; ++i) v = body_of<0>((copy + i) % COPIES, v);
  }
  if (mode & SATURATE) {
    const unsigned char* slice = buf + blockIdx.x * per_block;
    for (unsigned long long off = 0; off < per_block; off += PIECE)
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(slice + off), "r"(PIECE) : "memory");
  }
  const unsigned long long t0 = now_ns();
  v = body_of<0>(copy, v);
  const unsigned long long t1 = now_ns();
  out_ns[blockIdx.x] = t1 - t0;
  sink[blockIdx.x] = v;
}
