// Issue 28, probe first: what the boundary between two decode steps costs, and whether programmatic
// dependent launch (PDL) hides part of it under the seed's cooperative launch.
//
// Why: `bench` on the H200 gives 203.7 µs/token at 2K where the seed's own stamps add up to 196.3 µs of
// phases and barrier waits (the H100: 216.1 against 208.9). ~7 µs per step lie outside the stamped kernel:
// the launch, the blocks' dispatch, the exit. The first phase is also 4 µs longer than the next layers'
// (12.1 against 8.0 µs): nothing was issued ahead of it. With PDL the next step's grid may be dispatched
// while this one's last blocks still run; its blocks then wait (griddepcontrol.wait) until every block of
// the previous grid has finished and its writes are visible. Whether a cooperative launch accepts the PDL
// attribute at all, and how much of the boundary it hides, is what this probe measures.
//
// The kernel has the seed's launch shape (SMs x 2 blocks x 256 threads, the seed's dynamic shared memory,
// so the same occupancy) and its grid barrier (a counter whose top bit flips per barrier). A launch runs
// `phases` phases; in each, thread 0 of every block spins `phase_ns` on %globaltimer, then the grid meets
// at a barrier (none after the last phase). Each block stamps when it entered, when its dependency on the
// previous launch was met (after griddepcontrol.wait; the same as entered without PDL) and when it was done.
//   MODE_PLAIN       the seed's launch: cooperative, no PDL.
//   MODE_PDL_EXIT    cooperative + programmatic stream serialization; the dependents are released when the
//                    blocks exit (no explicit trigger).
//   MODE_PDL_EARLY   as MODE_PDL_EXIT, and every block triggers its dependents (griddepcontrol.launch_dependents)
//                    as the last phase starts: the next grid's blocks may be dispatched onto SMs as this one's
//                    blocks leave, and wait there.
// The stamps are written before the wait, into this launch's own slots: no other launch touches them.
//
// Build check: nvcc -arch=sm_90a -cubin -Xptxas -v scripts/pdl_probe.cu
// Run: python3 scripts/pdl_probe.py

constexpr int THREADS = 256;
enum Mode { MODE_PLAIN = 0, MODE_PDL_EXIT = 1, MODE_PDL_EARLY = 2 };

struct Params {
  unsigned* barrier;              // the grid barrier's word; zeroed once by the host
  unsigned long long* stamps;     // [launches][grid][3]: entered, dependency met, done (ns)
  unsigned long long phase_ns;    // thread 0's spin per phase
  unsigned long long timeout_ns;  // a grid barrier waiting longer gives up and flags it
  int* status;                    // 1: a grid barrier timed out (the grid was not co-resident)
  int phases, mode, launch;
};

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// The seed's grid barrier (kernels/kimi_linear/seed.cu, Barrier), with a timeout.
__device__ void grid_barrier(const Params& p) {
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned seen, now;
    const unsigned add = blockIdx.x == 0 ? 0x80000000u - (gridDim.x - 1) : 1u;
    asm volatile("atom.release.gpu.global.add.u32 %0, [%1], %2;" : "=r"(seen) : "l"(p.barrier), "r"(add) : "memory");
    const unsigned long long give_up = global_ns() + p.timeout_ns;
    do {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(now) : "l"(p.barrier) : "memory");
      if (global_ns() > give_up) { *p.status = 1; break; }
    } while (((seen ^ now) & 0x80000000u) == 0);
  }
  __syncthreads();
}

extern "C" __global__ void __launch_bounds__(THREADS, 2) pdl_probe(const __grid_constant__ Params p) {
  extern __shared__ unsigned char smem[];   // unused beyond a touch: it sets the occupancy
  unsigned long long* st = p.stamps + ((size_t)p.launch * gridDim.x + blockIdx.x) * 3;
  if (threadIdx.x == 0) st[0] = global_ns();
  if (p.mode != MODE_PLAIN) asm volatile("griddepcontrol.wait;" ::: "memory");
  if (threadIdx.x == 0) st[1] = global_ns();
  smem[threadIdx.x] = 0;
  for (int ph = 0; ph < p.phases; ++ph) {
    if (p.mode == MODE_PDL_EARLY && ph == p.phases - 1) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    if (threadIdx.x == 0) {
      const unsigned long long until = global_ns() + p.phase_ns;
      while (global_ns() < until) {}
    }
    if (ph + 1 < p.phases) grid_barrier(p);
  }
  __syncthreads();
  if (threadIdx.x == 0) st[2] = global_ns();
}
