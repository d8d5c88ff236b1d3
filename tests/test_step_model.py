"""The seed's work plan and its discrete-event schedule model: the plan is the kernel's work, the resources
behave as specified, and the model answers on the CPU from a recorded timeline."""

import re
from pathlib import Path

import numpy
import pytest
import simpy

from megakernel_agent.agent.cli import main
from megakernel_agent.agent.exit_codes import ExitCode
from megakernel_agent.sandbox.candidate import parse_knobs
from megakernel_agent.tasks.kimi_linear.bytes_model import phase_bytes
from megakernel_agent.tasks.kimi_linear.config import FULL
from megakernel_agent.tasks.kimi_linear.step_model import FairShare, MachineModel, StepSimulation, simulate
from megakernel_agent.tasks.kimi_linear.work_plan import (
    Chunk,
    Finish,
    JobTable,
    Phase,
    Staging,
    Unit,
    plan_bytes,
    step_plan,
    table_skew,
)

ROOT = Path(__file__).resolve().parent.parent
SEED_KNOBS = {k.name: k.default for k in parse_knobs((ROOT / "kernels/kimi_linear/seed.cu").read_text())}
FIXED = {"kda delta": 3.1, "router+windows": 2.6, "absorb q": 2.4, "attention": 30.7, "merge+absorb v": 7.5,
         "router": 2.9}


def fixed_spans(plan):
    return {p.name: FIXED[p.name.split(" ", 1)[1]] for p in plan if not p.simulated}


def one_phase(units, staging=None):
    return [Phase(name="p", tables=(JobTable(units=tuple(units), staging=staging),))]


def test_the_plan_has_the_seeds_unit_counts():
    """The kernel's own comments: 192 KDA projection units, 252 output-projection units, 243 MLA projection
    units, 288 + 36 gate/up units and 243 down units at the default knobs."""
    plan = {p.name: p for p in step_plan(FULL, SEED_KNOBS)}
    units = {name: [len(t.units) for t in p.tables] for name, p in plan.items() if p.simulated}
    assert units["L0 kda project"] == [192]
    assert units["L1 kda o_proj"] == [252] and units["L3 mla o_proj"] == [252]
    assert units["L3 mla project"] == [243]
    assert units["L2 g/u+down"] == [324, 243]
    assert not plan["L3 attention"].simulated and not plan["L0 kda delta"].simulated


@pytest.mark.parametrize("knobs", [{}, {"KSPLIT_O": 16, "KSPLIT_GU": 12, "KSPLIT_DOWN": 4, "KSPLIT_KDA": 9}])
def test_the_plan_moves_the_bytes_the_bytes_model_counts(knobs):
    """Two independent counts of one step's weight traffic agree: chunks copy each K slab of each tile exactly
    once, plus padded columns and quant groups two chunks share (a few percent), minus the bf16 rows the
    GEMV phases read outside the ring (norms, beta)."""
    plan = step_plan(FULL, {**SEED_KNOBS, **knobs})
    expected = phase_bytes(FULL, 0)
    for p in plan:
        if p.simulated:
            assert 0.98 <= plan_bytes(p) / expected[p.name] <= 1.05, p.name


def test_every_k_slab_of_every_tile_is_streamed_once():
    plan = {p.name: p for p in step_plan(FULL, {**SEED_KNOBS, "KSPLIT_O": 28, "KSPLIT_DOWN": 3})}
    slabs: dict = {}
    for table in plan["L0 g/u+down"].tables:
        for u in table.units:
            slabs[u.tile] = slabs.get(u.tile, 0) + sum(c.slabs for c in u.chunks)
    gate_up = {k: v for k, v in slabs.items() if "gu" in k[0]}
    assert len(gate_up) == 9 * 4 and set(gate_up.values()) == {2 * FULL.hidden // 32}       # both matrices
    down = {k: v for k, v in slabs.items() if "down" in k[0]}
    assert len(down) == 9 and set(down.values()) == {9 * FULL.moe_inter // 32}                # every slot


def test_split_pairs_stream_the_same_slabs_as_one_matrix_units_that_complete_their_tiles_together():
    """SPLIT_PAIRS 2 (traces/examples/kimi-split-pairs): the last two routed experts' gate/up become 144
    one-chunk units after 252 pairs, so no block carries more than 3 gate/up chunk steps instead of 4; each of
    their tiles then takes 2 x 9 arrivals. Without the knob the plan is the seed's."""
    knobs = {k: v for k, v in SEED_KNOBS.items() if k != "SPLIT_PAIRS"}
    gate_up, split = (step_plan(FULL, {**knobs, **extra})[4].tables[0] for extra in ({}, {"SPLIT_PAIRS": 2}))
    assert len(gate_up.units) == 324 and len(split.units) == 252 + 144
    assert [len(u.chunks) for u in split.units[252:]] == [1] * 144
    assert {u.parts for u in split.units[252:]} == {18} and {u.parts for u in split.units[:252]} == {9}
    streamed = [{}, {}]
    for table, slabs in zip((gate_up, split), streamed, strict=True):
        for u in table.units:
            slabs[u.tile] = slabs.get(u.tile, 0) + sum(c.slabs for c in u.chunks)
    assert streamed[0] == streamed[1]
    steps = [sum(len(u.chunks) for u in t.block_units(b, 264)) for t in (gate_up, split) for b in range(264)]
    assert max(steps[:264]) == 4 and max(steps[264:]) == 3


def test_the_down_units_start_past_the_blocks_with_an_extra_gate_up_unit():
    """As the kernel's moe_down_residual: 324 gate/up units leave blocks 0-59 with two, so down unit 0 runs on
    block 60 and the 243 down units wrap to blocks 0-38; blocks 39-59 run none. Other tables are not rotated."""
    gate_up, down = step_plan(FULL, SEED_KNOBS)[4].tables
    assert (table_skew((gate_up, down), 1, 264), table_skew((gate_up, down), 0, 264)) == (60, 0)
    assert down.block_units(60, 264, 60)[0] is down.units[0]
    counts = [len(gate_up.block_units(b, 264)) + 10 * len(down.block_units(b, 264, 60)) for b in range(264)]
    assert counts[:39] == [12] * 39 and counts[39:60] == [2] * 21 and counts[60:] == [11] * 204


def test_a_pure_stream_runs_at_the_memory_bandwidth():
    """264 blocks streaming 30 chunks each with (almost) no compute take the bytes' time at the modelled
    bandwidth, plus about one latency (the chunk probe's stream alone ran at ~4.5-4.8 TB/s)."""
    m = MachineModel(dram_order="fifo", compute_scale=1e-4, fold_us=0, fold_per_slab_us=0, issue_us=0,
                     publish_us=0, arrive_us=0, release_spread_us=0)
    chunk = Chunk(bytes=34816, slabs=8)
    units = [Unit(chunks=(chunk,) * 30, finish=Finish.PARTIAL, tile=("t", 0, b), parts=1) for b in range(264)]
    est = StepSimulation(one_phase(units), 264, 2, m, {}).run()
    floor = 264 * 30 * chunk.bytes / (m.dram_tbs * 1e6)
    assert floor <= est.kernel_us <= floor + 2 * m.dram_latency_us + 0.1


def test_copies_sharing_the_bandwidth_finish_together():
    m = MachineModel(dram_order="shared", copy_gbs=1e9, compute_scale=1e-4, fold_us=0, fold_per_slab_us=0,
                     publish_us=0, arrive_us=0, release_spread_us=0)
    units = [Unit(chunks=(Chunk(bytes=43000, slabs=1),), finish=Finish.PARTIAL, tile=("t", 0, b), parts=1)
             for b in range(2)]
    sim = StepSimulation(one_phase(units), 2, 2, m, {})
    sim.run()
    landed = [t for b in (0, 1) for what, t in sim.marks[(0, b)] if what == "c0 landed"]
    assert landed == pytest.approx([2 * 43000 / 4.3e6 + m.dram_latency_us] * 2)


@pytest.mark.parametrize("ring_offset, late", [(0, 0.0), (64, 0.0), (48, 42.0), (16, 42.0)])
def test_a_ring_copy_off_a_32_byte_sector_lands_later_by_its_size(ring_offset, late):
    """bulk_align_probe: a bulk copy into shared memory an odd multiple of 16 B past a 32-byte sector runs at about
    half rate; 32 or 64 B past is as fast as aligned. The model charges a delay per KB of each ring copy."""
    m = MachineModel(dram_order="shared", copy_gbs=1e9, compute_scale=1e-4, fold_us=0, fold_per_slab_us=0,
                     publish_us=0, arrive_us=0, release_spread_us=0, misaligned_copy_us_per_kb=0.5)
    units = [Unit(chunks=(Chunk(bytes=84 * 1024, slabs=1),), finish=Finish.PARTIAL, tile=("t", 0, 0), parts=1)]
    sim = StepSimulation(one_phase(units), 1, 1, m, {}, ring_offset=ring_offset)
    sim.run()
    landed = [t for what, t in sim.marks[(0, 0)] if what == "c0 landed"]
    assert landed == pytest.approx([84 * 1024 / 4.3e6 + m.dram_latency_us + late])


@pytest.mark.parametrize("order, expected", [("shared", [3.0, 3.0, 3.0]), ("sm_fifo", [2.0, 3.0, 2.0])])
def test_an_sm_serves_its_own_copies_in_issue_order_under_sm_fifo(order, expected):
    """Two copies of SM 0 and one of SM 1, issued together: shared, all three split the bandwidth and land together;
    sm_fifo, the SMs split it, so SM 0's second copy starts when its first has landed."""
    env = simpy.Environment()
    memory = FairShare(env, 1.0, 1e9, queued=order == "sm_fifo")
    landed = [memory.transfer(1.0, 0.0, key) for key in (0, 0, 1)]
    times = [0.0] * 3
    for i, event in enumerate(landed):
        event.callbacks.append(lambda _e, i=i: times.__setitem__(i, env.now))
    env.run()
    assert times == pytest.approx(expected)


def test_two_blocks_on_one_sm_share_its_issue_and_a_lone_short_step_pays_the_latency_floor():
    m = MachineModel(dram_latency_us=0, fold_us=0, fold_per_slab_us=0, run_start_us=0, reduce_us=0, publish_us=0,
                     arrive_us=0, release_spread_us=0, dram_tbs=1e6, copy_gbs=1e9)
    full = [Unit(chunks=(Chunk(bytes=1, slabs=8),), finish=Finish.PARTIAL, tile=("t", 0, b), parts=1) for b in (0, 1)]
    assert StepSimulation(one_phase(full), 2, 2, m, {}).run().kernel_us == pytest.approx(m.chunk_compute_us, rel=1e-3)
    short = [Unit(chunks=(Chunk(bytes=1, slabs=2),), finish=Finish.PARTIAL, tile=("t", 0, 0), parts=1)]
    assert StepSimulation(one_phase(short), 1, 2, m, {}).run().kernel_us == pytest.approx(m.slab_latency_us, rel=1e-3)


def test_a_consumer_unit_waits_for_every_k_slice_of_the_tiles_it_reads():
    m = MachineModel(release_spread_us=0)
    slow = Unit(chunks=(Chunk(bytes=34816, slabs=8),) * 6, finish=Finish.PARTIAL, tile=("gu", 0, 0), parts=2)
    fast = Unit(chunks=(Chunk(bytes=34816, slabs=8),), finish=Finish.PARTIAL, tile=("gu", 0, 0), parts=2)
    reader = Unit(chunks=(Chunk(bytes=34816, slabs=8),), finish=Finish.MOE_OUT, tile=("down", 0, 0), parts=1,
                  sum_rounds=1, needs=(("gu", 0, 0),), need_rounds=1)
    phase = [Phase(name="p", tables=(JobTable(units=(slow, fast, Unit(chunks=(), finish=Finish.PARTIAL,
                                                                         tile=("x", 0, 0), parts=1)),
                                              staging=None),
                                     JobTable(units=(Unit(chunks=(), finish=Finish.PARTIAL, tile=("y", 0, 0), parts=1),
                                                     Unit(chunks=(), finish=Finish.PARTIAL, tile=("y", 0, 1), parts=1),
                                                     reader), staging=None)))]
    sim = StepSimulation(phase, 3, 1, m, {})
    sim.run()
    slow_done = max(t for what, t in sim.marks[(0, 0)] if what == "unit done")
    ready = next(t for what, t in sim.marks[(0, 2)] if what == "input ready")
    assert ready >= slow_done > 5.0


def test_blocks_issuing_at_one_start_are_served_in_the_order_of_their_jobs():
    """At the routed phase's start every block issues its first chunks within a poll of the release; what orders
    the copies is the walk of the job table to the block's first unit (job_of): a later job, a later copy."""
    m = MachineModel(job_walk_us=0.1)
    chunk = Chunk(bytes=34816, slabs=8)
    units = [Unit(chunks=(chunk, chunk), finish=Finish.PARTIAL, tile=("gu", job, 0), parts=1, job=job)
             for job in (3, 0)]
    sim = StepSimulation(one_phase(units, Staging.ROUTE), 2, 1, m, {})
    sim.run()
    landed = [next(t for what, t in sim.marks[(0, b)] if what == "c0 landed") for b in (0, 1)]
    assert landed[0] - landed[1] > 2 * m.job_walk_us   # block 0 walks past three jobs before it issues


def test_a_block_sees_the_release_within_a_poll_unless_it_issued_a_prefetch_meanwhile():
    """Stamps: after a barrier with no prefetch every critical block was released within 0.22 µs of the first;
    the output projections' critical blocks, which issue their prefetch between arriving and waiting, 1.2-1.5."""
    m = MachineModel()
    sim = StepSimulation(step_plan(FULL, SEED_KNOBS), 264, 2, m, fixed_spans(step_plan(FULL, SEED_KNOBS)))
    sim.issued_late[7] = m.issue_us
    late = sim.release_lateness(1)
    assert late[7] >= m.issue_us and max(numpy.delete(late, 7)) <= m.release_spread_us
    assert not sim.issued_late and not sim.release_lateness(0).any()


def test_gate_up_split_into_more_or_fewer_units_than_nine_is_slower():
    """Measured on the H200: KSPLIT_GU 12 +7.0 / +8.0 µs, 7 +5.2 (tuner session, model check). With 9 slices the
    only long gate/up chains (a second unit) are on the first 60 blocks, whose first units are in the first jobs:
    their copies are served first after routing. With 12, 156 blocks carry a second unit; with 7, every routed
    block runs four chunks; those of the last jobs are served last and end the phase. (The model without the
    job walk had 12 at -1.6 and 7 at -5.1.)"""
    fixed = fixed_spans(step_plan(FULL, SEED_KNOBS))
    base = simulate(FULL, SEED_KNOBS, MachineModel(), fixed).kernel_us
    assert simulate(FULL, {**SEED_KNOBS, "KSPLIT_GU": 12}, MachineModel(), fixed).kernel_us > base + 2.0
    assert simulate(FULL, {**SEED_KNOBS, "KSPLIT_GU": 7}, MachineModel(), fixed).kernel_us > base


def test_counted_accumulator_finishes_have_no_load_round_and_shorten_the_finishing_phases():
    """ACC_COUNT (the seed's default 1 since the thirty-seventh session): the output and down projections' column
    is finished by its last add, so their units carry no sum round, and those phases get no longer."""
    counted, plain = ({**SEED_KNOBS, "ACC_COUNT": v} for v in (1, 0))
    finishing = [u for p in step_plan(FULL, counted) if p.simulated for t in p.tables for u in t.units
                 if u.tile[0].endswith((" o", " down"))]
    assert finishing and all(u.finish == Finish.COUNTED and u.sum_rounds == 0 for u in finishing)
    fixed = fixed_spans(step_plan(FULL, SEED_KNOBS))
    base, fast = (simulate(FULL, k, MachineModel(), fixed) for k in (plain, counted))
    assert fast.kernel_us < base.kernel_us
    for before, after in zip(base.phases, fast.phases, strict=True):
        if before.name.endswith(("o_proj", "g/u+down")):
            assert after.span_us <= before.span_us


def test_the_gemv_loop_knobs_scale_only_the_compute_and_absent_means_off():
    """FOLD_SPLIT and HI_BY_SUB (the seed's default 1 since the thirty-ninth session) change the chunk step's
    instructions, not the plan: each one off makes the GEMV phases no shorter and the step slower, and a seed
    that does not declare them is modelled as having them off."""
    fixed = fixed_spans(step_plan(FULL, SEED_KNOBS))
    on = {**SEED_KNOBS, "FOLD_SPLIT": 1, "HI_BY_SUB": 1}
    assert step_plan(FULL, on) == step_plan(FULL, {**on, "FOLD_SPLIT": 0, "HI_BY_SUB": 0})
    fast = simulate(FULL, on, MachineModel(), fixed)
    for knob in ("FOLD_SPLIT", "HI_BY_SUB"):
        slow = simulate(FULL, {**on, knob: 0}, MachineModel(), fixed)
        assert slow.kernel_us > fast.kernel_us
        assert all(a.span_us <= b.span_us + 1e-9 for a, b in zip(fast.phases, slow.phases, strict=True))
    older = {k: v for k, v in on.items() if k not in ("FOLD_SPLIT", "HI_BY_SUB")}
    both_off = simulate(FULL, {**on, "FOLD_SPLIT": 0, "HI_BY_SUB": 0}, MachineModel(), fixed)
    assert simulate(FULL, older, MachineModel(), fixed).kernel_us == pytest.approx(both_off.kernel_us)


def test_await_early_moves_only_the_down_units_input_wait_before_their_chunk_lands():
    """AWAIT_EARLY (a patch's knob, fortieth session): a down unit's wait for its input and its SwiGLU staging overlap
    its first chunk's flight. Only the MoE phases can change, none gets longer, and a seed that does not declare the
    knob is modelled with it off."""
    fixed = fixed_spans(step_plan(FULL, SEED_KNOBS))
    late = simulate(FULL, SEED_KNOBS, MachineModel(), fixed)
    early = simulate(FULL, {**SEED_KNOBS, "AWAIT_EARLY": 1}, MachineModel(), fixed)
    assert early.kernel_us < late.kernel_us
    for a, b in zip(early.phases, late.phases, strict=True):
        if "g/u" in a.name:
            assert a.span_us <= b.span_us + 1e-9
        else:
            assert a.span_us == pytest.approx(b.span_us)
    assert simulate(FULL, {**SEED_KNOBS, "AWAIT_EARLY": 0}, MachineModel(), fixed).kernel_us == late.kernel_us


def test_route_early_drops_the_kda_router_phases_and_issues_the_routed_chunks_before_staging():
    """ROUTE_EARLY (a patch's knob, 52nd session): the KDA layers lose their router phase (the MLA layer keeps its
    own), the shared experts' chunks go one barrier ahead, and a routed block issues at its release and stages its
    input while the chunks fly. A seed that does not declare the knob is modelled with it off."""
    names = [p.name for p in step_plan(FULL, SEED_KNOBS)]
    early_plan = step_plan(FULL, {**SEED_KNOBS, "ROUTE_EARLY": 1})
    assert [p.name for p in early_plan] == [n for n in names if not n.endswith("router+windows")]
    assert "L3 router" in [p.name for p in early_plan]
    for p in early_plan:
        if "g/u" in p.name:
            gate_up = p.tables[0]
            assert gate_up.staging == (Staging.ROUTE if p.name.startswith("L3") else Staging.ROUTED_EARLY)
            assert {f.back for f in gate_up.prefetches} == {2 if p.name.startswith("L3") else 1}
    fixed = fixed_spans(step_plan(FULL, SEED_KNOBS))
    base = simulate(FULL, SEED_KNOBS, MachineModel(), fixed)
    early = simulate(FULL, {**SEED_KNOBS, "ROUTE_EARLY": 1}, MachineModel(), fixed)
    routers = sum(e.span_us + e.wait_us for e in base.phases if e.name.endswith("router+windows"))
    assert base.kernel_us - routers < base.kernel_us - 1.0
    assert early.kernel_us < base.kernel_us - routers + 1e-6   # the MoE phases get no longer
    assert simulate(FULL, {**SEED_KNOBS, "ROUTE_EARLY": 0}, MachineModel(), fixed).kernel_us == base.kernel_us


def down_chain(loads_behind_copies: bool, defer_second: bool) -> dict[str, float]:
    """One block: a gate/up unit with one tiny chunk, then a down unit of two 4 µs chunks whose input that unit
    makes; the down unit's events (µs)."""
    m = MachineModel(dram_latency_us=0, fold_us=0, fold_per_slab_us=0, run_start_us=0, reduce_us=0, publish_us=0,
                     arrive_us=0, release_spread_us=0, swiglu_us=0, sum_round_us=0.7, dram_tbs=1.0,
                     loads_behind_copies=loads_behind_copies)
    producer = Unit(chunks=(Chunk(bytes=1, slabs=1),), finish=Finish.PARTIAL, tile=("gu", 0, 0), parts=1)
    down = Unit(chunks=(Chunk(bytes=4_000_000, slabs=8),) * 2, finish=Finish.PARTIAL, tile=("down", 0, 0), parts=1,
                needs=(("gu", 0, 0),), need_rounds=1)
    phase = [Phase(name="p", tables=(JobTable(units=(producer,), staging=None),
                                     JobTable(units=(down,), staging=None)))]
    sim = StepSimulation(phase, 1, 1, m, {}, defer_second=defer_second)
    sim.run()
    events = dict(sim.marks[(0, 0)])   # the down table's chunk events overwrite the producer's
    return {k: events[k] for k in ("c0 landed", "c0 read", "c1 landed")}


def test_loads_behind_copies_hold_a_down_units_staging_until_its_second_chunk_has_landed():
    """loads_behind_copies (off by default): the staging's round of partial loads ends no earlier than the copies
    its SM issued before it. issue_first sends both of the down unit's chunks, so the staging waits ~4 µs for the
    second; DEFER_SECOND sends the second after the staging, which then takes one round again."""
    plain, queued = down_chain(False, False), down_chain(True, False)
    deferred = down_chain(True, True)
    step = plain["c0 read"] - plain["c0 landed"] - 0.7   # the chunk step
    assert queued["c0 read"] - queued["c0 landed"] == pytest.approx(4.0 + step, abs=1e-6)
    assert deferred["c0 read"] - deferred["c0 landed"] == pytest.approx(0.7 + step, abs=1e-6)
    assert deferred["c1 landed"] >= deferred["c0 landed"] + 0.7 + 4.0 - 1e-6
    assert down_chain(False, True)["c1 landed"] > plain["c1 landed"]   # held back, it lands later


def test_the_queue_term_acts_only_where_an_sms_copies_are_served_in_turn():
    """Off by default, and DEFER_SECOND 0 is the seed's order: neither changes the seed's model. Under the default
    memory (one queue for the device) an SM's copies land back to back, so no round of loads waits for them; under
    sm_fifo they land a share's time apart and the term acts (which way the whole step moves depends on the order
    the memory then serves, as any change of one block's timing does)."""
    fixed = fixed_spans(step_plan(FULL, SEED_KNOBS))
    one = MachineModel(release_draws=1)
    base = simulate(FULL, SEED_KNOBS, one, fixed)
    assert simulate(FULL, {**SEED_KNOBS, "DEFER_SECOND": 0}, one, fixed).kernel_us == base.kernel_us
    assert simulate(FULL, SEED_KNOBS, one.model_copy(update={"loads_behind_copies": True}), fixed).kernel_us == \
        pytest.approx(base.kernel_us)
    per_sm = one.model_copy(update={"dram_order": "sm_fifo"})
    queued = per_sm.model_copy(update={"loads_behind_copies": True})
    assert simulate(FULL, SEED_KNOBS, queued, fixed).kernel_us != pytest.approx(
        simulate(FULL, SEED_KNOBS, per_sm, fixed).kernel_us, abs=0.05)


def test_the_model_of_the_seed_is_deterministic_and_moves_the_right_way():
    plan = step_plan(FULL, SEED_KNOBS)
    fixed = fixed_spans(plan)
    base = simulate(FULL, SEED_KNOBS, MachineModel(), fixed)
    assert simulate(FULL, SEED_KNOBS, MachineModel(), fixed).kernel_us == base.kernel_us
    assert len(base.phases) == 22 and sum(p.simulated for p in base.phases) == 12
    assert simulate(FULL, SEED_KNOBS, MachineModel(dram_tbs=8.0), fixed).kernel_us < base.kernel_us
    assert simulate(FULL, SEED_KNOBS, MachineModel(compute_scale=0.5), fixed).kernel_us < base.kernel_us
    free = simulate(FULL, SEED_KNOBS, MachineModel(barrier_us=0, release_spread_us=0), fixed)
    assert base.kernel_us - free.kernel_us >= 21 * MachineModel().barrier_us
    assert simulate(FULL, {**SEED_KNOBS, "PREFETCH": 0}, MachineModel(), fixed).kernel_us > base.kernel_us


def test_a_variant_plan_is_modelled_in_place_of_the_seeds():
    """What-if plans the kernel does not have yet (traces/examples/kimi-cluster-probe) go through simulate."""
    plan = step_plan(FULL, SEED_KNOBS)
    fixed = fixed_spans(plan)
    machine = MachineModel(release_draws=1)
    base = simulate(FULL, SEED_KNOBS, machine, fixed).kernel_us
    assert simulate(FULL, SEED_KNOBS, machine, fixed, plan).kernel_us == base
    no_moe = [p if not p.name.endswith("g/u+down") else Phase(name=p.name, tables=p.tables[:1]) for p in plan]
    assert simulate(FULL, SEED_KNOBS, machine, fixed, no_moe).kernel_us < base


def test_a_phase_the_model_cannot_simulate_needs_its_stamped_span():
    with pytest.raises(ValueError, match="no stamped span"):
        simulate(FULL, SEED_KNOBS, MachineModel(), {})


def test_the_model_command_runs_on_the_cpu_from_the_seeds_recorded_stamps(capsys):
    assert main(["model", "--moves", "--what-ifs", "--knob", "KSPLIT_O=16", "--set", "release_draws=1"]) == ExitCode.OK
    out = capsys.readouterr().out
    assert "Schedule model vs stamps (ctx 2048" in out and "One-knob moves" in out and "What-ifs" in out
    assert "KSPLIT_O 16 → 28" in out and "tensor-core inner loop" in out
    # the weight ring off a 32-byte sector (SMEM_BASE 48) cost the step 4 % on the H100: the model charges it
    assert re.search(r"SMEM_BASE 0 → 48 +│ +\+[1-9]", out) and re.search(r"SMEM_BASE 0 → 64 +│ +\+0\.0", out)


def test_the_model_command_reads_the_stamps_of_a_bench_json(tmp_path, capsys):
    """`bench --phases --json` writes an EvalResult; its timeline feeds the model like a trace's."""
    from megakernel_agent.traces.loader import load as load_trace
    from megakernel_agent.traces.schema import Evaluate

    trace = load_trace(ROOT / "traces/examples/kimi-scripted-history/trace.jsonl")
    result = next(e for e in trace.events if isinstance(e, Evaluate) and e.id == "p13~profile-t7").result
    (tmp_path / "bench.json").write_text(result.model_dump_json())
    assert main(["model", "--timeline", str(tmp_path / "bench.json")]) == ExitCode.OK
    assert "Schedule model vs stamps (ctx 16384" in capsys.readouterr().out


def test_the_model_command_models_a_kernel_files_declared_knobs(tmp_path, capsys):
    """A patched seed's own knob (here AWAIT_EARLY, which the seed does not declare) is modelled from its file; the
    seed itself refuses it."""
    seed = (ROOT / "kernels/kimi_linear/seed.cu").read_text()
    knob = "// @knob AWAIT_EARLY 1 {0,1} down units await their input during their chunk's flight\n"
    patched = tmp_path / "patched.cu"
    patched.write_text(seed.replace("// @knob ACC_COUNT", knob + "// @knob ACC_COUNT", 1))
    kernel = {}
    for value in (0, 1):
        argv = ["model", str(patched), "--knob", f"AWAIT_EARLY={value}", "--set", "release_draws=1"]
        assert main(argv) == ExitCode.OK
        line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("│ kernel"))
        kernel[value] = float(line.split("│")[2])
    assert kernel[1] < kernel[0]
    assert main(["model", "--knob", "AWAIT_EARLY=1"]) == ExitCode.USAGE
    assert "unknown knob(s) ['AWAIT_EARLY']" in capsys.readouterr().err


@pytest.mark.parametrize("argv, says", [
    (["model", "--set", "dram_speed=3"], "no machine field 'dram_speed'"),
    (["model", "--set", "dram_tbs=-1"], "--set dram_tbs: Input should be greater than 0"),
    (["model", "--set", "dram_order=lifo"], "--set"),
    (["model", "--timeline", "nowhere.jsonl#x"], "no file at nowhere.jsonl"),
    (["model", "--timeline", str(ROOT / "traces/examples/kimi-scripted-history/trace.jsonl#p1")],
     "has no evaluation 'p1' with a phase timeline"),
    (["model", "--timeline", str(ROOT / "README.md")], "expected TRACE#EVALUATION_ID or the JSON of `bench"),
    (["model", "--ctx", "4096"], "profiled ctx [2048, 16384], not 4096"),
    (["model", "--knob", "KSPLIT_O=5"], "KSPLIT_O"),
])
def test_bad_model_input_is_one_line_and_exit_2(capsys, argv, says):
    assert main(argv) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1


# ---- the model inside a session: the tuner's predictions and the planner's `model` tool -------------------

class Asking:
    """A planner that asks the session's tools what `ask` asks, then ends the session."""

    name = "asking"
    tools = None

    def __init__(self, ask):
        self.ask, self.said = ask, []

    def settings(self) -> dict:
        return {}

    def propose(self, view):
        from megakernel_agent.agent.planners.base import PlannerExhausted

        self.said = self.ask(self.tools)
        raise PlannerExhausted("asked")


def seed_session(tmp_path, planner, start_source=None):
    """A session on the full Kimi task from the seed's source, on a fake sandbox whose profile returns the seed's
    recorded stamps (p13 of the scripted-history example) and which times every version at 240 µs."""
    from megakernel_agent.agent.session import Session
    from megakernel_agent.tasks.registry import get_task
    from megakernel_agent.traces.loader import load as load_trace
    from megakernel_agent.traces.schema import Evaluate

    from .fake_sandbox import FakeSandbox, timed

    task = get_task("kimi_linear", "full")
    trace = load_trace(ROOT / "traces/examples/kimi-scripted-history/trace.jsonl")
    stamped = next(e for e in trace.events if isinstance(e, Evaluate) and e.id == "p13~profile-t7").result.phases

    def script(cand, opts):
        res = timed(cand, 240.0, noise=0.0)
        if opts.get("profile"):
            res.phases = stamped
        return res

    source = start_source or task.seed_source()
    session = Session(task, planner, FakeSandbox(script), 60.0, tmp_path, start_source=source)
    return session, task, stamped[0]


def three_moves_tuner():
    """The tuner, stopped after three proposals."""
    from megakernel_agent.agent.planners.base import PlannerExhausted
    from megakernel_agent.agent.planners.tuner import TunerPlanner

    class ThreeMoves(TunerPlanner):
        def propose(self, view):
            self.made = getattr(self, "made", 0) + 1
            if self.made > 3:
                raise PlannerExhausted("three moves")
            return super().propose(view)

    return ThreeMoves(seed=0)


def test_every_tuner_move_on_the_seed_carries_the_schedule_models_prediction(tmp_path):
    from megakernel_agent.traces.loader import load as load_trace

    s, task, stamped = seed_session(tmp_path, three_moves_tuner())
    s.run()
    proposals = [e for e in load_trace(tmp_path / "trace.jsonl").events if e.type == "proposal"]
    assert len(proposals) == 3
    seed = task.seed_source()
    base = task.model_step(seed, {}, stamped).kernel_us
    for p in proposals:
        delta = task.model_step(seed, p.knobs, stamped).kernel_us - base
        assert p.predicted_change.startswith(f"schedule model: {delta:+.1f} µs per step")
        assert p.predicted_us == {2048: round(240.0 + delta, 1),    # the seed's µs (the fake's, noiseless),
                                  16384: round(252.0 + delta, 1)}   # plus the modelled change
        assert p.predicted_phases   # a knob move moves some phase


def test_the_model_tool_answers_a_knob_move_and_a_what_if_and_refuses_what_it_cannot_model(tmp_path):
    def ask(tools):
        return [tools.call("model", {"version": "seed", "what_if": "tc-mma"}, "asking"),
                tools.call("profile", {"version": "seed"}, "asking"),
                tools.call("model", {"version": "seed", "knobs": {"KSPLIT_DOWN": 4}}, "asking"),
                tools.call("model", {"what_if": "tc-mma"}, "asking"),
                tools.call("model", {"what_if": "faster"}, "asking"),
                tools.call("model", {}, "asking"),
                tools.call("model", {"knobs": {"KSPLIT_DOWN": 5}}, "asking"),
                tools.call("model", {"knobs": {"ATTN_MAX_SPLITS": 64}}, "asking"),
                tools.call("model", {"knobs": {"SMEM_BASE": 48}}, "asking")]

    planner = Asking(ask)
    s, _, _ = seed_session(tmp_path, planner)
    s.run()
    unprofiled, _, move, what_if, unknown, empty, undeclared, stamped_knob, misaligned = planner.said
    # on the H200 the model "predicted" no change for ATTN_MAX_SPLITS 64 (measured +28 µs at 16K): its effect lies
    # in the attention phase the model takes from the stamps, so such a move is refused, not modelled
    assert not stamped_knob.ok and "changes one of those knobs" in stamped_knob.text
    # SMEM_BASE 48 measured 4 % slower on the H100 (the weight ring's copies off a 32-byte sector): not "0.0"
    assert misaligned.ok and re.search(r"\(\+[1-9][0-9.]*\)", misaligned.text), misaligned.text
    assert not unprofiled.ok and "profile it first" in unprofiled.text
    assert move.ok and "KSPLIT_DOWN=4" in move.text and "L0 g/u+down" in move.text
    # the probed tensor-core loop is slower than the seed's DP2A loop: the model must say so
    assert what_if.ok and what_if.summary.startswith("model of seed (tc-mma): +")
    assert not unknown.ok and "no what-if 'faster'" in unknown.text
    assert not empty.ok and "give knobs to model, or a what-if" in empty.text
    assert not undeclared.ok and "KSPLIT_DOWN" in undeclared.text


def test_the_model_tool_refuses_a_source_that_is_not_the_seeds(tmp_path):
    from megakernel_agent.tasks.registry import get_task

    def ask(tools):
        tools.call("profile", {"version": "seed"}, "asking")
        return [tools.call("model", {"knobs": {"KSPLIT_O": 16}}, "asking")]

    planner = Asking(ask)
    edited = get_task("kimi_linear", "full").seed_source() + "\n// an edit\n"
    s, _, _ = seed_session(tmp_path, planner, edited)
    s.run()
    assert "mirrors the seed's own source" in planner.said[0].text


def test_a_stamped_phase_keeps_exactly_its_stamped_span():
    """Its stamps already hold the real release spread and prefetch issue: the model adds neither."""
    plan = step_plan(FULL, SEED_KNOBS)
    fixed = fixed_spans(plan)
    est = simulate(FULL, SEED_KNOBS, MachineModel(release_draws=1), fixed)
    for p in est.phases:
        if not p.simulated:
            assert p.span_us == pytest.approx(fixed[p.name], abs=1e-6), p.name


@pytest.mark.parametrize("copy_gbs", [100.0, 1e6])
def test_shared_bandwidth_finishes_whatever_the_copy_cap(copy_gbs):
    """Float rounding of the served bytes once left a copy a hair short of done, waking for ever at one instant."""
    plan = step_plan(FULL, SEED_KNOBS)
    est = simulate(FULL, SEED_KNOBS, MachineModel(dram_order="shared", copy_gbs=copy_gbs, release_draws=1),
                   fixed_spans(plan))
    assert 150 < est.kernel_us < 400


def test_a_step_is_averaged_over_release_orders():
    plan = step_plan(FULL, SEED_KNOBS)
    fixed = fixed_spans(plan)
    one = [simulate(FULL, SEED_KNOBS, MachineModel(release_draws=1), fixed).kernel_us]
    est = simulate(FULL, SEED_KNOBS, MachineModel(release_draws=3), fixed)
    low, high = est.kernel_range_us
    assert low <= est.kernel_us <= high and low <= one[0] <= high and high > low


@pytest.mark.parametrize("size", ["small", "full"])
def test_every_declared_knob_value_simulates_on_every_config(size):
    """The small config has more K slices than slabs at the default knobs (empty slices, which the kernel still
    walks and arrives for): a model that skipped them waited for ever on the GPU host's agent test."""
    from megakernel_agent.tasks.kimi_linear.config import CONFIGS

    cfg = CONFIGS[size]
    declared = parse_knobs((ROOT / "kernels/kimi_linear/seed.cu").read_text())
    m = MachineModel(release_draws=1)
    for knob in declared:
        for value in knob.values:
            knobs = {**SEED_KNOBS, knob.name: value}
            plan = step_plan(cfg, knobs)
            est = simulate(cfg, knobs, m, fixed_spans(plan))
            assert 0 < est.kernel_us < 2000, (knob.name, value)


def test_the_tuner_foresees_only_moves_still_to_come(tmp_path):
    """Predictions are worked out ahead for the moves `upcoming` lists; a move once proposed is not predicted again,
    and a foreseen move that is no longer upcoming is dropped (its prediction cancelled if not started)."""
    from megakernel_agent.agent.session import LOOKAHEAD
    from megakernel_agent.traces.loader import load as load_trace

    planner = three_moves_tuner()
    s, _, _ = seed_session(tmp_path, planner)
    s.run()
    proposed = {("seed", tuple(sorted(p.knobs.items())))
                for p in load_trace(tmp_path / "trace.jsonl").events if p.type == "proposal"}
    assert len(proposed) == 3 and not proposed & set(planner.foreseen)
    assert 0 < len(planner.foreseen) <= LOOKAHEAD + 1
