"""The seed megakernel's work, block by block: which weight chunks each block streams, in what order, and
what each unit does when its last chunk is read. The schedule model (step_model.py) replays this plan.

It mirrors kernels/kimi_linear/seed.cu for a config and knob values: a GEMV phase is a list of job tables
(run back to back by every block); a table's units are (tile, K slice) pairs in job order, unit u runs on
block u mod grid; a unit is cut into chunks of one 16-row slab per warp, a gate/up pair alternating its two
matrices chunk by chunk; a chunk's bytes are its packed rows plus the bf16 scales and zeros of the quant
groups it touches (what the three bulk copies move, padded columns included). The phases that are not GEMVs
(delta rule, router, attention, ...) are named here and timed from stamps by the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from .bytes_model import layer_bytes
from .config import KimiConfig

TILE = 256                  # output columns per GEMV tile
SLAB_ROWS = 16              # packed rows of one slab (one warp's share of a chunk)
SUM_BATCH = 10              # partial-sum loads a finishing thread keeps in flight


class Staging(str, Enum):
    """What a block does between its release and its first chunk step."""

    RMSNORM = "rmsnorm"     # stage rmsnorm(x) * weight as int16 blocks, fp16 for dense rows (KDA / MLA)
    FLOATS = "floats"       # stage the attention output (output projections)
    ROUTE = "route"         # top-k from the router logits, the routed job table, the first issue
    ROUTED_EARLY = "routed_early"   # (ROUTE_EARLY) the experts already ranked: the routed job table and the first
                                    # issue, then rmsnorm(x) staged while those chunks fly


class Finish(str, Enum):
    """A unit's work after its last chunk: publish a partial, and, for the tile's last arrival, the epilogue."""

    PARTIAL = "partial"     # partial only; the consumer sums (KDA q/k/v/g, gate/up)
    RESIDUAL = "residual"   # accumulator add; the last arrival adds the total to the residual (output projections)
    MLA = "mla"             # split-K sum + RoPE / cache row (MLA q, kv_a)
    MOE_OUT = "moe_out"     # as RESIDUAL, over every expert slot's K slices (down)
    COUNTED = "counted"     # accumulator add that counts itself in its word: a column's last add finishes it,
                            # with no counter or second load (output and down projections with ACC_COUNT 1)


@dataclass(frozen=True)
class Chunk:
    """One ring fill: `bytes` copied from device memory, `slabs` warps busy computing it."""

    bytes: int
    slabs: int


@dataclass(frozen=True)
class Unit:
    """One (tile, K slice) of a job. `tile` names the split-K arrival counter it adds to; `parts` arrivals
    complete it and the last one loads the tile's sums in `sum_rounds` dependent batches (finish permitting:
    the partials, or for the accumulated finishes each column's total with its residual). `needs`: producer
    tiles whose every K slice must have arrived before the unit stages its input (down units read gate/up
    partials), in `need_rounds` batches. `job`: the job's place in its table, the jobs the kernel walks past
    to find the unit (job_of) before it can issue the unit's first chunk."""

    chunks: tuple[Chunk, ...]
    finish: Finish
    tile: tuple[str, int, int]
    parts: int
    sum_rounds: int = 0
    needs: tuple[tuple[str, int, int], ...] = ()
    need_rounds: int = 0
    job: int = 0


@dataclass(frozen=True)
class Prefetch:
    """Blocks (ids, or None for all) that issue a table's first two chunks at the barrier closing the phase
    `back` phases before the table's."""

    blocks: frozenset[int] | None = None
    back: int = 1


@dataclass(frozen=True)
class JobTable:
    """Units of one job table, in unit order; a block's prefetch is the first of `prefetches` naming it (none:
    the block issues its first chunks when its phase starts). Unit u runs on block u mod grid, or with
    `past_previous` on block (u + s) mod grid, s the previous table's unit count mod grid: the down units start
    past the blocks that ran one more gate/up unit than the others."""

    units: tuple[Unit, ...]
    staging: Staging | None
    prefetches: tuple[Prefetch, ...] = ()
    past_previous: bool = False

    def prefetch_of(self, block: int) -> Prefetch | None:
        return next((p for p in self.prefetches if p.blocks is None or block in p.blocks), None)

    def block_units(self, block: int, grid: int, skew: int = 0) -> list[Unit]:
        return list(self.units[(block - skew) % grid::grid])


@dataclass(frozen=True)
class Phase:
    """One phase between grid barriers: GEMV job tables run back to back, or a phase timed from stamps."""

    name: str
    tables: tuple[JobTable, ...] = ()

    @property
    def simulated(self) -> bool:
        return bool(self.tables)


def table_skew(tables: tuple[JobTable, ...], i: int, grid: int) -> int:
    """The block that runs unit 0 of a phase's table i (see JobTable.past_previous)."""
    return len(tables[i - 1].units) % grid if i and tables[i].past_previous else 0


def tiles_of(n: int) -> int:
    return (n + TILE - 1) // TILE


def unit_chunks(k: int, split: int, ksplit: int, group: int, warps: int, paired: bool) -> tuple[Chunk, ...]:
    """The chunks of K slice `split` of `ksplit` of a (k, 256-column tile) matrix, as issue_chunk cuts them."""
    slabs = k // 2 // SLAB_ROWS
    s0, s1 = split * slabs // ksplit, (split + 1) * slabs // ksplit
    group_rows = group // 2
    out = []
    # a slice with no slab (more K slices than slabs) is still one chunk: the kernel walks it, computes nothing
    # and arrives, so the tile's consumers can count on every slice
    for s in range(s0, max(s1, s0 + 1), warps):
        n = min(warps, s1 - s) if s1 > s0 else 0
        row0, rows = s * SLAB_ROWS, n * SLAB_ROWS
        groups = (row0 + rows - 1) // group_rows - row0 // group_rows + 1
        chunk = Chunk(bytes=rows * TILE + 2 * groups * 2 * TILE, slabs=n)
        out.extend([chunk, chunk] if paired else [chunk])
    return tuple(out)


def sum_rounds(parts: int, warps: int, finish: Finish) -> int:
    """Dependent load batches of a tile's last arrival: one for the accumulated finishes (a column's total and
    its residual at once); for sum_partials, each thread sums one float4 column of the tile over every P-th
    partial (P = threads / 64 slot phases), SUM_BATCH loads in flight."""
    if finish == Finish.COUNTED:
        return 0
    if finish in (Finish.RESIDUAL, Finish.MOE_OUT):
        return 1
    return -(-parts // (SUM_BATCH * max(1, warps * 32 // (TILE // 4))))


def swiglu_rounds(parts: int, cols: int, warps: int) -> int:
    """Dependent load batches of stage_swiglu: a thread sums one (matrix, 4 columns) item over every partial,
    SUM_BATCH loads in flight, and takes another item when the slice has more than the block's threads."""
    return -(-parts // SUM_BATCH) * -(-(2 * cols // 4) // (warps * 32))


def job_units(name: str, k: int, n: int, ksplit: int, cfg: KimiConfig, warps: int, finish: Finish,
              job: int = 0) -> list[Unit]:
    """Units of one unpaired job, the table's `job`-th, in the kernel's order (unit = tile * ksplit + split)."""
    return [Unit(chunks=unit_chunks(k, split, ksplit, cfg.group, warps, paired=False), finish=finish,
                 tile=(name, 0, tile), parts=ksplit, sum_rounds=sum_rounds(ksplit, warps, finish), job=job)
            for tile in range(tiles_of(n)) for split in range(ksplit)]


def moe_tables(cfg: KimiConfig, knobs: dict[str, int], warps: int, layer: int,
               early: bool = False) -> tuple[JobTable, JobTable]:
    """The MoE phase's two tables: shared then routed gate/up pairs, then every slot's down projection. The
    shared units' first chunks are issued two barriers ahead, the routed units' after routing. With the knob
    SPLIT_PAIRS (absent: 0), the last routed experts run their gate and up as two jobs of one-matrix units.
    `early` (ROUTE_EARLY): no router phase before, so the shared chunks go one barrier ahead, and the routing is
    done when the phase starts."""
    d, f = cfg.hidden, cfg.moe_inter
    gu_split = {**{s: knobs["KSPLIT_GU"] for s in range(cfg.n_active)},
                **{cfg.n_active + s: knobs["KSPLIT_SHARED"] for s in range(cfg.n_shared)}}
    split_from = cfg.n_active - knobs.get("SPLIT_PAIRS", 0)
    # (slot, matrices per unit): a split expert's two jobs, gate then up, each arrive once per (tile, K slice)
    jobs = ([(cfg.n_active + s, 2) for s in range(cfg.n_shared)] + [(r, 2) for r in range(split_from)]
            + [(r, 1) for r in range(split_from, cfg.n_active) for _ in range(2)])
    gate_up = [Unit(chunks=unit_chunks(d, split, gu_split[slot], cfg.group, warps, paired=mats == 2),
                    finish=Finish.PARTIAL, tile=(f"L{layer} gu", slot, tile), parts=gu_split[slot] * 2 // mats,
                    job=job)
               for job, (slot, mats) in enumerate(jobs)
               for tile in range(tiles_of(f)) for split in range(gu_split[slot])]
    shared_blocks = frozenset(range(cfg.n_shared * tiles_of(f) * knobs["KSPLIT_SHARED"]))
    ks = knobs["KSPLIT_DOWN"]
    n_slots = cfg.n_active + cfg.n_shared
    down_finish = Finish.COUNTED if knobs.get("ACC_COUNT", 0) else Finish.MOE_OUT
    slabs = f // 2 // SLAB_ROWS
    down = []
    for slot in range(n_slots):
        for tile in range(tiles_of(d)):
            for split in range(ks):
                k0, k1 = split * slabs // ks * 2 * SLAB_ROWS, (split + 1) * slabs // ks * 2 * SLAB_ROWS
                needs = tuple((f"L{layer} gu", slot, t) for t in range(k0 // TILE, (k1 - 1) // TILE + 1))
                down.append(Unit(chunks=unit_chunks(f, split, ks, cfg.group, warps, paired=False),
                                 finish=down_finish, tile=(f"L{layer} down", 0, tile), parts=n_slots * ks,
                                 sum_rounds=sum_rounds(n_slots * ks, warps, down_finish), needs=needs,
                                 need_rounds=swiglu_rounds(gu_split[slot], k1 - k0, warps), job=slot))
    prefetches = (Prefetch(shared_blocks, 1 if early else 2),) if knobs["PREFETCH"] else ()
    return (JobTable(units=tuple(gate_up), staging=Staging.ROUTED_EARLY if early else Staging.ROUTE,
                     prefetches=prefetches),
            JobTable(units=tuple(down), staging=None, past_previous=True))


def step_plan(cfg: KimiConfig, knobs: dict[str, int]) -> list[Phase]:
    """Every phase of one decode step, in kernel order, named as bytes_model names them ("L<i> <phase>")."""
    warps = knobs["THREADS"] // 32
    ahead = (Prefetch(),) if knobs["PREFETCH"] else ()
    out_finish = Finish.COUNTED if knobs.get("ACC_COUNT", 0) else Finish.RESIDUAL   # seeds before ACC_COUNT: 0
    phases: list[Phase] = []
    for layer, kind in enumerate(cfg.pattern):
        names = list(layer_bytes(cfg, kind, 0))
        d, ko = cfg.hidden, cfg.kda_dim if kind == "K" else cfg.mla_heads * cfg.v_head
        out_proj = JobTable(units=tuple(job_units(f"L{layer} o", ko, d, knobs["KSPLIT_O"], cfg, warps,
                                                  out_finish)), staging=Staging.FLOATS, prefetches=ahead)
        first_ahead = ahead if layer > 0 else ()
        if kind == "K":
            project = [u for job, m in enumerate("qkvg")
                       for u in job_units(f"L{layer} {m}", d, cfg.kda_dim, knobs["KSPLIT_KDA"], cfg, warps,
                                          Finish.PARTIAL, job)]
            gemv = {names[0]: (JobTable(units=tuple(project), staging=Staging.RMSNORM, prefetches=first_ahead),),
                    names[2]: (out_proj,)}
        else:
            ks = knobs["KSPLIT_MLA"]
            project = (job_units(f"L{layer} q", d, cfg.mla_q_dim, ks, cfg, warps, Finish.MLA)
                       + job_units(f"L{layer} kva", d, cfg.kv_lora + cfg.qk_rope, ks, cfg, warps, Finish.MLA, 1))
            gemv = {names[0]: (JobTable(units=tuple(project), staging=Staging.RMSNORM, prefetches=first_ahead),),
                    names[4]: (out_proj,)}
        early = kind == "K" and bool(knobs.get("ROUTE_EARLY", 0))   # absent: off (older seeds)
        gemv[names[-1]] = moe_tables(cfg, knobs, warps, layer, early)
        phases.extend(Phase(name=f"L{layer} {n}", tables=gemv.get(n, ())) for n in names
                      if not (early and n == "router+windows"))   # its stamps remain, a phase of no time
    return phases


def plan_bytes(phase: Phase) -> int:
    """Bytes the phase's chunks copy (padded tiles and groups straddled by two chunks count twice)."""
    return sum(c.bytes for t in phase.tables for u in t.units for c in u.chunks)
