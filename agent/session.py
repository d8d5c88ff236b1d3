"""A time-boxed optimization session: measure, then propose -> build -> evaluate -> keep or revert.

Every step is recorded the moment it happens. The session ends within its budget (every phase
timeout is capped by what is left, a hung kernel is killed at the deadline), on Ctrl-C, or when the
planner has nothing left to try; it then writes best.cu, the trace's session_end and a report.
"""

from __future__ import annotations

import os
import platform
import re
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from pydantic import BaseModel

from sandbox.candidate import Candidate, parse_knobs, with_knob_defaults
from tasks.base import ROOT, Task
from traces.loader import Trace
from traces.recorder import Recorder
from traces.results import EvalResult, Failure, FailureClass
from traces.schema import (
    Build,
    Decision,
    Environment,
    Evaluate,
    FailureEvent,
    LlmUsage,
    Measure,
    PlannerError,
    Proposal,
    SessionEnd,
    SessionStart,
)

from .budget import Budget
from .decision import RULE, judge
from .planners.base import AttemptSummary, Planner, PlannerExhausted, PlannerFailure, PlannerView

END_MARGIN_S = 5.0          # stop proposing when less than this is left
MAX_PLANNER_FAILURES = 5    # consecutive planner failures that end the session


class StartError(RuntimeError):
    """The starting kernel is not correct (or could not be evaluated): nothing to optimize from."""


@dataclass
class Version:
    id: str
    source: str
    knobs: dict[str, int]
    result: EvalResult


class SessionSummary(BaseModel):
    best_id: str
    reason: str
    tried: int
    kept: int
    failed_by_class: dict[str, int]
    seed_us: dict[int, float]
    best_us: dict[int, float]
    baseline_us: dict[int, float]
    seconds_by_phase: dict[str, float]
    llm_cost_usd: float = 0.0


def project_commit() -> str:
    """The commit the code under test comes from: MK_PROJECT_COMMIT when the caller states it (a copied
    tree's .git can be stale), else git's HEAD, marked "-dirty" when tracked files differ from it."""
    stated = os.environ.get("MK_PROJECT_COMMIT")
    if stated:
        return stated
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10)
        if head.returncode != 0 or not re.fullmatch(r"[0-9a-f]{40}", head.stdout.strip()):
            return "unknown"
        diff = subprocess.run(["git", "diff", "--quiet", "HEAD", "--"], cwd=ROOT, capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head.stdout.strip() + ("-dirty" if diff.returncode != 0 else "")


def environment(device) -> Environment:
    commit = project_commit()
    packages = {}
    for name in ("pydantic", "anthropic", "tenacity", "rich", "matplotlib"):
        try:
            packages[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            packages[name] = "absent"
    return Environment(device=device, python=sys.version.split()[0], platform=platform.platform(terse=True),
                       project_commit=commit, packages=packages)


def _us(res: EvalResult) -> dict[int, float]:
    return {t.ctx: t.median_us for t in res.timings}


class Session:
    def __init__(self, task: Task, planner: Planner, evaluator, budget_s: float, out_dir: Path,
                 start_source: str | None = None, start_knobs: dict[str, int] | None = None,
                 resume: Trace | None = None, on_progress=None):
        self.task, self.planner, self.ev = task, planner, evaluator
        self.budget = Budget(budget_s)
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.resume = resume
        self.trace_path = Path(resume.path) if resume else self.out_dir / "trace.jsonl"
        self.start_source = start_source if start_source is not None else task.seed_source()
        self.start_knobs = dict(start_knobs or {})
        self.on_progress = on_progress or (lambda **_: None)
        self.history: list[AttemptSummary] = []
        self.phase_seconds: Counter = Counter()
        self.llm_total = LlmUsage(model="", calls=0)
        self.counter = 0
        self.best: Version | None = None
        self.seed: Version | None = None
        self.rec: Recorder | None = None
        self.planner.on_error = self._planner_error

    # ---- recording helpers -------------------------------------------------------------------

    def _record(self, event):
        return self.rec.record(event)

    def _planner_error(self, message: str, usage: LlmUsage | None) -> None:
        self._record(PlannerError(id=self._next_id("err"), planner=self.planner.name, message=message, llm=usage))

    def _next_id(self, prefix: str = "p") -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def _view(self) -> PlannerView:
        spec = self.task.spec
        b = self.best
        return PlannerView(
            task_name=spec.name, task_description=spec.description, dims=spec.dims,
            context_lengths=spec.context_lengths, bytes_per_step=spec.bytes_per_step, hardware=self.ev.device,
            abi=self.task.prelude(), best_id=b.id, best_source=b.source, best_knobs=b.result.knobs or b.knobs,
            declared_knobs=parse_knobs(b.source), best_us_per_ctx=_us(b.result),
            baseline_us_per_ctx={t.ctx: t.baseline_median_us for t in b.result.timings if t.baseline_median_us},
            history=self.history, budget_left_s=self.budget.remaining(),
        )

    def _evaluate(self, cand: Candidate, **options) -> EvalResult:
        res = self.ev.evaluate(cand, deadline=self.budget.deadline(), **options)
        for phase, secs in res.phase_seconds.items():
            self.phase_seconds[phase] += secs
        return res

    # ---- the session -------------------------------------------------------------------------

    def _start_event(self) -> SessionStart:
        device = self.ev.start()
        spec = self.task.spec
        return SessionStart(
            session_id=uuid.uuid4().hex[:12], task=spec.name, size=spec.size, task_spec=spec.model_dump(mode="json"),
            planner=self.planner.name, planner_settings=self.planner.settings(), budget_s=self.budget.total,
            environment=environment(device), resumed_from=self.resume.start.session_id if self.resume else None,
        )

    def _restore(self) -> tuple[str, dict[str, int]]:
        """From a trace being resumed: the history, the id counter and the best version's source and knobs."""
        tr = self.resume
        best_id = tr.measure.id if tr.measure else None
        for a in tr.attempts():
            p = a.proposal
            res = a.evaluate.result if a.evaluate else None
            self.history.append(AttemptSummary(
                id=p.id, hypothesis=p.hypothesis, knobs=p.knobs, source_sha=p.source_sha, outcome=a.outcome,
                message=(a.failure.failure.message if a.failure else a.decision.reason if a.decision else ""),
                us_per_ctx=_us(res) if res else {}))
            if a.decision and a.decision.kept:
                best_id = p.id
        self.counter = sum(1 for e in tr.events if e.type in ("proposal", "planner_error"))
        if best_id is None:
            raise StartError(f"{tr.path} has no measured starting kernel to resume from")
        return tr.version(best_id) + (best_id,)

    def _measure(self, vid: str, source: str, knobs: dict[str, int]) -> Version:
        cand = Candidate(source=source, knobs=knobs)
        self.on_progress(step=f"measuring {vid}")
        res = self._evaluate(cand)
        self._record(Measure(id=vid, source_sha=cand.source_sha, source=source, knobs=res.knobs or knobs,
                             result=res))
        if not res.ok:
            f = res.failure
            raise StartError(f"the starting kernel {vid} is not usable: {f.cls.value} failure in {f.phase}: "
                             f"{f.message[:500]}")
        self.history.append(AttemptSummary(id=vid, hypothesis="starting kernel", knobs=res.knobs or knobs,
                                           source_sha=cand.source_sha, outcome="measured", us_per_ctx=_us(res)))
        return Version(vid, source, res.knobs or knobs, res)

    def run(self) -> SessionSummary:
        reason = "budget"
        self.rec = Recorder(self.trace_path)
        try:
            self._record(self._start_event())
            if self.resume:
                source, knobs, best_id = self._restore()
                self.best = self._measure(f"{best_id}@resume", source, knobs)
                self.best.id = best_id
            else:
                self.best = self._measure("seed", self.start_source, self.start_knobs)
            self.seed = self.best
            reason = self._loop()
        except KeyboardInterrupt:
            reason = "interrupted (Ctrl-C)"
        except StartError as e:
            self._record(SessionEnd(best_id="", reason=f"start failed: {e}"))
            self.rec.close()
            raise
        return self._finish(reason)

    def _loop(self) -> str:
        planner_failures = 0
        while self.budget.remaining() > END_MARGIN_S:
            self.on_progress(step="planning", best=self.best, budget=self.budget)
            pid = self._next_id()
            try:
                planned = self.planner.propose(self._view())
            except PlannerExhausted as e:
                return f"planner finished: {e}"
            except PlannerFailure as e:
                planner_failures += 1
                self._record(PlannerError(id=pid, planner=self.planner.name, message=str(e), llm=e.usage,
                                          retryable=e.retryable))
                self._add_usage(e.usage)
                if not e.retryable or planner_failures >= MAX_PLANNER_FAILURES:
                    return f"planner failed {planner_failures} time(s): {e}"
                continue
            planner_failures = 0
            self._add_usage(planned.llm)
            self._attempt(pid, planned)
        return "budget"

    def _add_usage(self, usage: LlmUsage | None) -> None:
        if usage is not None:
            self.llm_total.calls += usage.calls
            self.llm_total.cost_usd += usage.cost_usd

    def _attempt(self, pid: str, planned) -> None:
        cand = Candidate(source=planned.source, knobs=planned.knobs)
        self._record(Proposal(id=pid, parent_id=self.best.id, planner=self.planner.name,
                              hypothesis=planned.hypothesis, predicted_change=planned.predicted_change,
                              source_sha=cand.source_sha, source=planned.source, knobs=planned.knobs,
                              llm=planned.llm))
        self.on_progress(step=f"{pid}: {planned.hypothesis[:60]}", best=self.best, budget=self.budget)
        res = self._evaluate(cand)
        if res.build is not None:
            self._record(Build(id=pid, result=res.build))
        self._record(Evaluate(id=pid, result=res.model_copy(update={"build": None})))
        verdict = judge(self.best.result, res)
        if verdict.kept:
            verdict = self._confirm(pid, cand, res)
        kept = verdict.kept
        if res.failure is not None:
            self._record(FailureEvent(id=pid, failure=res.failure))
        elif not kept:
            self._record(FailureEvent(id=pid, failure=Failure(cls=FailureClass.slower, phase="decision",
                                                              message=verdict.reason)))
        outcome = verdict.reason if res.failure is None else f"{res.failure.cls.value}: {res.failure.message[:200]}"
        if kept:
            self.best = Version(pid, planned.source, res.knobs or planned.knobs, res)
        self._record(Decision(id=pid, kept=kept, rule=RULE, reason=verdict.reason, ratio=verdict.ratio,
                              ratio_low=verdict.low, ratio_high=verdict.high,
                              prediction=planned.predicted_change, outcome=outcome, best_id=self.best.id))
        r = res.build.resources if res.build and res.build.resources else None
        self.history.append(AttemptSummary(
            id=pid, hypothesis=planned.hypothesis, knobs=planned.knobs, source_sha=cand.source_sha,
            outcome="kept" if kept else (res.failure.cls.value if res.failure else "slower"),
            message=res.failure.message[:500] if res.failure else verdict.reason, us_per_ctx=_us(res),
            registers=r.registers if r else None, local_bytes=r.local_bytes if r else None,
            roofline=max((t.roofline for t in res.timings), default=None)))

    def _confirm(self, pid: str, cand: Candidate, res: EvalResult):
        """A first win is re-timed interleaved with the best (A B A B) so drift cannot fake a gain.

        The re-timings are recorded as Evaluate events with ids like `p3~confirm-best-1`.
        """
        best_c = Candidate(source=self.best.source, knobs=self.best.knobs)
        a, b = [], []
        for i in range(1, 3):
            for runs, which, c in ((a, "best", best_c), (b, "candidate", cand)):
                r = self._evaluate(c, check=False, baseline=False)
                self._record(Evaluate(id=f"{pid}~confirm-{which}-{i}", result=r.model_copy(update={"build": None})))
                runs.append(r)
        if any(not r.ok for r in a + b):
            bad = next(r for r in a + b if not r.ok)
            return judge(self.best.result, bad)
        merged_best = _merge_timings(self.best.result, a)
        merged_cand = _merge_timings(res, b)
        verdict = judge(merged_best, merged_cand)
        verdict.reason = "confirmed interleaved: " + verdict.reason
        if verdict.kept:
            res.timings = merged_cand.timings
        return verdict

    def _finish(self, reason: str) -> SessionSummary:
        best, seed = self.best, self.seed
        counts = Counter(a.outcome for a in self.history)
        summary = SessionSummary(
            best_id=best.id if best else "", reason=reason, tried=len(self.history), kept=counts.get("kept", 0),
            failed_by_class={k: v for k, v in counts.items() if k != "kept"},
            seed_us=_us(seed.result) if seed else {}, best_us=_us(best.result) if best else {},
            baseline_us={t.ctx: t.baseline_median_us for t in seed.result.timings if t.baseline_median_us}
            if seed else {},
            seconds_by_phase=dict(self.phase_seconds), llm_cost_usd=self.llm_total.cost_usd,
        )
        if best:
            (self.out_dir / "best.cu").write_text(with_knob_defaults(best.source, best.knobs))
        line = (f"{summary.tried} tried, {summary.kept} kept; best {summary.best_id} "
                + ", ".join(f"ctx {c}: {summary.seed_us.get(c, 0):.1f} -> {u:.1f} µs"
                            for c, u in summary.best_us.items()))
        self._record(SessionEnd(best_id=summary.best_id, reason=reason,
                                summary=summary.model_dump(mode="json") | {"line": line}))
        self.rec.close()
        self.ev.close()
        return summary


def _merge_timings(base: EvalResult, extra: list[EvalResult]) -> EvalResult:
    """Pool the timing samples of several evaluations of one version, per context."""
    merged = base.model_copy(deep=True)
    for t in merged.timings:
        for r in extra:
            t.samples_us += next((x.samples_us for x in r.timings if x.ctx == t.ctx), [])
        t.median_us = statistics.median(t.samples_us)
    return merged


def now_tag() -> str:
    return time.strftime("%Y%m%d-%H%M%S")
