"""Build small but complete traces from real result objects (no GPU needed)."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from sandbox.candidate import source_sha256
from traces.recorder import Recorder
from traces.results import (
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
from traces.schema import (
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
    """Timed at 2048 (`us`) and 16384 (1.1 `us`) against a baseline of `base` µs; a build failure has no
    resources."""
    res = Resources(registers=128, local_bytes=0, static_smem=0, dynamic_smem=57568, max_threads=256, threads=256,
                    blocks_per_sm=2, blocks_fit_per_sm=2, grid=264)
    built = failure is None or failure.cls != FailureClass.build
    return EvalResult(
        task="kimi_linear", size="full", key="k", knobs=knobs or {"A": 1},
        build=BuildResult(ok=True, key="k", resources=res, spill_bytes=16, seconds=10.0) if built else
        BuildResult(ok=False, key="k", error=failure.message),
        check=CheckResult(passed=failure is None, seeds=[0, 5], fresh_seeds=[5]),
        timings=[timing(2048, us, base), timing(16384, us * 1.1, base)] if us else [], failure=failure,
        device=DEVICE,
    )


class Step(NamedTuple):
    """One proposal of a fixture session and what became of it."""

    pid: str
    knobs: dict
    us: float | None
    fcls: FailureClass | None = None
    kept: bool = False
    base: float = 15000.0          # the baseline this attempt's worker timed
    message: str = "x"             # its failure's message
    interval: tuple[float, float, float] | None = None   # the decision's ratio, low and high
    confirm_us: float | None = None   # a kept one's confirmation re-timing


STEPS = (Step("p1", {"A": 2}, 180.0, kept=True), Step("p2", {"A": 1}, None, FailureClass.wrong),
         Step("p3", {"A": 2}, 181.0, FailureClass.slower))


def write_session(path: Path, finish: bool = True, phases: bool = False, steps: tuple[Step, ...] = STEPS) -> Path:
    """A seed and `steps` (by default a kept proposal p1, a wrong one and a slower one); with `phases`, the seed's
    and p1's results carry phase timelines (the seed's at both contexts, p1's at 16384)."""
    with Recorder(path) as rec:
        rec.record(session_start())
        seed = result(200.0)
        if phases:
            seed.phases = [phase_timeline(2048, [40.0, 120.0]), phase_timeline(16384, [50.0, 130.0])]
        rec.record(Measure(id="seed", source_sha=source_sha256(SEED_SRC), source=SEED_SRC, result=seed))
        best = "seed"
        for step in steps:
            best = _record_step(rec, step, best, phases)
        if finish:
            rec.record(SessionEnd(best_id=best, reason="budget", summary={"line": "1 kept"}))
    return path


def session_start() -> SessionStart:
    env = Environment(device=DEVICE, python="3.12", platform="linux", project_commit="abc123")
    return SessionStart(session_id="s1", task="kimi_linear", size="full", task_spec={"context_lengths": [2048, 16384]},
                        planner="tuner", budget_s=600, environment=env)


def _record_step(rec: Recorder, step: Step, best: str, phases: bool) -> str:
    """Record one step's events; returns the best after it."""
    pid, fcls = step.pid, step.fcls
    rec.record(Proposal(id=pid, parent_id=best, planner="tuner", hypothesis=f"try {step.knobs}",
                        predicted_change="-5%", source_sha=source_sha256(SEED_SRC), source=SEED_SRC,
                        knobs=step.knobs))
    failure = Failure(cls=fcls, phase="check", message=step.message) if fcls is not None else None
    r = result(step.us, failure if fcls != FailureClass.slower else None, step.knobs, step.base)
    if phases and pid == "p1":
        r.phases = [phase_timeline(16384, [45.0, 110.0])]
    rec.record(Build(id=pid, result=r.build))
    rec.record(Evaluate(id=pid, result=r))
    if step.confirm_us:
        rec.record(Evaluate(id=f"{pid}~confirm-candidate-1", result=result(step.confirm_us, knobs=step.knobs)))
    if failure is not None:
        rec.record(FailureEvent(id=pid, failure=failure))
    best = pid if step.kept else best
    ratio, low, high = step.interval or (None, None, None)
    rec.record(Decision(id=pid, kept=step.kept, rule="ratio interval > 1.01", reason="r", ratio=ratio, ratio_low=low,
                        ratio_high=high, best_id=best))
    return best
