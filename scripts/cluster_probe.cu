// Issue 28, step 3, probe first: can the seed's persistent grid run as thread-block clusters under a
// cooperative launch, and does a split-K finish through distributed shared memory (DSMEM) beat the
// seed's finish through L2?
//
// One kernel, launched as the seed is (SMs x 2 blocks x 256 threads, the seed's dynamic shared memory, so
// occupancy is the seed's), cooperatively, with or without a cluster shape. Every block records its SM
// and cluster rank, then runs `iters` rounds. A round: a grid barrier (a counter, as the seed's), an
// optional burst of DRAM traffic (bulk L2 prefetches of fresh lines, issued before the stamp, so the
// finish runs against a busy memory system as in the seed's phases), the block's "computed" stamp, a
// 256-float partial (one tile of one K slice) in shared memory, and one finish of groups of P
// consecutive blocks:
//
//   MODE_L2     the seed's finish: each block stores its partial to global memory, a block barrier, thread 0's
//               acq_rel arrival atomic on the group's counter; the last arrival loads the P partials
//               (__ldcg, all in flight) and sums them in slot order.
//   MODE_PULL   DSMEM, P = cluster size: the partial stays in the block's shared memory; a cluster barrier
//               (arrive.release / wait.acquire); rank r sums its ceil(256/P) columns of all P
//               partials through ld.shared::cluster, in rank order, and stores them.
//   MODE_PUSH   DSMEM: every rank stores its partial into rank 0's shared memory (st.shared::cluster), then
//               arrives on the cluster barrier (release) and is done; rank 0 waits (acquire) and sums the P
//               rows from its own shared memory in rank order.
//   MODE_BARRIER  the cluster barrier alone (arrive.release + wait.acquire), no data: its latency.
//   MODE_NONE     nothing after the partial's block barrier: what the round costs besides the finish.
//   MODE_ATOMIC   thread 0's acq_rel atomic on the block's own counter: one L2 round trip.
// The last two run with P = 1 to ask whether a burst slows the block that issued it (every block, every
// `burst_stride`-th one, or the grid's first half: one block per SM, its SM's other block quiet) or the
// memory system for everyone.
//
// Each block stamps %globaltimer at "computed" and when its part of the finish is done; a group's finish
// is its last done minus its first computed. A DSMEM round ends with a second cluster barrier, outside
// the stamps, so no block overwrites shared memory a peer still reads (the seed would alternate buffers).
// The results of the last round are checked on the host: the partials are small multiples of 1/4, so
// every sum is exact.
//
// Build check: nvcc -arch=sm_90a -cubin -Xptxas -v scripts/cluster_probe.cu
// Run: python3 scripts/cluster_probe.py

constexpr int THREADS = 256;
constexpr int TILE = 256;
constexpr int MAX_GROUP = 16;
enum Mode { MODE_L2 = 0, MODE_PULL = 1, MODE_PUSH = 2, MODE_BARRIER = 3, MODE_NONE = 4, MODE_ATOMIC = 5 };

struct Params {
  float* part;                  // [grid][TILE]: MODE_L2's partial slots
  float* out;                   // [grid / group][TILE]: the last round's sums
  unsigned* count;              // [grid / group] arrival counters, then the grid barrier's word; zeroed by the host
  unsigned long long* stamps;   // [iters][grid][2]: computed, done (ns)
  unsigned* where;              // [grid][2]: %smid, %cluster_ctarank
  const unsigned char* traffic; // the burst's source (never read by the kernel, only prefetched into L2)
  unsigned long long traffic_bytes;   // size of that buffer
  unsigned burst_bytes;         // per block and round (multiple of 4096; 0 = idle memory)
  int iters, mode, group;
  int burst_stride, burst_below;   // blocks b with b % burst_stride == 0 and b < burst_below issue the burst
  unsigned long long timeout_ns;      // a grid barrier waiting longer gives up and flags it
  int* status;                  // 1: a grid barrier timed out (the grid was not co-resident)
};

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ unsigned special_smid() {
  unsigned v;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(v));
  return v;
}
__device__ __forceinline__ unsigned cluster_rank() {
  unsigned v;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(v));
  return v;
}
__device__ __forceinline__ unsigned smem_addr(const void* p) { return static_cast<unsigned>(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ unsigned peer_addr(unsigned local, unsigned rank) {
  unsigned v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(v) : "r"(local), "r"(rank));
  return v;
}
__device__ __forceinline__ float ld_peer(unsigned addr) {
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ void st_peer(unsigned addr, float v) {
  asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(addr), "f"(v) : "memory");
}
__device__ __forceinline__ void cluster_arrive() { asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }
__device__ __forceinline__ unsigned atomic_add_acq_rel(unsigned* p, unsigned v) {
  unsigned old;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}
__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Counter barrier over the whole grid (the word only grows: round n waits for n x grid arrivals). Gives up
// after the timeout, so a grid that is not co-resident ends with a flag instead of hanging the GPU.
__device__ void grid_barrier(const Params& p, unsigned* word, unsigned target) {
  __syncthreads();
  if (threadIdx.x == 0) {
    atomic_add_acq_rel(word, 1u);
    const unsigned long long t0 = global_ns();
    while (ld_acquire(word) < target)
      if (global_ns() - t0 > p.timeout_ns) { atomicExch(p.status, 1); break; }
  }
  __syncthreads();
}

__device__ __forceinline__ float partial_value(int block, int round, int t) {
  return (float)((block * 131 + t * 7 + round * 17) % 1009) * 0.25f;
}

// The burst: this block's bulk L2 prefetches of fresh lines (16 KB each, by the first warp's lanes).
__device__ void burst(const Params& p, int round) {
  if (p.burst_bytes == 0 || blockIdx.x % p.burst_stride || (int)blockIdx.x >= p.burst_below) return;
  const unsigned pieces = p.burst_bytes / 16384u;
  const unsigned long long span = (unsigned long long)p.burst_bytes * gridDim.x;
  const unsigned long long base = ((unsigned long long)round * span + (unsigned long long)blockIdx.x * p.burst_bytes) %
                                  (p.traffic_bytes - p.burst_bytes + 1) & ~16383ull;
  for (unsigned i = threadIdx.x; i < pieces; i += 32)
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p.traffic + base + 16384ull * i), "r"(16384u)
                 : "memory");
}

extern "C" __global__ void __launch_bounds__(THREADS, 2) cluster_probe(Params p) {
  extern __shared__ float4 dyn[];
  float* mine = reinterpret_cast<float*>(dyn);            // [TILE]: this block's partial
  float* rows = mine + TILE;                              // [MAX_GROUP][TILE]: MODE_PUSH's landing rows (rank 0)
  __shared__ int last_flag;
  const int b = blockIdx.x, t = threadIdx.x, P = p.group, g = b / P, r = b % P;
  unsigned* barrier_word = p.count + gridDim.x / P;
  if (t == 0) {
    p.where[2 * b] = special_smid();
    p.where[2 * b + 1] = cluster_rank();
  }
  unsigned rounds = 0;
  grid_barrier(p, barrier_word, ++rounds * gridDim.x);
  for (int it = 0; it < p.iters; ++it) {
    grid_barrier(p, barrier_word, ++rounds * gridDim.x);
    if (t < 32) burst(p, it);   // issued before the stamp: its issue time is not the finish's, its traffic is
    __syncthreads();
    const unsigned long long computed = global_ns();
    const float v = partial_value(b, it, t);
    mine[t] = v;
    __syncthreads();
    unsigned long long done = 0;
    const bool last_round = it == p.iters - 1;
    if (p.mode == MODE_L2) {
      p.part[(size_t)b * TILE + t] = v;
      __syncthreads();
      if (t == 0) last_flag = atomic_add_acq_rel(p.count + g, 1u) == (unsigned)((it + 1) * P - 1);
      __syncthreads();
      if (last_flag) {
        float x[MAX_GROUP];
#pragma unroll
        for (int s = 0; s < MAX_GROUP; ++s) x[s] = s < P ? __ldcg(p.part + (size_t)(g * P + s) * TILE + t) : 0.0f;
        float sum = 0.0f;
#pragma unroll
        for (int s = 0; s < MAX_GROUP; ++s) if (s < P) sum += x[s];
        if (last_round) p.out[(size_t)g * TILE + t] = sum;
        __syncthreads();
      }
      done = global_ns();
    } else if (p.mode == MODE_PULL) {
      cluster_arrive();
      cluster_wait();
      const int cols = (TILE + P - 1) / P, c0 = r * cols;
      if (t < cols && c0 + t < TILE) {
        const unsigned local = smem_addr(mine + c0 + t);
        float x[MAX_GROUP];
#pragma unroll
        for (int s = 0; s < MAX_GROUP; ++s) x[s] = s < P ? ld_peer(peer_addr(local, s)) : 0.0f;
        float sum = 0.0f;
#pragma unroll
        for (int s = 0; s < MAX_GROUP; ++s) if (s < P) sum += x[s];
        if (last_round) p.out[(size_t)g * TILE + c0 + t] = sum;
      }
      __syncthreads();
      done = global_ns();
      cluster_arrive();   // no peer overwrites `mine` while another still reads it
      cluster_wait();
    } else if (p.mode == MODE_PUSH) {
      st_peer(peer_addr(smem_addr(rows + r * TILE + t), 0), v);
      cluster_arrive();
      if (r == 0) {
        cluster_wait();
        float sum = 0.0f;
        for (int s = 0; s < P; ++s) sum += rows[s * TILE + t];
        if (last_round) p.out[(size_t)g * TILE + t] = sum;
        __syncthreads();
        done = global_ns();
      } else {
        __syncthreads();
        done = global_ns();
        cluster_wait();
      }
      cluster_arrive();   // rank 0 has read every row before the next round's stores
      cluster_wait();
    } else if (p.mode == MODE_BARRIER) {
      cluster_arrive();
      cluster_wait();
      __syncthreads();
      done = global_ns();
      cluster_arrive();
      cluster_wait();
    } else if (p.mode == MODE_ATOMIC) {
      if (t == 0) atomic_add_acq_rel(p.count + g, 1u);
      __syncthreads();
      done = global_ns();
    } else {
      done = global_ns();
    }
    if (t == 0) {
      p.stamps[((size_t)it * gridDim.x + b) * 2] = computed;
      p.stamps[((size_t)it * gridDim.x + b) * 2 + 1] = done;
    }
  }
}
