"""The phase timeline from hand-made stamps: spans, waits, events, the stamp contract's checks, the
medians and bytes of a timeline, the Kimi task's phases and their bytes, how a profile runs its steps
(on a stand-in for a stamped build), and bench's phase table."""

import math

import pytest
import torch
from rich.console import Console

from megakernel_agent.agent.session_tools import timeline_text
from megakernel_agent.sandbox.phases import (
    EVENT_NAMES,
    EVENT_WORDS,
    MAX_STAMP_BLOCKS,
    MAX_STAMPS,
    N_EVENTS,
    STAMP_WORDS,
    PhaseStampError,
    StepPhase,
    check_stamps,
    phase_timeline,
    stamp_area,
    step_phases,
)
from megakernel_agent.sandbox.profile import profile_phases
from megakernel_agent.sandbox.report import phase_table, print_eval
from megakernel_agent.tasks.kimi_linear.bytes_model import phase_bytes
from megakernel_agent.tasks.kimi_linear.config import FULL, SMALL
from megakernel_agent.tasks.kimi_linear.task import KimiTask
from megakernel_agent.tasks.w4a16_gemv.task import GemvTask
from megakernel_agent.traces.results import PhaseTimeline

from .trace_fixtures import phase_timeline as timeline_of_spans
from .trace_fixtures import result

US = 1000                      # stamps are in ns
EPOCH = 1_760_000_000 * 10**9   # %globaltimer counts ns since the epoch: too large for exact doubles


def two_phase_stamps():
    """Three blocks, two phases. Rows: start, arrive0, release0, end (µs, per block); the rest unstamped."""
    rows = [[0, 0, 1], [10, 12, 20], [21, 22, 23], [30, 31, 40]]
    t = torch.zeros(8, 4, dtype=torch.int64)
    t[:4, :3] = torch.tensor(rows) * US + EPOCH
    return t


def no_events():
    return torch.zeros(2, N_EVENTS, 4, dtype=torch.int64)


def test_spans_and_waits_add_up_to_the_kernel_time():
    (p0, p1) = step_phases(two_phase_stamps(), no_events(), blocks=3, phases=2)
    assert (p0.span, p0.wait) == (20.0, 1.0)            # last arrival 20 - first start 0; first release 21
    assert (p1.span, p1.wait) == (19.0, 0.0)            # last arrival 40 - first release 21
    assert math.isclose(p0.mean, (10 + 12 + 19) / 3) and math.isclose(p1.mean, (9 + 9 + 17) / 3)
    assert p0.span + p0.wait + p1.span == 40.0          # = the last block's end
    assert p0.events == {} and p1.critical == {"released": 2.0, "arrived": 17.0}   # block 2 arrives last


def test_events_are_averaged_over_the_blocks_that_stamped_them_and_read_for_the_critical_block():
    events = no_events()
    events[1, EVENT_NAMES.index("staged"), :3] = torch.tensor([25, 26, 27]) * US + EPOCH
    events[1, EVENT_NAMES.index("done"), 2] = 38 * US + EPOCH
    events[1, EVENT_NAMES.index("c1 landed"), :2] = torch.tensor([24, 25]) * US + EPOCH
    p1 = step_phases(two_phase_stamps(), events, blocks=3, phases=2)[1]
    assert p1.events == {"staged": 4.0, "done": 15.0, "c1 landed": 3.0}   # from each block's release (21, 22, 23)
    assert p1.critical == {"released": 2.0, "staged": 4.0, "done": 15.0, "arrived": 17.0}
    assert EVENT_NAMES[4:7] == ("c0 landed", "c0 read", "c0 issued") and N_EVENTS == 4 + 3 * 6


def test_stamps_must_fit_the_phases_the_task_names():
    stamps = two_phase_stamps()
    check_stamps(stamps, blocks=3, phases=2)
    with pytest.raises(PhaseStampError, match="fewer phases"):
        check_stamps(stamps, blocks=3, phases=3)
    with pytest.raises(PhaseStampError, match="more phases"):
        check_stamps(stamps, blocks=3, phases=1)
    with pytest.raises(PhaseStampError, match=r"blocks \[3\] have no start stamp"):
        check_stamps(stamps, blocks=4, phases=2)        # block 3 never ran
    with pytest.raises(PhaseStampError, match="do not fit"):
        check_stamps(stamps, blocks=3, phases=MAX_STAMPS // 2 + 1)


def test_the_stamp_area_is_the_end_of_the_scratch_buffer():
    scratch = torch.zeros(40 + 8 * (STAMP_WORDS + EVENT_WORDS), dtype=torch.uint8)
    words = scratch[40:].view(torch.int64)
    words[3 * MAX_STAMP_BLOCKS + 5] = 7                                   # stamps[3][5]
    words[STAMP_WORDS + (2 * N_EVENTS + 1) * MAX_STAMP_BLOCKS + 9] = 11   # events[2][1][9]
    stamps, events = stamp_area(scratch)
    assert stamps.shape == (MAX_STAMPS, MAX_STAMP_BLOCKS) and events.shape == (MAX_STAMPS // 2, N_EVENTS, 1024)
    assert stamps[3, 5] == 7 and events[2, 1, 9] == 11 and int(stamps.sum() + events.sum()) == 18
    with pytest.raises(PhaseStampError, match="PHASE_STAMPS"):
        stamp_area(scratch[: 8 * STAMP_WORDS])


def test_a_timeline_takes_medians_over_steps_and_rates_bytes_over_spans():
    def step(span0, wait0, span1, staged=None):
        events = {} if staged is None else {"staged": staged}
        return [StepPhase(span0, span0 / 2, wait0, events, {"released": 0.0, "arrived": span0}),
                StepPhase(span1, span1 / 2, 0.0, {}, {"released": 1.0, "arrived": span1})]

    steps = [step(10.0, 1.0, 20.0, 3.0), step(12.0, 3.0, 22.0), step(11.0, 2.0, 90.0, 5.0)]
    tl = phase_timeline(2048, ["a", "b"], [11_000_000, 4_400_000], blocks=264, steps=steps)
    a, b = tl.rows
    assert (a.span_us, a.mean_us, a.wait_us, b.span_us) == (11.0, 5.5, 2.0, 22.0)
    assert a.tbs == pytest.approx(1.0) and b.tbs == pytest.approx(0.2)   # 11 MB in 11 µs, 4.4 MB in 22 µs
    assert a.events == {"staged": 4.0} and b.events == {}                 # over the steps that have it
    assert list(a.critical) == ["released", "arrived"] and a.critical["arrived"] == 11.0
    assert (tl.ctx, tl.steps, tl.blocks, tl.kernel_us) == (2048, 3, 264, 11.0 + 2.0 + 22.0)
    with pytest.raises(ValueError, match="names"):
        phase_timeline(2048, ["a"], [1], blocks=264, steps=steps)


def test_a_timeline_says_whether_its_steps_ran_alone_or_chained():
    steps = [[StepPhase(10.0, 5.0, 0.0, {}, {"released": 0.0, "arrived": 10.0})]] * 2
    alone = phase_timeline(2048, ["a"], [1], blocks=264, steps=steps)
    chained = phase_timeline(2048, ["a"], [1], blocks=264, steps=steps, chained=True)
    assert (alone.steps_kind, chained.steps_kind) == ("isolated", "chained")
    old = alone.model_dump()
    del old["chained"]   # a trace written before the field: its profiles ran each step alone
    assert PhaseTimeline.model_validate(old).steps_kind == "isolated"
    text = timeline_text(alone)
    assert "over 2 isolated steps" in text and "the timed compare decides" in text
    assert "over 2 chained steps (264 blocks)\n" in timeline_text(chained)
    console = Console(record=True, width=200)
    console.print(phase_table(chained))
    assert "medians of 2 chained steps" in console.export_text()


@pytest.mark.parametrize("size", ["full", "small"])
def test_kimi_phases_are_the_kernels_and_their_bytes_add_up_to_the_step(size):
    task = KimiTask(size)
    names = task.phase_names()
    assert len(names) == 3 * 5 + 7 and names[:2] == ["L0 kda project", "L0 kda delta"]
    assert names[-7:] == [f"L3 {n}" for n in ("mla project", "absorb q", "attention", "merge+absorb v",
                                               "mla o_proj", "router", "g/u+down")]
    for ctx in task.spec.context_lengths:
        assert sum(task.phase_bytes(ctx)) == task.spec.bytes_per_step[ctx]
        assert min(task.phase_bytes(ctx)) > 0


def test_the_split_keeps_the_bytes_model_total_and_only_attention_grows_with_context():
    # the model's totals before it was split by phase
    assert sum(phase_bytes(FULL, 2048).values()) == 243382912
    assert sum(phase_bytes(FULL, 16384).values()) == 259897984
    assert sum(phase_bytes(SMALL, 300).values()) == 3334464
    short, long = phase_bytes(FULL, 2048), phase_bytes(FULL, 16384)
    grown = {k: long[k] - short[k] for k in short if long[k] != short[k]}
    assert grown == {"L3 attention": (16384 - 2048) * (FULL.kv_lora + FULL.qk_rope) * 2}


def test_the_smoke_task_declares_no_phases():
    task = GemvTask("small")
    assert task.phase_names() == [] and task.phase_bytes(0) == []


def test_bench_prints_the_phase_table_of_each_profiled_context():
    res = result(200.0)
    res.phases = [timeline_of_spans(2048, [40.0, 120.0]), timeline_of_spans(16384, [50.0, 130.0])]
    console = Console(record=True, width=200)
    print_eval(res, console)
    text = console.export_text()
    assert "phase timeline at ctx 2048: kernel 161.0 µs" in text and "at ctx 16384: kernel 181.0 µs" in text
    assert "L0 phase 1 " in text and text.count("│ total ") == 2


class StampingModel:
    """Stands in for a stamped build: each step stamps `phases` phases of 2 blocks (phase i takes 10 + i µs,
    each barrier 1 µs); its first step also leaves a stray row behind, as a previous kernel's stamps would."""

    def __init__(self, phases: int):
        self.phases, self.inputs = phases, []
        self._scratch = None

    def step(self, hidden, state):
        if self._scratch is None:
            self._scratch = torch.zeros(8 * (STAMP_WORDS + EVENT_WORDS), dtype=torch.uint8)
            stamp_area(self._scratch)[0][2 * self.phases, :2] = 1
        stamps, _ = stamp_area(self._scratch)
        clock = EPOCH
        for row in range(2 * self.phases):
            clock += (10 + row // 2) * US if row % 2 else US * (row > 0)
            stamps[row, :2] = clock
        self.inputs.append(float(hidden[0]))
        return hidden + 1000.0, state


class TokenTask:
    def phase_names(self):
        return ["a", "b"]

    def phase_bytes(self, ctx):
        return [11_000_000, 22_000_000]

    def make_inputs(self, seed, ctx, device):
        return torch.tensor([float(seed)]), []

    def make_token(self, seed, device):
        return torch.tensor([float(seed)])

    def rewind(self, state, ctx):
        return state

    def scratch(self, model):
        return model._scratch


def test_profiling_feeds_fresh_tokens_and_reads_each_steps_own_stamps(monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    model = StampingModel(phases=2)
    tl = profile_phases(TokenTask(), model, ctx=300, grid=2, device=torch.device("cpu"), steps=3)
    assert model.inputs == [0.0, 0.0, 1.0, 2.0, 3.0, 4.0]   # a token per step, never the previous output
    # the first step's stray row was cleared before the profiled steps ("more phases" otherwise)
    assert [(r.span_us, r.wait_us) for r in tl.rows] == [(10.0, 1.0), (11.0, 0.0)]
    assert [r.tbs for r in tl.rows] == [pytest.approx(1.1), pytest.approx(2.0)]
    assert (tl.ctx, tl.steps, tl.blocks, tl.kernel_us) == (300, 3, 2, 22.0)
    # a schedule with another number of barriers (a candidate merged two phases): numbered, no bytes
    other = profile_phases(TokenTask(), StampingModel(phases=1), ctx=300, grid=2, device=torch.device("cpu"))
    assert [r.name for r in other.rows] == ["phase 1"] and other.rows[0].bytes == 0
