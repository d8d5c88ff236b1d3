// What a cold code path costs while device memory is busy (issue 28; BENCHMARKS.md, twenty-eighth session).
//
// Why: in the seed's MoE phase a block with a second unit reads its first chunk 2.7-3.5 µs after it lands, a
// block without one 1.2-1.6 µs, and the only difference is a ~150-instruction path (the walk to the next unit)
// that runs once per layer while the grid streams its first chunks. The reading to test: an instruction fetch
// that misses the SM's caches waits in the memory system behind the weight stream.
//
// What it does: thread 0 of each block times one call of a `cold_body` copy, 512 dependent FFMAs with distinct
// immediates (8 KB of straight-line code, no data loads), with %globaltimer around the call. The copy to time
// comes in as a function pointer the host read from `bodies`, and every call goes through one call site, so the
// timed window holds the call and nothing else (no dispatch, no table load).
//   (always)  `between` other copies (8 KB of code each) run before the timed call: enough of them push the
//             copy's lines out of the SM's instruction caches, which a previous launch may have left warm;
//   WARM      call the copy first, then the others, then the timed call: with none between, its code is in the
//             SM's instruction cache; how many it takes to push it out sizes that cache; with many, its code
//             is in L2 only;
//   SATURATE  thread 0 first queues this block's slice of a large buffer for L2 (`cp.async.bulk.prefetch.L2`):
//             device memory is busy, but no data comes back to the SM;
//   STREAM    warp 1 keeps `depth` (1..RING) bulk copies of 16 KB in flight into shared memory, evict-first in L2
//             (as the seed's weight ring does), for as long as thread 0 works: data comes back over the path an
//             instruction fetch takes. WARM with many bodies between under STREAM leaves the timed copy's code in
//             L2 but out of the SM's instruction cache.
// Under SATURATE or STREAM the timed call starts 2 µs after the load starts, so the grid's traffic has built up.
// The host evicts L2 before every launch (writes a buffer several times its size), so a cold call's code comes
// from device memory.
//
// Build check: nvcc -arch=sm_90a -cubin -Xptxas -v scripts/cold_code_probe.cu. Run: python3 scripts/cold_code_probe.py

constexpr int BODY = 512;                  // FFMAs in the cold body
constexpr int COPIES = 24;                 // instances of the cold body
constexpr unsigned PIECE = 256u << 10;     // bytes per L2 prefetch
constexpr unsigned SLOT = 16u << 10;       // bytes per shared-memory stream copy
constexpr int RING = 4;                    // most stream copies in flight (the launch picks 1..RING)
constexpr int WARM = 1, SATURATE = 2, STREAM = 4;   // mode bits
constexpr unsigned long long RAMP_NS = 2000;        // load start to timed call

// v * (1 + c_i) with a distinct immediate per instruction (the loop is unrolled whole): nothing folds, and every
// FFMA is its own code. Copies differ in their immediates.
template <int K>
__device__ __noinline__ float cold_body(float v) {
#pragma unroll
  for (int i = 0; i < BODY; ++i) v = fmaf(v, -0.25f - 1.0e-4f * (i % 97) - 1.0e-6f * (i / 97) - 1.0e-7f * K, v);
  return v;
}

using Body = float (*)(float);
__device__ Body bodies[COPIES] = {cold_body<0>,  cold_body<1>,  cold_body<2>,  cold_body<3>,  cold_body<4>,
                                  cold_body<5>,  cold_body<6>,  cold_body<7>,  cold_body<8>,  cold_body<9>,
                                  cold_body<10>, cold_body<11>, cold_body<12>, cold_body<13>, cold_body<14>,
                                  cold_body<15>, cold_body<16>, cold_body<17>, cold_body<18>, cold_body<19>,
                                  cold_body<20>, cold_body<21>, cold_body<22>, cold_body<23>};

__device__ __forceinline__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ unsigned smem_addr(const void* p) { return static_cast<unsigned>(__cvta_generic_to_shared(p)); }

// Warp 1, lane 0: `depth` copies of SLOT bytes from `src` into shared memory, each re-issued as soon as it lands,
// until thread 0 sets *stop; then every copy in flight is waited for (none may outlive the block). The copies
// carry the seed's L2 evict-first policy, so code that reached L2 stays there.
__device__ void stream_to_shared(const unsigned char* src, unsigned long long bytes, int depth, unsigned char* ring,
                                 unsigned long long* bars, volatile int* started, volatile int* stop) {
  unsigned fills[RING] = {};
  unsigned long long off = 0, policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  auto issue = [&](int s) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(&bars[s])), "r"(SLOT) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;"
                 ::"r"(smem_addr(ring + s * SLOT)), "l"(src + off), "r"(SLOT), "r"(smem_addr(&bars[s])), "l"(policy)
                 : "memory");
    off = off + SLOT < bytes ? off + SLOT : 0;
    ++fills[s];
  };
  auto wait = [&](int s) {
    unsigned done;
    do {
      asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                   : "=r"(done) : "r"(smem_addr(&bars[s])), "r"((fills[s] - 1u) & 1u) : "memory");
    } while (!done);
  };
  for (int s = 0; s < depth; ++s) issue(s);
  *started = 1;
  for (int s = 0; !*stop; s = (s + 1) % depth) {
    wait(s);
    issue(s);
  }
  for (int s = 0; s < depth; ++s) wait(s);
}

extern "C" __global__ void cold_probe(const unsigned char* buf, unsigned long long per_block, int mode, int depth,
                                      int copy, int between, Body timed, float seed, unsigned long long* out_ns,
                                      float* sink) {
  extern __shared__ __align__(128) unsigned char ring[];
  __shared__ unsigned long long bars[RING];
  __shared__ int started, stop;
  const unsigned char* slice = buf + blockIdx.x * per_block;
  if (threadIdx.x == 0) {
    started = stop = 0;
    for (int s = 0; s < RING; ++s) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(&bars[s])) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (threadIdx.x == 32 && (mode & STREAM)) stream_to_shared(slice, per_block, depth, ring, bars, &started, &stop);
  if (threadIdx.x != 0) return;
  float v = seed + blockIdx.x;
  const int calls = between + ((mode & WARM) ? 2 : 1);   // [the copy,] `between` others, the copy (timed)
  unsigned long long dt = 0;
  for (int i = 0; i < calls; ++i) {
    const bool last = i == calls - 1;
    const int other = (mode & WARM) ? i : i + 1;            // WARM: i == 0 is the copy itself
    const Body f = last ? timed : bodies[(copy + other) % COPIES];
    if (last && (mode & (SATURATE | STREAM))) {
      if (mode & SATURATE)
        for (unsigned long long off = 0; off < per_block; off += PIECE)
          asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(slice + off), "r"(PIECE) : "memory");
      while ((mode & STREAM) && !*static_cast<volatile int*>(&started)) {}
      for (const unsigned long long q = now_ns(); now_ns() - q < RAMP_NS;) {}
    }
    const unsigned long long t0 = now_ns();
    v = f(v);
    dt = now_ns() - t0;
  }
  *static_cast<volatile int*>(&stop) = 1;
  out_ns[blockIdx.x] = dt;
  sink[blockIdx.x] = v;
}
