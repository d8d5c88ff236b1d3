"""A time-boxed optimization session: measure, then propose -> build -> evaluate -> keep or revert.

Every step is recorded the moment it happens, and best.cu is replaced whenever the best changes. The
session ends within its budget (every phase timeout is capped by what is left, a hung kernel is killed at
the deadline), on Ctrl-C or SIGTERM, when the trace cannot be written (disk full), or when the planner has
nothing left to try; it then records session_end, stops the worker and releases the trace.
"""

from __future__ import annotations

import os
import platform
import re
import signal
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

from megakernel_agent.sandbox.candidate import Candidate, parse_knobs, with_knob_defaults
from megakernel_agent.tasks.base import ROOT, Task
from megakernel_agent.traces.loader import Trace
from megakernel_agent.traces.recorder import Recorder, TraceInUse, TraceWriteError
from megakernel_agent.traces.results import EvalResult, Failure, FailureClass
from megakernel_agent.traces.schema import (
    LLM_EVENTS,
    Build,
    Decision,
    Environment,
    Evaluate,
    FailureEvent,
    LlmUsage,
    Measure,
    PlannerError,
    PlannerFinished,
    Proposal,
    SessionEnd,
    SessionStart,
)

from .archive import Archive, archived
from .budget import Budget
from .decision import RULE, Verdict, judge
from .errors import RunFolderInUse, StartError
from .interrupts import Interrupted, SessionSignals, reason_for
from .planners.base import PlannedVersion, Planner, PlannerExhausted, PlannerFailure, PlannerView
from .resume import Retry, check_same_task, retries
from .run_folder import check_out_dir, write_best
from .session_tools import SessionTools

NUMBERED_ID = re.compile(r"(p|err)(\d+)")   # the ids _next_id hands out; a resumed session goes on after the highest
END_MARGIN_S = 5.0          # stop proposing when less than this is left
MAX_PLANNER_FAILURES = 5    # consecutive planner failures that end the session
LOOKAHEAD = 4               # proposals a planner is asked to foresee, for building ahead


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
    tree's .git can be stale), else git's HEAD, marked "-dirty" when tracked files differ from it; "unknown"
    unless the project folder is itself the top of a checkout (a copy inside another repository is not)."""
    stated = os.environ.get("MK_PROJECT_COMMIT")
    if stated:
        return stated
    try:
        head = subprocess.run(["git", "rev-parse", "--show-toplevel", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, timeout=10)
        lines = head.stdout.split("\n")
        if (head.returncode != 0 or len(lines) < 2 or Path(lines[0]).resolve() != ROOT.resolve()
                or not re.fullmatch(r"[0-9a-f]{40}", lines[1])):
            return "unknown"
        diff = subprocess.run(["git", "diff", "--quiet", "HEAD", "--"], cwd=ROOT, capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return lines[1] + ("-dirty" if diff.returncode != 0 else "")


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


class Session:
    """One session over `out_dir` (see agent.run_folder for which folders it accepts). It owns `evaluator`:
    whatever ends the session, the evaluator is closed and the trace released."""

    def __init__(self, task: Task, planner: Planner, evaluator, budget_s: float, out_dir: Path,
                 start_source: str | None = None, start_knobs: dict[str, int] | None = None,
                 resume: Trace | None = None, on_progress=None):
        self.task, self.planner, self.ev = task, planner, evaluator
        self.budget = Budget(budget_s)
        self.out_dir = Path(out_dir)
        self.resume = resume
        self.trace_path = Path(resume.path) if resume else self.out_dir / "trace.jsonl"
        self.start_source = start_source if start_source is not None else task.seed_source()
        self.start_knobs = dict(start_knobs or {})
        self.on_progress = on_progress or (lambda **_: None)
        self.archive = Archive()
        self.results: dict[str, EvalResult] = {}   # every evaluated version's result (with its build), by id
        self.retries: list[Retry] = []
        self.phase_seconds: Counter = Counter()
        self.llm_total = LlmUsage(model="", calls=0)
        self.counter = 0
        self.best: Version | None = None
        self.seed: Version | None = None
        self.rec: Recorder | None = None
        self.device = None
        self.signals = SessionSignals()
        self._start_recorded = False
        self.planner.on_error = self._planner_error
        self.tools = SessionTools(self)
        self.planner.tools = self.tools

    # ---- recording helpers -------------------------------------------------------------------

    def record(self, event):
        """Append one event to the trace, durably (the planner's tools record through this too)."""
        return self.rec.record(event)

    def _planner_error(self, message: str, usage: LlmUsage | None) -> None:
        self.record(PlannerError(id=self._next_id("err"), planner=self.planner.name, message=message, llm=usage))

    def _next_id(self, prefix: str = "p") -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def _set_best(self, version: Version) -> None:
        """The best changed: best.cu follows at once, so a session that dies later still leaves it."""
        self.best = version
        write_best(self.out_dir, with_knob_defaults(version.source, version.knobs))

    def _view(self) -> PlannerView:
        spec = self.task.spec
        b = self.best
        return PlannerView(
            task_name=spec.name, task_description=spec.description, dims=spec.dims,
            context_lengths=spec.context_lengths, bytes_per_step=spec.bytes_per_step, hardware=self.ev.device,
            abi=self.task.prelude(), best_id=b.id, best_source=b.source, best_knobs=b.result.knobs or b.knobs,
            declared_knobs=parse_knobs(b.source), best_us_per_ctx=b.result.median_by_ctx(),
            baseline_us_per_ctx={t.ctx: t.baseline_median_us for t in b.result.timings if t.baseline_median_us},
            archive=self.archive.versions(), budget_left_s=self.budget.remaining(),
        )

    def evaluate(self, label: str, cand: Candidate, **options) -> EvalResult:
        """Evaluate `cand`; a failure marked retryable (our side broke) is retried once at once, on a fresh
        worker (the evaluator retires a worker after one), its first try recorded as `<label>~retried`."""
        res = self._evaluate_once(cand, **options)
        if res.failure is not None and res.failure.retryable:
            self.record(Evaluate(id=f"{label}~retried", result=res))
            res = self._evaluate_once(cand, **options)
        return res

    def _evaluate_once(self, cand: Candidate, **options) -> EvalResult:
        return self.count_phases(self.ev.evaluate(cand, deadline=self.budget.deadline(), **options))

    def count_phases(self, res: EvalResult) -> EvalResult:
        """Add an evaluation's seconds per phase to the session's (the summary's seconds_by_phase)."""
        for phase, secs in res.phase_seconds.items():
            self.phase_seconds[phase] += secs
        return res

    # ---- the session -------------------------------------------------------------------------

    def _start_event(self) -> SessionStart:
        spec = self.task.spec
        return SessionStart(
            session_id=uuid.uuid4().hex[:12], task=spec.name, size=spec.size, task_spec=spec.model_dump(mode="json"),
            planner=self.planner.name, planner_settings=self.planner.settings(), budget_s=self.budget.total,
            environment=environment(self.device), resumed_from=self.resume.start.session_id if self.resume else None,
        )

    def _restore(self) -> tuple[str, dict[str, int], str]:
        """From a trace being resumed: the archive and results, the id counter, the LLM spend, the attempts to
        retry, and the best version's source, knobs and id."""
        tr = self.resume
        self.archive = Archive.from_trace(tr)
        builds = {e.id: e.result for e in tr.events if e.type == "build"}
        for e in tr.events:
            if e.type in ("measure", "evaluate") and e.id in self.archive:
                self.results[e.id] = e.result.model_copy(update={"build": e.result.build or builds.get(e.id)})
        best_id = tr.measure.id if tr.measure else None
        for a in tr.attempts():
            if a.decision and a.decision.kept:
                best_id = a.proposal.id
        self.counter = max((int(m[2]) for e in tr.events if (m := NUMBERED_ID.fullmatch(getattr(e, "id", "")))),
                           default=0)
        self.retries = retries(tr)
        self.tools.restore(tr.events)
        spent = sum(e.llm.cost_usd for e in tr.events if e.type in LLM_EVENTS and e.llm)
        self.llm_total.cost_usd = spent
        self.planner.restore(spent)
        if best_id is None:
            raise StartError(f"{tr.path} has no measured starting kernel to resume from")
        return tr.version(best_id) + (best_id,)

    def _measure(self, vid: str, source: str, knobs: dict[str, int]) -> Version:
        cand = Candidate(source=source, knobs=knobs)
        self.on_progress(step=f"measuring {vid}")
        res = self.evaluate(vid, cand)
        self.record(Measure(id=vid, source_sha=cand.source_sha, source=source, knobs=res.knobs or knobs,
                             result=res))
        if not res.ok:
            f = res.failure
            raise StartError(f"the starting kernel {vid} is not usable: {f.cls.value} failure in {f.phase}: "
                             f"{f.message[:500]}")
        base_id = vid.split("@")[0]
        if base_id not in self.archive:
            self.archive.add(archived(base_id, None, "", "starting kernel", cand.source_sha, "measured", "", res),
                             source, knobs)
        self.results[base_id] = res
        return Version(base_id, source, knobs, res)

    def run(self) -> SessionSummary:
        """Measure, then propose until the budget, the planner, a signal (SIGINT/SIGTERM) or a failed write
        (disk full) ends the session; each of those ends it cleanly: session_end, worker stopped, trace released.

        Raises a StartError when the folder holds another run, the resumed trace is another task's or in use
        (before anything is written), or when the starting kernel is not usable.
        """
        self._open()
        error, reason = None, "stopped"
        with self.signals:
            try:
                reason = self._measure_and_loop()
            except KeyboardInterrupt as e:
                reason = reason_for(e.signum if isinstance(e, Interrupted) else signal.SIGINT)
            except (TraceWriteError, OSError) as e:
                reason = f"stopped: {e}"
            except BaseException as e:  # a StartError, or a bug: recorded and cleaned up, then raised
                error = e
                reason = f"start failed: {e}" if isinstance(e, StartError) else f"crashed: {type(e).__name__}: {e}"
            finally:
                self.signals.cleaning = True  # from here on no signal is raised: cleanup runs to its end
                summary = self._finish(reason)
        if error is not None:
            raise error
        return summary

    def _open(self) -> None:
        """Check the folder and the task, start the evaluator, then hold the trace. On refusal nothing is
        written, a folder made here is removed again, and the evaluator is closed."""
        made = False
        try:
            check_out_dir(self.out_dir, self.trace_path if self.resume else None, getattr(self.ev, "work_dir", None))
            if self.resume:
                check_same_task(self.resume, self.task.spec)
            self.device = self.ev.start()
            fresh = not self.out_dir.exists()
            self.out_dir.mkdir(parents=True, exist_ok=True)
            made = fresh
            try:
                self.rec = Recorder(self.trace_path)
            except TraceInUse as e:
                raise RunFolderInUse(str(e)) from e
            if self.resume:
                self.resume = self.rec.existing  # read again under the lock: what the trace holds now
        except BaseException:
            if made and not any(self.out_dir.iterdir()):
                self.out_dir.rmdir()
            self.ev.close()
            raise

    def _measure_and_loop(self) -> str:
        self.record(self._start_event())
        self._start_recorded = True
        if self.resume:
            source, knobs, best_id = self._restore()
            version = self._measure(f"{best_id}@resume", source, knobs)
        else:
            version = self._measure("seed", self.start_source, self.start_knobs)
        self._set_best(version)
        self.seed = version
        return self._loop()

    def _loop(self) -> str:
        planner_failures = 0
        while self.budget.remaining() > END_MARGIN_S:
            if self.signals.received is not None:  # an interrupt that a callee swallowed
                return reason_for(self.signals.received)
            if self.retries:
                retry = self.retries.pop(0)
                self._attempt(self._next_id(), retry.planned, retry.parent_id, retry.retry_of)
                continue
            self.on_progress(step="planning", best=self.best, budget=self.budget)
            view = self._view()
            try:
                planned = self.planner.propose(view)
            except PlannerExhausted as e:
                self.record(PlannerFinished(planner=self.planner.name, message=str(e), llm=e.usage))
                self._add_usage(e.usage)
                return f"planner finished: {e}"
            except PlannerFailure as e:
                planner_failures += 1
                self.record(PlannerError(id=self._next_id(), planner=self.planner.name, message=str(e), llm=e.usage,
                                          retryable=e.retryable))
                self._add_usage(e.usage)
                if not e.retryable or planner_failures >= MAX_PLANNER_FAILURES:
                    return f"planner failed {planner_failures} time(s): {e}"
                continue
            planner_failures = 0
            self._add_usage(planned.llm)
            self._build_ahead(planned, view)
            self._attempt(self._next_id(), planned, planned.parent_id or self.best.id)
        return "budget"

    def _build_ahead(self, planned: PlannedVersion, view: PlannerView) -> None:
        """Hand the evaluator this proposal and the planner's likely next ones (foreseen from the view it was
        proposed from) to compile on the CPU while the GPU checks and times (a wrong guess costs CPU time only)."""
        upcoming = self.planner.upcoming(view, LOOKAHEAD + 1)   # the view does not hold `planned` yet
        later = [p for p in upcoming if (p.source, p.knobs) != (planned.source, planned.knobs)][:LOOKAHEAD]
        fresh = [p for p in [planned, *later] if self.archive.duplicate_of(p.source, p.knobs) is None]
        self.ev.prebuild([Candidate(source=p.source, knobs=p.knobs) for p in fresh])

    def _add_usage(self, usage: LlmUsage | None) -> None:
        if usage is not None:
            self.llm_total.calls += usage.calls
            self.llm_total.cost_usd += usage.cost_usd

    def _attempt(self, pid: str, planned: PlannedVersion, parent_id: str, retry_of: str | None = None) -> None:
        cand = Candidate(source=planned.source, knobs=planned.knobs)
        self.record(Proposal(id=pid, parent_id=parent_id, planner=self.planner.name, hypothesis=planned.hypothesis,
                             predicted_change=planned.predicted_change, source_sha=cand.source_sha,
                             source=planned.source, knobs=planned.knobs, llm=planned.llm, retry_of=retry_of,
                             name=planned.name, predicted_us=planned.predicted_us,
                             predicted_phases=planned.predicted_phases))
        self.planner.accepted(pid)
        self.on_progress(step=f"{pid}: {planned.hypothesis[:60]}", best=self.best, budget=self.budget)
        twin = self.archive.duplicate_of(planned.source, planned.knobs)
        if twin is not None:   # refused before the GPU: the same source and knobs were evaluated as `twin`
            failure = Failure(cls=FailureClass.duplicate, phase="proposal",
                              message=f"the same source and knob values as {twin} ({self.archive.get(twin).outcome})")
            res = EvalResult(task=self.task.spec.name, size=self.task.spec.size, key="", failure=failure)
            self._decide(pid, planned, parent_id, cand, res, Verdict(kept=False, reason=failure.message), failure)
            return
        res = self.evaluate(pid, cand)
        if res.build is not None:
            self.record(Build(id=pid, result=res.build))
        self.record(Evaluate(id=pid, result=res.model_copy(update={"build": None})))
        failure = res.failure
        verdict = judge(self.best.result, res)
        if verdict.kept:
            verdict, failure = self._confirm(pid, cand, res)
        if failure is None and not verdict.kept:
            failure = Failure(cls=FailureClass.slower, phase="decision", message=verdict.reason)
        self._decide(pid, planned, parent_id, cand, res, verdict, failure)

    def _decide(self, pid: str, planned: PlannedVersion, parent_id: str, cand: Candidate, res: EvalResult,
                verdict: Verdict, failure: Failure | None) -> None:
        """Record the failure (if any) and the decision, archive the version, and move the best if kept."""
        kept = verdict.kept
        if failure is not None:
            self.record(FailureEvent(id=pid, failure=failure))
        outcome = (f"{failure.cls.value}: {failure.message[:200]}"
                   if failure is not None and failure.cls != FailureClass.slower else verdict.reason)
        version = Version(pid, planned.source, planned.knobs, res) if kept else self.best
        self.record(Decision(id=pid, kept=kept, rule=RULE, reason=verdict.reason, ratio=verdict.ratio,
                             ratio_low=verdict.low, ratio_high=verdict.high,
                             prediction=planned.predicted_change, outcome=outcome, best_id=version.id))
        self.results[pid] = res
        self.archive.add(archived(pid, parent_id, planned.name, planned.hypothesis, cand.source_sha,
                                  "kept" if kept else failure.cls.value,
                                  failure.message if failure else verdict.reason, res),
                         planned.source, planned.knobs, retryable=bool(failure and failure.retryable))
        if kept:
            self._set_best(version)

    def _confirm(self, pid: str, cand: Candidate, res: EvalResult) -> tuple[Verdict, Failure | None]:
        """A first win is re-timed interleaved with the best (A B A B) so drift cannot fake a gain.

        The re-timings are recorded as Evaluate events with ids like `p3~confirm-best-1`. A re-timing that
        fails (a hang, a crash) is the attempt's failure with its own class; when it was the best's re-timing
        that failed, the candidate is not to blame and the failure is marked retryable.
        """
        best_c = Candidate(source=self.best.source, knobs=self.best.knobs)
        a, b = [], []
        for i in range(1, 3):
            for runs, which, c in ((a, "best", best_c), (b, "candidate", cand)):
                label = f"{pid}~confirm-{which}-{i}"
                r = self.evaluate(label, c, check=False, baseline=False)
                self.record(Evaluate(id=label, result=r.model_copy(update={"build": None})))
                if not r.ok:
                    f = r.failure
                    failure = f.model_copy(update={"phase": f"confirm ({which} re-timing): {f.phase}",
                                                   "retryable": f.retryable or which == "best"})
                    if which == "best":   # the comparison could not be made: not the candidate's failure
                        failure.cls = FailureClass.infra
                        failure.message = f"the best's re-timing failed ({f.cls.value}): {f.message}"
                    return Verdict(kept=False, reason=f"{f.cls.value} while confirming ({which} re-timing): "
                                                      f"{f.message[:300]}"), failure
                runs.append(r)
        merged_best = _merge_timings(self.best.result, a)
        merged_cand = _merge_timings(res, b)
        verdict = judge(merged_best, merged_cand)
        verdict.reason = "confirmed interleaved: " + verdict.reason
        if verdict.kept:
            res.timings = merged_cand.timings
        return verdict, None

    def _finish(self, reason: str) -> SessionSummary:
        best, seed = self.best, self.seed
        counts = Counter(v.outcome for v in self.archive.versions() if v.outcome != "measured")
        summary = SessionSummary(
            best_id=best.id if best else "", reason=reason, tried=sum(counts.values()), kept=counts.get("kept", 0),
            failed_by_class={k: v for k, v in counts.items() if k != "kept"},
            seed_us=seed.result.median_by_ctx() if seed else {}, best_us=best.result.median_by_ctx() if best else {},
            baseline_us={t.ctx: t.baseline_median_us for t in seed.result.timings if t.baseline_median_us}
            if seed else {},
            seconds_by_phase=dict(self.phase_seconds), llm_cost_usd=self.llm_total.cost_usd,
        )
        line = (f"{summary.tried} tried, {summary.kept} kept; best {summary.best_id} "
                + ", ".join(f"ctx {c}: {summary.seed_us.get(c, 0):.1f} -> {u:.1f} µs"
                            for c, u in summary.best_us.items()))
        summary.reason += self._close(SessionEnd(best_id=summary.best_id, reason=reason,
                                                 summary=summary.model_dump(mode="json") | {"line": line}))
        return summary

    def _close(self, end: SessionEnd) -> str:
        """Record `end` (once, if the session start was recorded), then stop the worker and release the trace
        whatever happens meanwhile. Returns a note for the summary when `end` could not be written."""
        note = ""
        try:
            if self._start_recorded:
                self.record(end)
        except TraceWriteError as e:
            note = f"; session_end not written: {e}"
        finally:
            try:
                self.ev.close()
            finally:
                self.rec.close()
        return note


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
