"""Thread-block clusters under the seed's cooperative launch, and a split-K finish through DSMEM against L2.

Issue 28, step 3, probe first. scripts/cluster_probe.cu says what the kernel does. This driver:
1. For each cluster size, asks the driver how many clusters of the seed's shape (SMs x 2 blocks x 256
   threads, the seed's dynamic shared memory) can be co-resident, then launches the seed's grid
   cooperatively with that cluster shape and barrier-only rounds: accepted, refused (the driver's error),
   or accepted but not co-resident (a grid barrier timed out). Where the seed's grid is refused, it tries
   the largest grid of whole clusters the driver says fit. It records where the driver put the blocks.
2. For groups of P = 2, 3, 4, 8 blocks, times one split-K finish of a 256-column tile four ways: the seed's
   (through L2; without clusters, and with groups that are clusters), DSMEM pull, DSMEM push, and the
   cluster barrier alone; each with memory idle and with every block prefetching 64 KB of fresh lines
   into L2 as the round starts (17 MB for the grid, as in a seed phase's first chunks). Each P runs on the
   grid its clusters could launch on, the L2 finish without clusters on the same grid.
3. Whether a burst slows the block that issued it or everyone: a round with no finish, and one L2 atomic,
   timed per block with memory idle, with every block issuing 64 KB, with every second block issuing 128 KB
   (the same traffic) while the others stay quiet, and with the grid's first half issuing 128 KB (one block
   per SM) while their SMs' other blocks stay quiet.

A finish is the group's last "done" stamp minus its first "computed" stamp (%globaltimer); "from last" is
minus its last "computed" instead (what the seed's stamps call a critical block's computed -> done: the
skew between the producers left out). Per launch the first rounds are dropped; the table gives medians over
samples of the median group (typical), of each round's slowest group (what a phase waits for), and of the
median group from its last partial. The seed's own finish, computed -> done on a phase's
critical block, is 3.4-6.3 µs in its stamps (BENCHMARKS.md, 2026-12-05).

Usage: python3 scripts/cluster_probe.py [--samples 5] [--iters 300] [--smem 111360] [--placement SM.npy]
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import statistics
import sys
from pathlib import Path

import cupy
import numpy
from sm90a_module import load_sm90a

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from megakernel_agent.tasks.cuda_runtime import (  # noqa: E402
    CU_LAUNCH_ATTRIBUTE_COOPERATIVE,
    LaunchAttribute,
    LaunchConfig,
    driver,
)

SOURCE = Path(__file__).with_suffix(".cu")
THREADS, BLOCKS_PER_SM, TILE, MAX_GROUP = 256, 2, 256, 16
# the seed's GEMV carve at the full config (SM_GEMV_BYTES in kernels/kimi_linear/seed.cu)
SEED_DYN_SMEM = 112512
CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4
CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14
MODES = {"L2": 0, "pull": 1, "push": 2, "barrier": 3, "none": 4, "atomic": 5}
ACCEPT_SIZES = (1, 2, 3, 4, 6, 8, 12)
GROUPS = (2, 3, 4, 8)
BURST_BYTES = 65536
TRAFFIC_BYTES = 1 << 30
WARMUP_ROUNDS = 20
TIMEOUT_NS = 200_000_000


class Params(ctypes.Structure):
    """The kernel's Params, field for field (natural alignment, as the C struct)."""

    _fields_ = [
        ("part", ctypes.c_void_p), ("out", ctypes.c_void_p), ("count", ctypes.c_void_p),
        ("stamps", ctypes.c_void_p), ("where", ctypes.c_void_p), ("traffic", ctypes.c_void_p),
        ("traffic_bytes", ctypes.c_uint64), ("burst_bytes", ctypes.c_uint32),
        ("iters", ctypes.c_int32), ("mode", ctypes.c_int32), ("group", ctypes.c_int32),
        ("burst_stride", ctypes.c_int32), ("burst_below", ctypes.c_int32),
        ("timeout_ns", ctypes.c_uint64), ("status", ctypes.c_void_p),
    ]


class Probe:
    """Buffers and launches of the probe kernel for one grid."""

    def __init__(self, func: int, grid: int, smem: int, iters: int):
        self.func, self.full, self.grid, self.smem, self.iters = func, grid, grid, smem, iters
        drv = driver()
        drv.set_max_dynamic_smem(func, smem)
        drv.check(drv.lib.cuFuncSetAttribute(ctypes.c_void_p(func), CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED,
                                             ctypes.c_int(1)), "cuFuncSetAttribute(NON_PORTABLE_CLUSTER_SIZE_ALLOWED)")
        self.part = cupy.zeros(grid * TILE, dtype=cupy.float32)
        self.out = cupy.zeros(grid * TILE, dtype=cupy.float32)
        self.count = cupy.zeros(grid + 1, dtype=cupy.uint32)
        self.stamps = cupy.zeros(iters * grid * 2, dtype=cupy.uint64)
        self.where = cupy.zeros(grid * 2, dtype=cupy.uint32)
        self.status = cupy.zeros(1, dtype=cupy.int32)
        self.traffic = cupy.empty(TRAFFIC_BYTES, dtype=cupy.uint8)

    def config(self, cluster: int, cooperative: bool) -> tuple[LaunchConfig, ctypes.Array]:
        attrs = (LaunchAttribute * 2)()
        attrs[0].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        attrs[0].value[0], attrs[0].value[1], attrs[0].value[2] = cluster, 1, 1
        attrs[1].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE
        attrs[1].value[0] = 1
        n = 2 if cooperative else 1
        first = ctypes.cast(attrs, ctypes.POINTER(LaunchAttribute))
        return LaunchConfig((self.grid, 1, 1), (THREADS, 1, 1), self.smem, None, first, n), attrs

    def max_active_clusters(self, cluster: int) -> int | str:
        cfg, _attrs = self.config(cluster, cooperative=False)
        n = ctypes.c_int()
        lib = driver().lib
        status = lib.cuOccupancyMaxActiveClusters(ctypes.byref(n), ctypes.c_void_p(self.func), ctypes.byref(cfg))
        return n.value if status == 0 else driver().error_name(status)

    def launch(self, cluster: int, mode: str, group: int, burst: int, iters: int, stride: int = 1,
               below: int | None = None) -> str | None:
        """One cooperative launch; None if it ran, else why not (the driver's error, or 'not co-resident')."""
        self.count.fill(0)
        self.status.fill(0)
        self.out.fill(numpy.nan)
        params = Params(self.part.data.ptr, self.out.data.ptr, self.count.data.ptr, self.stamps.data.ptr,
                        self.where.data.ptr, self.traffic.data.ptr, TRAFFIC_BYTES, burst, iters, MODES[mode], group,
                        stride, self.grid if below is None else below, TIMEOUT_NS, self.status.data.ptr)
        args = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.pointer(params), ctypes.c_void_p))
        cfg, _attrs = self.config(cluster, cooperative=True)
        status = driver().launch(ctypes.c_void_p(ctypes.addressof(cfg)), ctypes.c_void_p(self.func),
                                 ctypes.c_void_p(ctypes.addressof(args)), None)
        if status:
            return driver().error_name(status)
        cupy.cuda.Device().synchronize()
        return "not co-resident (a grid barrier timed out)" if int(self.status.get()[0]) else None

    def finishes(self, group: int, iters: int) -> tuple[numpy.ndarray, numpy.ndarray]:
        """[rounds after warm-up][groups] finish times in µs: from the group's first partial, and from its last
        (the seed's critical finish: the last arrival's computed -> done)."""
        s = self.stamps.get()[: self.iters * self.grid * 2].reshape(self.iters, self.grid, 2)
        s = s[WARMUP_ROUNDS:iters].astype(numpy.int64)
        s = s.reshape(iters - WARMUP_ROUNDS, self.grid // group, group, 2)
        done = s[..., 1].max(axis=2)
        return (done - s[..., 0].min(axis=2)) / 1e3, (done - s[..., 0].max(axis=2)) / 1e3

    def check(self, group: int, iters: int) -> float:
        """Largest |error| of the last round's sums against the exact ones."""
        b = numpy.arange(self.grid)[:, None]
        t = numpy.arange(TILE)[None, :]
        parts = ((b * 131 + t * 7 + (iters - 1) * 17) % 1009) * 0.25
        want = parts.reshape(self.grid // group, group, TILE).sum(axis=1)
        got = self.out.get()[: want.size].reshape(want.shape)
        return float(numpy.abs(got - want).max()) if numpy.isfinite(got).all() else float("nan")


def placement(where: numpy.ndarray, cluster: int) -> str:
    """How the driver placed the blocks: SMs used (and how many hold two), whether a cluster's ranks are
    consecutive blocks, and how many clusters put two of their blocks on one SM."""
    sm, rank = where.reshape(-1, 2).T
    ok = bool((rank == numpy.arange(sm.size) % cluster).all())
    shared = sum(len(set(c)) < cluster for c in sm.reshape(-1, cluster).tolist())
    doubled = int((numpy.bincount(sm) == 2).sum())
    return (f"{len(set(sm.tolist()))} SMs ({doubled} with 2 blocks), rank = block % size: {ok}, "
            f"clusters sharing an SM: {shared}/{sm.size // cluster}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=5)
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--smem", type=int, default=SEED_DYN_SMEM, help="dynamic shared memory per block (bytes)")
    ap.add_argument("--placement", type=Path, help="save each block's %%smid (grid without clusters) to this .npy")
    args = ap.parse_args()
    module = load_sm90a(SOURCE)
    func = int(module.get_function("cluster_probe").kernel.ptr)
    dev = cupy.cuda.Device()
    sms = dev.attributes["MultiProcessorCount"]
    grid = sms * BLOCKS_PER_SM
    probe = Probe(func, grid, args.smem, args.iters)
    name = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    print(f"{name} · {sms} SMs · grid {grid} x {THREADS} · {args.smem} B dynamic shared memory per block")
    print(f"occupancy without clusters: {driver().occupancy(func, THREADS, args.smem)} blocks/SM")

    print("\n## cooperative launch with a cluster shape (barrier-only rounds)")
    grids: dict[int, int] = {}   # cluster size -> the grid it launched on
    for c in ACCEPT_SIZES:
        probe.grid = grid - grid % c
        most = probe.max_active_clusters(c)
        fits = f"{most} clusters = {most * c} blocks" if isinstance(most, int) else most
        tries = [probe.grid] + ([most * c] if isinstance(most, int) and 0 < most * c < probe.grid else [])
        for n in tries:
            probe.grid = n
            why = probe.launch(c, "barrier", c, 0, 3)
            where = placement(probe.where.get()[: 2 * n], c) if why is None else ""
            print(f"cluster {c:2}: max active {fits}; grid {n}: {why or 'ran'}{'; ' + where if where else ''}")
            if why is None:
                grids[c] = n
                break

    print("\n## one split-K finish of a 256-column tile, µs (median group / slowest group per round; medians of "
          f"{args.samples} samples)")
    rows = []
    for group in GROUPS:
        probe.grid = grids.get(group, grid - grid % group)
        for mode, cluster in (("L2", 1), ("L2", group), ("pull", group), ("push", group), ("barrier", group)):
            if cluster not in grids or probe.grid % group:
                continue
            for burst in (0, BURST_BYTES):
                typical, slowest, last, errors = [], [], [], []
                for _ in range(args.samples):
                    why = probe.launch(cluster, mode, group, burst, args.iters)
                    if why:
                        raise SystemExit(f"P={group} {mode} cluster {cluster}: {why}")
                    f, from_last = probe.finishes(group, args.iters)
                    typical.append(float(numpy.median(f)))
                    slowest.append(float(numpy.median(f.max(axis=1))))
                    last.append(float(numpy.median(from_last)))
                    if mode != "barrier":
                        errors.append(probe.check(group, args.iters))
                err = max(errors) if errors else 0.0
                rows.append((group, mode, cluster, probe.grid, burst, statistics.median(typical),
                             statistics.median(slowest), min(typical), max(typical), statistics.median(last), err))
    print(f"{'P':>2} {'finish':8} {'cluster':>7} {'grid':>5} {'burst KB':>8} {'median':>7} {'slowest':>8} "
          f"{'spread':>13} {'from last':>9} {'max err':>8}")
    for group, mode, cluster, n, burst, typ, slow, lo, hi, from_last, err in rows:
        print(f"{group:2} {mode:8} {cluster:7} {n:5} {burst // 1024:8} {typ:7.2f} {slow:8.2f} [{lo:5.2f}-{hi:5.2f}] "
              f"{from_last:9.2f} {err:8.2g}")
    print("\n## what a burst costs the blocks of the SM that issues it: µs from the stamp to done, per block (P = 1), "
          "medians")
    probe.grid = grid
    half = grid // 2
    if why := probe.launch(1, "none", 1, 0, 3):
        raise SystemExit(f"placement launch: {why}")
    sm = probe.where.get()[: 2 * grid : 2]
    mates = {b: [m for m in numpy.flatnonzero(sm == sm[b]).tolist() if m != b] for b in range(grid)}
    offsets = collections.Counter(m[0] - b for b, m in mates.items() if len(m) == 1)
    print(f"blocks b and b + {half} share an SM: {int((sm[:half] == sm[half:]).sum())} of {half}; SM-mate offsets "
          f"(mate - b: blocks): {', '.join(f'{o:+d}: {n}' for o, n in offsets.most_common(8))}")
    if args.placement:
        numpy.save(args.placement, sm)
    print(f"{'round':8} {'memory':42} {'issuing':>8} {'quiet':>8}")
    loads = (("idle", 0, 1, grid), ("every block 64 KB", BURST_BYTES, 1, grid),
             ("every second block 128 KB", 2 * BURST_BYTES, 2, grid),
             ("first half 128 KB (quiet: their SM-mates)", 2 * BURST_BYTES, 1, half))
    for mode in ("none", "atomic"):
        for label, burst, stride, below in loads:
            issuing, quiet = [], []
            for _ in range(args.samples):
                why = probe.launch(1, mode, 1, burst, args.iters, stride, below)
                if why:
                    raise SystemExit(f"{mode} {label}: {why}")
                f = probe.finishes(1, args.iters)[0]
                busy = (numpy.arange(grid) % stride == 0) & (numpy.arange(grid) < below)
                issuing.append(float(numpy.median(f[:, busy])))
                if not busy.all():
                    quiet.append(float(numpy.median(f[:, ~busy])))
            q = f"{statistics.median(quiet):8.2f}" if quiet else f"{'-':>8}"
            print(f"{mode:8} {label:42} {statistics.median(issuing):8.2f} {q}")
    bad = [r for r in rows if not r[10] == 0.0 and r[1] != "barrier"]
    if bad:
        raise SystemExit(f"{len(bad)} finishes gave wrong sums")


if __name__ == "__main__":
    main()
