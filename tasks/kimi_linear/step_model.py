"""A discrete-event model of one decode step of the seed megakernel: every block of the persistent grid walks
its work plan (work_plan.py) through two shared resources, device memory and its SM's issue slots.

Why: most wrong predictions in BENCHMARKS.md came from treating compute as free and a phase as one chain.
Here a phase is the maximum over the grid's block chains; each chain is its staging, its ring of chunks
(a chunk lands after its share of bandwidth and a latency, its compute shares the SM with the co-resident
block and cannot beat one slab's dependent-chain latency), its unit finishes (the last arrival of a split-K
tile reads the tile's sums) and, for down units, the wait for the gate/up tiles they read. Grid barriers release
every block a fixed time after the last arrival, each block within one poll of the barrier word, later still
if it issued the next phase's first chunks between arriving and waiting. Copies are served in issue order (the
default memory), so where every block issues at once (the routed phase's start) the order is set by the work
before the issue: the walk of the job table to the block's first unit puts the blocks of early jobs first. Two
opt-in settings, not fitted: the SMs sharing the bandwidth, each serving its copies in turn (dram_order=sm_fifo),
and rounds of L2 loads held behind the copies their SM issued before them (loads_behind_copies).

What it is fed (MachineModel): probe figures (scripts/chunk_probe.py: a chunk step's compute and fold, the
bulk-copy stream), per-event costs read off phase stamps, and, for the phases it does not simulate (KDA delta
rule, router, MLA absorb / attention / merge), their stamped spans from a recorded phase timeline. Not
modelled: L2 hits (every chunk comes from DRAM), instruction-cache misses, the stamped build's own overhead.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
import statistics
from collections import defaultdict
from collections.abc import Generator
from typing import Literal

import numpy
import simpy
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from megakernel_agent.traces.results import PhaseTimeline

from .config import KimiConfig
from .work_plan import Chunk, Finish, JobTable, Phase, Staging, Unit, step_plan, table_skew

EPS = 1e-9
# Knobs whose effect lies in the phases taken from the stamps (the launch shape, the attention's split): a move
# of one of them is not modelled, the stamps of a version that has it are needed
STAMPED_KNOBS = ("THREADS", "BLOCKS_PER_SM", "ATTN_MAX_SPLITS")
# The GEMV loop's own knobs (1: on) scale both compute figures, which were probed on the loop with both off.
# Fitted to their measured end-to-end changes against a byte-identical control (H100, BENCHMARKS.md, thirty-
# ninth session: -1.3 and -1.0 µs/token at 2K); the instructions they remove (~9 % and ~5 % of a chunk step)
# taken as compute, i.e. issue-bound, predicted -3.6 and -1.5.
LOOP_KNOB_COMPUTE = {"FOLD_SPLIT": 0.964, "HI_BY_SUB": 0.971}


class MachineModel(BaseModel):
    """Costs the model charges, µs unless named otherwise; defaults from the H200 probes and the seed's stamps
    (BENCHMARKS.md, 2026-12-05). Each one is a what-if handle: `compute_scale` 1.17 is the tensor-core loop
    probed against the DP2A loop, `barrier_us` 0 a grid with free barriers. The stamp-derived figures came from
    builds with the in-phase events on, which ran the step ~7% slower (BENCHMARKS.md, twenty-fourth session);
    not refitted. The compute figures are the DP2A loop's, from an H200 chunk probe (thirty-first session):
    against the seed's own H200 stamps at 2K the model then gives 202.3 µs for 196.3 stamped."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    sms: int = Field(132, gt=0)
    dram_tbs: float = Field(4.3, gt=0, description="device memory bandwidth shared by every copy in flight")
    copy_gbs: float = Field(40.0, gt=0, description="most one bulk copy gets when the memory is idle")
    dram_latency_us: float = Field(0.8, ge=0, description="a copy's data lands this long after its last byte")
    dram_order: Literal["fifo", "shared", "sm_fifo"] = Field("fifo", description="copies served whole one after "
                                                "another in issue order; or sharing the bandwidth equally, each up "
                                                "to copy_gbs (which with no release spread moves every block in "
                                                "lockstep: a pure stream then idles one latency a round); or shared "
                                                "equally by the SMs with copies pending, each SM's copies served in "
                                                "its issue order (an SM's second chunk lands a share's time after "
                                                "its first)")
    chunk_compute_us: float = Field(0.96, gt=0, description="a full chunk's compute with the SM's other block "
                                                            "computing one too (chunk probe of the DP2A loop on the "
                                                            "H200, 8 slabs, 2 blocks/SM; the fp16 loop's was 1.54)")
    slab_latency_us: float = Field(0.95, gt=0, description="a chunk step can never be shorter, whatever its slabs: "
                                                           "fitted at 1.5 to 50 knob moves of the fp16 loop on the "
                                                           "H200 (in the kernel a 6-slab step took as long as an "
                                                           "8-slab one), times the probe's 2-slab ratio of the DP2A "
                                                           "loop to it, 0.54 / 0.86")
    compute_scale: float = Field(1.0, gt=0, description="multiplies both compute figures (inner-loop what-ifs)")
    fold_us: float = Field(0.17, ge=0, description="fold + block barrier per chunk step, fixed part")
    fold_per_slab_us: float = Field(0.034, ge=0, description="... and per slab (probe: +0.44 at 8, +0.24 at 2)")
    run_start_us: float = Field(0.5, ge=0, description="a job table's start: staged to first chunk step (stamps)")
    issue_us: float = Field(0.25, ge=0, description="read to refill issued (stamps: 0.1-0.4)")
    reduce_us: float = Field(0.2, ge=0, description="a unit's cross-warp reduce after its last read (stamps)")
    publish_us: float = Field(0.8, ge=0, description="partial store (or accumulator add) and arrival (stamps: "
                                                     "computed to done)")
    sum_round_us: float = Field(0.7, ge=0, description="one dependent batch of partial loads from L2")
    # the last arrival's finish beyond its rounds of loads. RESIDUAL and MOE_OUT refitted to the accumulator
    # finish (H100 stamps, 2026-12-06: output projections 1.3 µs and MoE phases 0.8-2.4 µs shorter than with
    # the partial sums, fitted at 1.8 and 2.5; the MoE's slower barrier after its atomics is in that 1.0)
    # COUNTED: the column's last adder stores it. Fitted to the end-to-end change, not to stamps (H200, 2026-12-06:
    # ACC_COUNT 0 -> 1 measured -6.2 / -5.5 us/token at 2K / 16K; the first estimate, 0.1, predicted -10.8)
    epilogue_us: dict[Finish, float] = {Finish.PARTIAL: 0.0, Finish.RESIDUAL: 0.5, Finish.MLA: 2.0,
                                        Finish.MOE_OUT: 1.0, Finish.COUNTED: 0.7}
    # FLOATS: the output projection stages only its units' K slice since 85ce779 (it staged all 16 KB of o, 0.7);
    # refitted to that change's stamps (H100, 2026-12-07: mean block 3.4 -> 2.8 us, spans 5.2-5.4 -> 4.6-4.7)
    # ROUTED_EARLY: the routed table and issue (~0.3), then RMSNORM's staging in flight (see run_table)
    staging_us: dict[Staging, float] = {Staging.RMSNORM: 1.3, Staging.FLOATS: 0.15, Staging.ROUTE: 2.9,
                                        Staging.ROUTED_EARLY: 0.3}
    swiglu_us: float = Field(0.3, ge=0, description="a down unit's SwiGLU staging, besides its partial loads")
    arrive_us: float = Field(0.3, ge=0, description="last work to arrival at the grid barrier")
    barrier_us: float = Field(0.8, ge=0, description="last arrival to release (stamps: 0.67-0.86)")
    release_spread_us: float = Field(0.2, ge=0, description="a block sees a release up to this long after the "
                                                              "first, its poll of the barrier word (stamps: every "
                                                              "MoE phase's critical block, after a barrier with no "
                                                              "prefetch, released 0.06-0.22 after the first)")
    prefetch_spread_us: float = Field(1.0, ge=0, description="a block that issued the next phase's first chunks "
                                                               "between arriving and waiting sees it up to this much "
                                                               "later again: the copy issue is throttled by the "
                                                               "memory system (stamps: the output projections' "
                                                               "critical blocks released 1.2-1.5 after the first)")
    job_walk_us: float = Field(0.03, ge=0, description="per job the kernel walks past to find a unit (job_of: two "
                                                       "dependent shared loads and a multiply, ~60 cycles) before it "
                                                       "issues the unit's first chunk")
    release_draws: int = Field(4, ge=1, le=64, description="random release orders a step is averaged over (one "
                                                           "order moves a knob's modelled effect by up to ~5 µs)")
    misaligned_copy_us_per_kb: float = Field(0.025, ge=0, description="a weight-ring copy whose shared destination "
                                             "lies an odd multiple of 16 B past a 32-byte sector lands this much "
                                             "later per KB (bulk_align_probe, H100, every block copying: a 32 KB copy "
                                             "3,737 cycles at 48 B past against 2,129 aligned, +0.81 µs; at 32 or 64 B "
                                             "past as fast as aligned). The ring lies SMEM_BASE past a line (absent: "
                                             "0, the seed's placement since the fiftieth session)")
    loads_behind_copies: bool = Field(False, description="a block's rounds of L2 loads (a down unit's partials, a "
                                      "split-K finish's sums) end no earlier than every copy its SM issued before "
                                      "them has landed. Measured in a probe (twenty-third session: +0.9-1.7 µs a "
                                      "round trip with the SM's copies in flight) and in the down units' staging "
                                      "(forty-ninth: ~2 µs for one round); off by default, since the figures "
                                      "above were fitted without it")


def machine_from(settings: dict[str, object]) -> MachineModel:
    """The default machine with `settings` (field: value) applied and validated; a ValueError names the first
    bad field (the per-phase tables epilogue_us and staging_us are not settable here)."""
    fields = MachineModel.model_fields
    unknown = [k for k in settings if k not in fields or k in ("epilogue_us", "staging_us")]
    if unknown:
        settable = ", ".join(k for k in fields if k not in ("epilogue_us", "staging_us"))
        raise ValueError(f"no machine field {unknown[0]!r} (settable: {settable})")
    try:
        return MachineModel.model_validate({**MachineModel().model_dump(), **settings})
    except ValidationError as e:
        first = e.errors()[0]
        raise ValueError(f"{first['loc'][0]}: {first['msg']}") from None


class WhatIf(BaseModel):
    """A named change to the machine or the plan whose effect the model predicts."""

    key: str
    label: str
    machine: dict[str, object] = {}

    def applied_to(self, machine: MachineModel) -> MachineModel:
        """`machine` with this what-if's figures, validated."""
        return MachineModel.model_validate({**machine.model_dump(), **self.machine})


ZERO_FINISH = {f: 0.0 for f in Finish}
WHAT_IFS = (
    WhatIf(key="tc-mma", label="tensor-core inner loop (mma.sync probe: 1.37x the fp16 loop per chunk, 0.85x the "
                               "DP2A loop)", machine={"compute_scale": 1.54 / 1.37 / 0.96}),
    WhatIf(key="loop-2x", label="inner loop twice as fast (the model's lever, not the kernel's: a tensor-core loop "
                                "with a 0.73x chunk step measured no faster, BENCHMARKS.md 2026-12-07)",
           machine={"compute_scale": 0.5}),
    WhatIf(key="compute-free", label="GEMV compute free (chunk steps, their folds and latency floor cost nothing)",
           machine={"compute_scale": 0.01, "fold_us": 0.0, "fold_per_slab_us": 0.0}),
    WhatIf(key="finish-free", label="split-K finishes free (the bound of a cluster reduce, step 3)",
           machine={"sum_round_us": 0.0, "epilogue_us": ZERO_FINISH, "publish_us": 0.0}),
    WhatIf(key="barrier-free", label="grid barriers free (the bound of flags, step 3)",
           machine={"barrier_us": 0.0, "release_spread_us": 0.0, "prefetch_spread_us": 0.0}),
    WhatIf(key="finish-barrier-free", label="free finishes and free barriers together",
           machine={"sum_round_us": 0.0, "epilogue_us": ZERO_FINISH, "publish_us": 0.0, "barrier_us": 0.0,
                    "release_spread_us": 0.0, "prefetch_spread_us": 0.0}),
)


class PhaseEstimate(BaseModel):
    """One phase as the model sees it: span (first release to last arrival), the mean block's work, the wait
    after it, and the block whose arrival ended it."""

    name: str
    span_us: float
    mean_us: float
    wait_us: float
    simulated: bool
    critical_block: int | None = None


class StepEstimate(BaseModel):
    phases: list[PhaseEstimate]
    kernel_us: float
    grid: int
    kernel_range_us: tuple[float, float] | None = Field(None, description="over the release orders averaged")


class FairShare:
    """Bandwidth shared equally by the copies in flight, each capped at `cap` (processor sharing with a virtual
    clock: every copy has received the same service since it started, so a heap orders the finishes). With
    `queued`, copies of one key (an SM) are served one at a time in issue order: the share goes to the keys."""

    def __init__(self, env: simpy.Environment, capacity: float, cap: float, queued: bool = False):
        self.env, self.capacity, self.cap, self.queued = env, capacity, cap, queued
        self.served, self.at = 0.0, 0.0      # service each active copy has had since time 0, as of `at`
        self.active: list[tuple[float, int, simpy.Event, float, int]] = []   # (finish, id, landed, latency, key)
        self.waiting: dict[int, list[tuple[float, simpy.Event, float]]] = defaultdict(list)   # key -> copies behind
        self.busy: set[int] = set()          # keys with a copy in `active`
        self.ids = itertools.count()
        self.version = 0

    def rate(self) -> float:
        return min(self.cap, self.capacity / len(self.active)) if self.active else 0.0

    def _advance(self) -> None:
        self.served += self.rate() * (self.env.now - self.at)
        self.at = self.env.now

    def transfer(self, amount: float, latency: float, key: int = 0) -> simpy.Event:
        """An event that fires `latency` after the copy's last byte."""
        self._advance()
        landed = self.env.event()
        if self.queued and key in self.busy:
            self.waiting[key].append((amount, landed, latency))
        else:
            self._start(amount, landed, latency, key)
        self._plan()
        return landed

    def _start(self, amount: float, landed: simpy.Event, latency: float, key: int) -> None:
        heapq.heappush(self.active, (self.served + amount, next(self.ids), landed, latency, key))
        if self.queued:
            self.busy.add(key)

    def _plan(self) -> None:
        self.version += 1
        if self.active:
            wake = self.env.timeout(max(0.0, (self.active[0][0] - self.served) / self.rate()))
            wake.callbacks.append(functools.partial(self._wake, self.version))

    def _wake(self, version: int, _event: simpy.Event) -> None:
        if version != self.version:
            return
        self._advance()
        # `served` reaches ~1e7 bytes, where a fixed tolerance is below float resolution: a copy left a hair
        # short would wake again at the same instant for ever
        while self.active and self.active[0][0] <= self.served * (1 + 1e-12) + EPS:
            _, _, landed, latency, key = heapq.heappop(self.active)
            after = self.env.timeout(latency)
            after.callbacks.append(lambda _e, landed=landed: landed.succeed())
            if self.queued:
                self.busy.discard(key)
                if self.waiting[key]:
                    self._start(*self.waiting[key].pop(0), key)
        self._plan()


class InOrder:
    """Bandwidth given whole to one copy at a time, in issue order (a deep memory queue)."""

    def __init__(self, env: simpy.Environment, capacity: float):
        self.env, self.capacity, self.free_at = env, capacity, 0.0

    def transfer(self, amount: float, latency: float, key: int = 0) -> simpy.Event:
        """An event that fires `latency` after the copy's last byte (`key` plays no part)."""
        self.free_at = max(self.free_at, self.env.now) + amount / self.capacity
        return self.env.timeout(self.free_at - self.env.now + latency)


class IssueSlots:
    """One SM's issue slots shared by its co-resident blocks' chunk steps: each step has `work` (slabs) and
    cannot go faster than `cap` slabs per µs; the SM's capacity is water-filled over the steps running."""

    def __init__(self, env: simpy.Environment, capacity: float):
        self.env, self.capacity = env, capacity
        self.jobs: dict[int, list] = {}      # id -> [remaining work, cap, event]
        self.ids = itertools.count()
        self.at = 0.0
        self.version = 0

    def _rates(self) -> dict[int, float]:
        left, out = self.capacity, {}
        pending = sorted(self.jobs.items(), key=lambda kv: kv[1][1])
        for i, (key, (_, cap, _)) in enumerate(pending):
            out[key] = min(cap, left / (len(pending) - i))
            left -= out[key]
        return out

    def _advance(self) -> None:
        dt = self.env.now - self.at
        for key, r in self._rates().items():
            self.jobs[key][0] -= r * dt
        self.at = self.env.now

    def compute(self, work: float, cap: float) -> simpy.Event:
        self._advance()
        done = self.env.event()
        self.jobs[next(self.ids)] = [work, cap, done]
        self._plan()
        return done

    def _plan(self) -> None:
        self.version += 1
        if self.jobs:
            rates = self._rates()
            wake = self.env.timeout(max(0.0, min(self.jobs[k][0] / rates[k] for k in self.jobs)))
            wake.callbacks.append(functools.partial(self._wake, self.version))

    def _wake(self, version: int, _event: simpy.Event) -> None:
        if version != self.version:
            return
        self._advance()
        for key in [k for k, job in self.jobs.items() if job[0] <= EPS]:
            self.jobs.pop(key)[2].succeed()
        self._plan()


class StepSimulation:
    """One step of the plan on `grid` blocks; `fixed_us` gives the span of every phase the plan does not
    simulate (by phase name)."""

    def __init__(self, plan: list[Phase], grid: int, blocks_per_sm: int, machine: MachineModel,
                 fixed_us: dict[str, float], draw: int = 0, await_early: bool = False, defer_second: bool = False,
                 ring_offset: int = 0):
        missing = [p.name for p in plan if not p.simulated and p.name not in fixed_us]
        if missing:
            raise ValueError(f"no stamped span for the phases the model does not simulate: {missing}")
        self.plan, self.grid, self.m, self.fixed = plan, grid, machine, fixed_us
        # the kernel's AWAIT_EARLY: a unit's input wait before its first chunk lands. Modelled as free to overlap the
        # flight; measured, the await's round trips queue behind the SM's own copy (BENCHMARKS.md, forty-first
        # session), so this overlap is optimistic
        self.await_early = await_early
        # the kernel's DEFER_SECOND (a patch's knob, forty-ninth session): a table whose first unit awaits its input
        # issues that unit's second chunk after the input is staged, not with the first
        self.defer_second = defer_second
        # a ring copy's extra landing delay per byte where the ring starts off a 32-byte sector (SMEM_BASE)
        self.misaligned_us_per_byte = machine.misaligned_copy_us_per_kb / 1024 if ring_offset % 32 else 0.0
        self.sm_copies: dict[int, list[simpy.Event]] = defaultdict(list)   # SM -> its copies' landings
        self.env = simpy.Environment()
        bandwidth = machine.dram_tbs * 1e6                                                  # bytes per µs
        self.dram = (InOrder(self.env, bandwidth) if machine.dram_order == "fifo" else
                     FairShare(self.env, bandwidth, machine.copy_gbs * 1e3, queued=machine.dram_order == "sm_fifo"))
        self.spread = numpy.random.default_rng(draw)   # release order: deterministic per draw, new per phase
        per_sm = 2 * 8 / (machine.chunk_compute_us * machine.compute_scale)                # slabs per µs per SM
        self.slots = [IssueSlots(self.env, per_sm) for _ in range(-(-grid // blocks_per_sm))]
        self.issued_late: dict[int, float] = {}   # block -> the prefetch it issued between arrive and wait
        self.arrivals: dict[tuple, int] = defaultdict(int)
        self.tile_done: dict[tuple, simpy.Event] = defaultdict(self.env.event)
        self.prefetched: dict[tuple[int, int], list[simpy.Event]] = {}   # (phase, block) -> first chunks
        self.marks: dict[tuple[int, int], list[tuple[str, float]]] = defaultdict(list)   # (phase, block) -> events
        self.started: dict[tuple[int, int], float] = {}                 # (phase, block) -> its release

    def mark(self, phase: int, block: int, what: str) -> None:
        """Record an event of this block's phase, µs after the block's own release (as the stamps count)."""
        self.marks[(phase, block)].append((what, self.env.now - self.started[(phase, block)]))

    # --- the pieces of a block's chain ---
    def sm_of(self, block: int) -> int:
        return block % len(self.slots)

    def fetch(self, block: int, chunk: Chunk) -> simpy.Event:
        latency = self.m.dram_latency_us + chunk.bytes * self.misaligned_us_per_byte
        landed = self.dram.transfer(chunk.bytes, latency, self.sm_of(block))
        if self.m.loads_behind_copies:
            self.sm_copies[self.sm_of(block)].append(landed)
        return landed

    def load_rounds(self, block: int, rounds: int) -> Generator:
        """`rounds` dependent rounds of L2 loads; with loads_behind_copies each ends no earlier than the landing of
        every copy the block's SM had issued when it started."""
        for _ in range(rounds):
            end = self.env.now + self.m.sum_round_us
            if self.m.loads_behind_copies:
                sm = self.sm_of(block)
                queued = self.sm_copies[sm] = [e for e in self.sm_copies[sm] if not e.processed]
                if queued:
                    yield simpy.AllOf(self.env, queued)
            yield self.env.timeout(max(0.0, end - self.env.now))

    def compute(self, block: int, chunk: Chunk) -> simpy.Event:
        if not chunk.slabs:
            return self.env.timeout(0.0)
        floor = self.m.slab_latency_us * self.m.compute_scale
        # the block scheduler deals a launch's blocks out one per SM before it doubles up: block b shares its SM
        # with b + SMs + d, d in {-6, 0, 1, 2} on an H100 (cluster_probe.py --placement); b + SMs stands for it
        return self.slots[self.sm_of(block)].compute(chunk.slabs, chunk.slabs / floor)

    def walk(self, unit: Unit) -> float:
        """The kernel's walk of the job table to the unit's job (job_of), before it issues the unit's first chunk."""
        return unit.job * self.m.job_walk_us

    def holds_second(self, chunks: list[tuple[Unit, bool, bool, Chunk]]) -> bool:
        """Whether issue_first holds back the second chunk (DEFER_SECOND: it is the awaiting first unit's own)."""
        return self.defer_second and len(chunks) > 1 and bool(chunks[0][0].needs) and not chunks[1][2]

    def issue_first(self, block: int, chunks: list[tuple[Unit, bool, bool, Chunk]]) -> Generator:
        """A table's first two chunks issued at its start, as issue_first does: each unit's first after the walk to
        its job (the second held back where holds_second). Returns their landing events."""
        landed = []
        for unit, _, first, chunk in chunks[:1] if self.holds_second(chunks) else chunks[:2]:
            if first and unit.job:
                yield self.env.timeout(self.walk(unit))
            landed.append(self.fetch(block, chunk))
        return landed

    def finish(self, block: int, unit: Unit) -> Generator:
        yield self.env.timeout(self.m.reduce_us + self.m.publish_us)
        self.arrivals[unit.tile] += 1
        if self.arrivals[unit.tile] == unit.parts:
            self.tile_done[unit.tile].succeed()
            if unit.finish != Finish.PARTIAL:
                yield from self.load_rounds(block, unit.sum_rounds)
                yield self.env.timeout(self.m.epilogue_us[unit.finish])

    def await_input(self, phase: int, block: int, unit: Unit) -> Generator:
        """A down unit's wait for the gate/up tiles it reads, then its SwiGLU staging from their partials."""
        yield simpy.AllOf(self.env, [self.tile_done[t] for t in unit.needs])
        self.mark(phase, block, "input ready")
        yield from self.load_rounds(block, unit.need_rounds)
        yield self.env.timeout(self.m.swiglu_us)

    def run_table(self, block: int, phase: int, table: JobTable, skew: int) -> Generator:
        units = table.block_units(block, self.grid, skew)
        chunks = [(u, i == len(u.chunks) - 1, i == 0, c) for u in units for i, c in enumerate(u.chunks)]
        if table.staging is not None:
            yield self.env.timeout(self.m.staging_us[table.staging])
        landed = self.prefetched.pop((phase, block), None)
        held = landed is None and self.holds_second(chunks)
        if landed is None:
            landed = yield from self.issue_first(block, chunks)
        if table.staging == Staging.ROUTED_EARLY:   # the input is staged after the first issue
            yield self.env.timeout(self.m.staging_us[Staging.RMSNORM])
        if table.staging is not None:
            self.mark(phase, block, "staged")
        if chunks:
            yield self.env.timeout(self.m.run_start_us)
        for i, (unit, last, first, chunk) in enumerate(chunks):
            awaits = first and unit.needs
            if awaits and self.await_early:
                yield from self.await_input(phase, block, unit)
            yield landed[i]
            self.mark(phase, block, f"c{i} landed")
            if awaits and not self.await_early:
                yield from self.await_input(phase, block, unit)
            if held and i == 0:
                landed.append(self.fetch(block, chunks[1][3]))
            yield self.compute(block, chunk)
            yield self.env.timeout(self.m.fold_us + self.m.fold_per_slab_us * chunk.slabs)
            if i + 2 < len(chunks) and chunks[i + 2][2] and chunks[i + 2][0].job:   # next_chunk walks to its unit
                yield self.env.timeout(self.walk(chunks[i + 2][0]))
            self.mark(phase, block, f"c{i} read")
            if i + 2 < len(chunks):
                yield self.env.timeout(self.m.issue_us)
                landed.append(self.fetch(block, chunks[i + 2][3]))
            if last:
                yield from self.finish(block, unit)
                self.mark(phase, block, "unit done")

    def prefetch(self, block: int, phase: int) -> None:
        """At this block's arrival ending `phase`: issue the first two chunks of any table prefetched here."""
        for target in (phase + 1, phase + 2):
            if target >= len(self.plan) or not self.plan[target].tables:
                continue
            table = self.plan[target].tables[0]
            chosen = table.prefetch_of(block)
            if chosen is None or target - phase != chosen.back:
                continue
            first = [(u, i == 0, c) for u in table.block_units(block, self.grid) for i, c in enumerate(u.chunks)][:2]
            if first:
                # issued at the arrival; the walk and the issue delay the block's wait
                self.prefetched[(target, block)] = [self.fetch(block, c) for _, _, c in first]
                self.issued_late[block] = self.m.issue_us + sum(self.walk(u) for u, head, _ in first if head)

    def release_lateness(self, phase: int) -> numpy.ndarray:
        """How long after the release each block starts the phase: its poll of the barrier word, and for a block that
        issued a prefetch between arriving and waiting, that issue, throttled by the memory system."""
        if not phase:
            return numpy.zeros(self.grid)   # the launch
        poll = self.spread.uniform(0.0, self.m.release_spread_us, self.grid)
        throttled = self.spread.uniform(0.0, self.m.prefetch_spread_us, self.grid)
        issued = [self.issued_late.pop(b, None) for b in range(self.grid)]
        return numpy.array([p if i is None else p + i + t for p, i, t in zip(poll, issued, throttled, strict=True)])

    def block(self, block: int, phase: int, release: simpy.Event, late: float, arrived: list[float],
              arrival: list[float]) -> Generator:
        """One block's phase. A stamped span already holds the real release spread and prefetch issue: those
        phases start every block at the release and end at release + span."""
        yield release
        spec = self.plan[phase]
        if spec.simulated:
            yield self.env.timeout(late)
        start = self.started[(phase, block)] = self.env.now
        if spec.simulated:
            for i, table in enumerate(spec.tables):
                yield from self.run_table(block, phase, table, table_skew(spec.tables, i, self.grid))
            yield self.env.timeout(self.m.arrive_us)
        else:
            yield self.env.timeout(self.fixed[spec.name])
        self.prefetch(block, phase)
        arrived[block], arrival[block] = self.env.now - start, self.env.now

    def run(self) -> StepEstimate:
        out: list[PhaseEstimate] = []
        release_at = 0.0
        for p, spec in enumerate(self.plan):
            release = self.env.event()
            arrived, arrival = [0.0] * self.grid, [0.0] * self.grid
            late = self.release_lateness(p)
            procs = [self.env.process(self.block(b, p, release, late[b], arrived, arrival)) for b in range(self.grid)]
            release.succeed()
            try:
                self.env.run(until=simpy.AllOf(self.env, procs))
            except RuntimeError as e:   # simpy: nothing left to happen, some block still waits
                stuck = [b for b, proc in enumerate(procs) if not proc.triggered]
                raise ValueError(f"the plan deadlocks in {spec.name}: blocks {stuck[:8]} wait for work that never "
                                 "comes (a model bug: please report it)") from e
            span = self.env.now - release_at
            wait = self.m.barrier_us if p + 1 < len(self.plan) else 0.0
            crit = max(range(self.grid), key=arrival.__getitem__)   # the last to arrive, as the stamps pick it
            out.append(PhaseEstimate(name=spec.name, span_us=span, mean_us=statistics.fmean(arrived), wait_us=wait,
                                     simulated=spec.simulated, critical_block=crit if spec.simulated else None))
            if wait:
                self.env.run(until=self.env.now + wait)
            release_at = self.env.now
        return StepEstimate(phases=out, kernel_us=sum(e.span_us + e.wait_us for e in out), grid=self.grid)


def stamped_spans(timeline: PhaseTimeline) -> dict[str, float]:
    """Each stamped phase's span: what the model takes for the phases it does not simulate."""
    return {r.name: r.span_us for r in timeline.rows}


def simulate(cfg: KimiConfig, knobs: dict[str, int], machine: MachineModel, fixed_us: dict[str, float],
             plan: list[Phase] | None = None) -> StepEstimate:
    """Model one step of the seed with these knob values (every knob the plan reads must be given), averaged
    over `machine.release_draws` random release orders. `plan`: a variant of the seed's plan to model instead
    (what-ifs the kernel does not have yet; the knobs still give the launch shape)."""
    plan = plan if plan is not None else step_plan(cfg, knobs)
    per_sm = knobs["BLOCKS_PER_SM"]
    loop = math.prod(f for k, f in LOOP_KNOB_COMPUTE.items() if knobs.get(k, 0))   # absent: off (older seeds)
    machine = machine.model_copy(update={"compute_scale": machine.compute_scale * loop})
    early = bool(knobs.get("AWAIT_EARLY", 0))   # patches' knobs; absent: off (the seed has neither)
    defer = bool(knobs.get("DEFER_SECOND", 0))
    ring = knobs.get("SMEM_BASE", 0)
    draws = [StepSimulation(plan, machine.sms * per_sm, per_sm, machine, fixed_us, d, early, defer, ring).run()
             for d in range(machine.release_draws)]
    return averaged(draws)


def averaged(draws: list[StepEstimate]) -> StepEstimate:
    """Spans, means and kernel time averaged over draws; the critical blocks are the first draw's, the kernel
    time's range over the draws is kept."""
    phases = [first.model_copy(update={"span_us": statistics.fmean(d.phases[i].span_us for d in draws),
                                       "mean_us": statistics.fmean(d.phases[i].mean_us for d in draws)})
              for i, first in enumerate(draws[0].phases)]
    kernel = [d.kernel_us for d in draws]
    return StepEstimate(phases=phases, kernel_us=statistics.fmean(kernel), grid=draws[0].grid,
                        kernel_range_us=(min(kernel), max(kernel)))
