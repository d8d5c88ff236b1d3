"""Build small but complete traces from real result objects (no GPU needed)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from megakernel_agent.sandbox.candidate import source_sha256
from megakernel_agent.traces.recorder import Recorder
from megakernel_agent.traces.results import (
    BuildResult,
    CheckResult,
    DeviceInfo,
    EvalResult,
    Failure,
    FailureClass,
    PhaseRow,
    PhaseTimeline,
    Resources,
    TimingResult,
)
from megakernel_agent.traces.schema import (
    Build,
    Decision,
    Environment,
    Evaluate,
    FailureEvent,
    Measure,
    Proposal,
    SessionEnd,
    SessionStart,
)

DEVICE = DeviceInfo(name="NVIDIA H200", sms=132, memory_gb=139.8, l2_mb=60.0, copy_tbs=4.26, driver="13.0",
                    cuda="13.0", torch="2.11.0", cupy="14.2.0", capability="9.0")
SEED_SRC = "// @knob A 1 {1,2}\n// seed kernel\n"


def timing(ctx: int, us: float, base: float = 15000.0) -> TimingResult:
    samples = [us * f for f in (0.99, 1.0, 1.01, 1.0, 0.995)]
    return TimingResult(ctx=ctx, steps_per_sample=20, samples_us=samples, median_us=us, spread=0.02,
                        tok_s=1e6 / us, bytes_per_step=250_000_000, achieved_tbs=250e6 / (us * 1e-6) / 1e12,
                        roofline=0.3, host_us=6.0, baseline_median_us=base, baseline_samples_us=[base] * 3,
                        speedup=base / us)


def phase_timeline(ctx: int, spans: list[float], wait: float = 1.0) -> PhaseTimeline:
    """Phases of the given spans (µs), each followed by a `wait` µs barrier but the last."""
    rows = [PhaseRow(name=f"L0 phase {i}", span_us=s, mean_us=0.8 * s, wait_us=wait if i + 1 < len(spans) else 0.0,
                     bytes=10_000_000, tbs=10e6 / (s * 1e-6) / 1e12) for i, s in enumerate(spans)]
    return PhaseTimeline(ctx=ctx, steps=7, blocks=264, rows=rows, kernel_us=sum(r.span_us + r.wait_us for r in rows))


def result(us: float | None, failure: Failure | None = None, knobs: dict | None = None,
           base: float = 15000.0) -> EvalResult:
    """Timed at 2048 (`us`) and 16384 (1.1 `us`) by a worker whose baseline took `base` µs; a build failure has
    no resources and no timing."""
    res = Resources(registers=128, local_bytes=0, static_smem=0, dynamic_smem=57568, max_threads=256, threads=256,
                    blocks_per_sm=2, blocks_fit_per_sm=2, grid=264)
    built = failure is None or failure.cls != FailureClass.build
    build = (BuildResult(ok=True, key="k", resources=res, spill_bytes=24, seconds=10.0) if built
             else BuildResult(ok=False, key="k", error=failure.message))
    return EvalResult(
        task="kimi_linear", size="full", key="k", knobs=knobs or {"A": 1}, build=build,
        check=CheckResult(passed=failure is None, seeds=[0, 5], fresh_seeds=[5]),
        timings=[timing(2048, us, base), timing(16384, us * 1.1, base)] if us else [], failure=failure,
        device=DEVICE,
    )


@dataclass
class Try:
    """One proposal of a fixture session and what became of it: timed at `us` (at 2048; 1.1x at 16384) unless it
    failed with `cls` (`slower` is a correct, timed version the rule did not keep)."""

    pid: str
    us: float | None
    knobs: dict = field(default_factory=lambda: {"A": 2})
    cls: FailureClass | None = None
    kept: bool = False
    message: str = "x"
    base: float = 15000.0
    ratio: tuple[float, float, float] | None = None   # the decision's geomean, lowest and highest bound
    retimed_us: list[float] = field(default_factory=list)   # interleaved confirmation re-timings (at 2048)


TRIES = (Try("p1", 180.0, kept=True), Try("p2", None, {"A": 1}, FailureClass.wrong),
         Try("p3", 181.0, cls=FailureClass.slower))


def session_start() -> SessionStart:
    env = Environment(device=DEVICE, python="3.12", platform="linux", project_commit="abc123")
    return SessionStart(session_id="s1", task="kimi_linear", size="full", task_spec={"context_lengths": [2048, 16384]},
                        planner="tuner", budget_s=600, environment=env)


def write_session(path: Path, finish: bool = True, phases: bool = False, tries: tuple[Try, ...] = TRIES) -> Path:
    """A seed (200 µs at 2048) and `tries` (by default a kept p1, a wrong p2 and a slower p3), each proposed on the
    best of its time; with `phases`, the seed's and p1's results carry phase timelines (the seed's at both
    contexts, p1's at 16384)."""
    with Recorder(path) as rec:
        rec.record(session_start())
        seed = result(200.0)
        if phases:
            seed.phases = [phase_timeline(2048, [40.0, 120.0]), phase_timeline(16384, [50.0, 130.0])]
        rec.record(Measure(id="seed", source_sha=source_sha256(SEED_SRC), source=SEED_SRC, result=seed))
        best, best_us = "seed", 200.0
        for t in tries:
            rec.record(Proposal(id=t.pid, parent_id=best, planner="tuner", hypothesis=f"try {t.knobs}",
                                predicted_change="-5%", source_sha=source_sha256(SEED_SRC), source=SEED_SRC,
                                knobs=t.knobs))
            failure = Failure(cls=t.cls, phase="check", message=t.message) if t.cls else None
            r = result(t.us, None if t.cls == FailureClass.slower else failure, t.knobs, t.base)
            if phases and t.pid == "p1":
                r.phases = [phase_timeline(16384, [45.0, 110.0])]
            rec.record(Build(id=t.pid, result=r.build))
            rec.record(Evaluate(id=t.pid, result=r))
            for i, us in enumerate(t.retimed_us, 1):
                rec.record(Evaluate(id=f"{t.pid}~confirm-best-{i}", result=result(best_us, knobs={})))
                rec.record(Evaluate(id=f"{t.pid}~confirm-candidate-{i}", result=result(us, knobs=t.knobs)))
            if failure is not None:
                rec.record(FailureEvent(id=t.pid, failure=failure))
            if t.kept:
                best, best_us = t.pid, t.us
            ratio, low, high = t.ratio or (None, None, None)
            rec.record(Decision(id=t.pid, kept=t.kept, rule="ratio interval > 1.01", reason="r", ratio=ratio,
                                ratio_low=low, ratio_high=high, best_id=best))
        if finish:
            rec.record(SessionEnd(best_id=best, reason="budget", summary={"line": "1 kept"}))
    return path
