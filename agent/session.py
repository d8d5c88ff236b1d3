"""A time-boxed optimization session: measure, then propose -> build -> evaluate -> keep or revert.

Every step is recorded the moment it happens, and best.cu is replaced whenever the best changes. The
session ends within its budget (every phase timeout is capped by what is left, a hung kernel is killed at
the deadline), on Ctrl-C or SIGTERM, when the trace cannot be written (disk full), or when the planner has
nothing left to try; it then records session_end, stops the workers and releases the trace.

Up to `inflight` proposals are evaluated at once, on as many lanes (GPUs) as the session has (agent.lanes):
the planner proposes on this thread while attempts run on theirs. An attempt's evaluation, its comparison
with the best and its confirmation run on one lane, under the session's lock from the comparison on, so
the best cannot move while it is judged. The trace holds proposals in the order made and outcomes in the
order finished; each proposal names its parent, the best it saw, and the versions in flight.
"""

from __future__ import annotations

import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from pydantic import BaseModel

from megakernel_agent.sandbox.candidate import Candidate, parse_knobs, with_knob_defaults
from megakernel_agent.sandbox.pool import DEADLINE_PASSED
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
    Note,
    PlannerError,
    PlannerFinished,
    Proposal,
    SessionEnd,
    SessionStart,
)
from megakernel_agent.traces.timings import best_id as best_of

from .archive import IN_FLIGHT, Archive, archived, in_flight
from .budget import Budget
from .decision import RULE, Verdict, judge
from .errors import RunFolderInUse, StartError
from .interrupts import Interrupted, SessionSignals, reason_for
from .lanes import Lane, Lanes
from .planners.base import PlannedVersion, Planner, PlannerExhausted, PlannerFailure, PlannerView
from .resume import Retry, check_same_task, retries
from .run_folder import check_out_dir, write_best
from .session_tools import SessionTools

NUMBERED_ID = re.compile(r"(p|err)(\d+)")   # the ids _next_id hands out; a resumed session goes on after the highest
END_MARGIN_S = 5.0          # stop proposing when less than this is left
MAX_PLANNER_FAILURES = 5    # consecutive planner failures that end the session
LOOKAHEAD = 4               # proposals a planner is asked to foresee, for building ahead
LANE_INFRA_LIMIT = 3        # infra failures in a row (each already retried once) that retire a lane


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


def environment(device, lanes: list | None = None) -> Environment:
    commit = project_commit()
    packages = {}
    for name in ("pydantic", "anthropic", "tenacity", "rich", "matplotlib"):
        try:
            packages[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            packages[name] = "absent"
    return Environment(device=device, lanes=lanes or [], python=sys.version.split()[0],
                       platform=platform.platform(terse=True), project_commit=commit, packages=packages)


class Session:
    """One session over `out_dir` (see agent.run_folder for which folders it accepts). It owns `evaluator` (one,
    or a list: one per GPU): whatever ends the session, they are closed and the trace released. Up to
    `inflight` proposals are evaluated at once (default: one per evaluator)."""

    def __init__(self, task: Task, planner: Planner, evaluator, budget_s: float, out_dir: Path,
                 start_source: str | None = None, start_knobs: dict[str, int] | None = None,
                 resume: Trace | None = None, on_progress=None, inflight: int | None = None):
        self.task, self.planner = task, planner
        self.lanes = Lanes(list(evaluator) if isinstance(evaluator, list | tuple) else [evaluator])
        self.inflight = inflight or len(self.lanes)
        if self.inflight < 1:
            raise ValueError(f"inflight must be at least 1 (got {self.inflight})")
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
        self._lock = threading.RLock()      # the trace, archive, best and results, across attempt threads
        self._attempts: ThreadPoolExecutor | None = None
        self._running: dict[Future, str] = {}             # attempt futures -> version id
        self._queued: dict[str, Candidate] = {}          # in flight, not on a lane yet (built ahead first)
        self._timed: dict[tuple[str, str], EvalResult] = {}   # (version, GPU) -> its timings on that GPU
        self._stopping = False
        self.planner.on_error = self._planner_error
        self.tools = SessionTools(self)
        self.planner.tools = self.tools

    # ---- recording helpers -------------------------------------------------------------------

    @property
    def ev(self):
        """The first lane's evaluator (for what needs no lane of its own: its device, its work folder)."""
        return self.lanes.first

    def record(self, event):
        """Append one event to the trace, durably (the planner's tools and the attempt threads record through this)."""
        with self._lock:
            return self.rec.record(event)

    def _planner_error(self, message: str, usage: LlmUsage | None) -> None:
        self.record(PlannerError(id=self._next_id("err"), planner=self.planner.name, message=message, llm=usage))

    def _next_id(self, prefix: str = "p") -> str:
        with self._lock:
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

    def evaluate(self, label: str, cand: Candidate, lane: Lane | None = None, **options) -> EvalResult:
        """Evaluate `cand` on `lane` (default: the first free one); a failure marked retryable (our side broke) is
        retried once at once, on a fresh worker (the evaluator retires a worker after one), its first try
        recorded as `<label>~retried`."""
        if lane is None:
            with self.lanes.borrow() as free:
                return self.evaluate(label, cand, free, **options)
        res = self._evaluate_once(lane, cand, **options)
        if res.failure is not None and res.failure.retryable and not self._stopping:
            self.record(Evaluate(id=f"{label}~retried", result=res))
            res = self._evaluate_once(lane, cand, **options)
        return res

    def _evaluate_once(self, lane: Lane, cand: Candidate, **options) -> EvalResult:
        return self.count_phases(lane.ev.evaluate(cand, deadline=self.budget.deadline(), **options))

    def count_phases(self, res: EvalResult) -> EvalResult:
        """Add an evaluation's seconds per phase to the session's (the summary's seconds_by_phase)."""
        with self._lock:
            for phase, secs in res.phase_seconds.items():
                self.phase_seconds[phase] += secs
        return res

    # ---- the session -------------------------------------------------------------------------

    def _start_event(self) -> SessionStart:
        spec = self.task.spec
        return SessionStart(
            session_id=uuid.uuid4().hex[:12], task=spec.name, size=spec.size, task_spec=spec.model_dump(mode="json"),
            planner=self.planner.name, planner_settings=self.planner.settings(), budget_s=self.budget.total,
            environment=environment(self.device, self.lane_devices if len(self.lanes) > 1 else None),
            resumed_from=self.resume.start.session_id if self.resume else None, inflight=self.inflight,
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
        best_id = best_of(tr) or None
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
        with self.lanes.borrow() as lane:
            res = self.evaluate(vid, cand, lane)
        self.record(Measure(id=vid, source_sha=cand.source_sha, source=source, knobs=res.knobs or knobs,
                             result=res, gpu=lane.gpu(res)))
        self._timed[(vid.split("@")[0], lane.gpu(res))] = res
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
            self.lane_devices = self.lanes.start(self.budget.remaining())   # a lane never placed ends the start
            self.device = self.lane_devices[0]
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
            self.lanes.close()
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
        """Propose until the budget or the planner ends it, then wait for the attempts in flight. On an interrupt
        (or a bug), the attempts are stopped: their workers are killed and what they were doing stays unfinished
        in the trace (a resumed session retries it)."""
        self._attempts = ThreadPoolExecutor(self.inflight, thread_name_prefix="attempt")
        try:
            reason = self._propose()
            self._wait_for(0)
            return reason
        except BaseException:
            self._stopping = True
            self.lanes.abort()
            raise
        finally:
            self._attempts.shutdown(wait=True, cancel_futures=True)

    def _propose(self) -> str:
        planner_failures = 0
        while self.budget.remaining() > END_MARGIN_S:
            if self.signals.received is not None:  # an interrupt that a callee swallowed
                return reason_for(self.signals.received)
            self._wait_for(self.inflight - 1)
            if self.budget.remaining() <= END_MARGIN_S:
                break
            if self.retries:
                retry = self.retries.pop(0)
                self._submit(retry.planned, retry.parent_id, retry.retry_of)
                continue
            self.on_progress(step="planning", best=self.best, budget=self.budget)
            view = self._view()   # not under the lock: an attempt confirming a win holds it for seconds
            try:
                planned = self.planner.propose(view)
            except PlannerExhausted as e:
                self._add_usage(e.usage)
                if e.usage is None and self._running:   # a search that may find moves around what is in flight
                    self._wait_for(0)
                    continue
                self.record(PlannerFinished(planner=self.planner.name, message=str(e), llm=e.usage))
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
            self._submit(planned, planned.parent_id or self.best.id, view=view)
        return "budget"

    def _wait_for(self, at_most: int) -> None:
        """Block until no more than `at_most` attempts are in flight; an attempt's exception (a bug, a trace that
        cannot be written) is raised here."""
        while len(self._running) > at_most:
            done, _ = wait(list(self._running), timeout=0.5, return_when=FIRST_COMPLETED)
            for future in done:
                del self._running[future]
                future.result()

    def _submit(self, planned: PlannedVersion, parent_id: str, retry_of: str | None = None,
                view: PlannerView | None = None) -> None:
        """Record the proposal and start its attempt on the next free lane; an exact duplicate of a version
        evaluated or in flight is refused here, before any lane."""
        cand = Candidate(source=planned.source, knobs=planned.knobs)
        with self._lock:
            pid = self._next_id()
            self.record(Proposal(id=pid, parent_id=parent_id, planner=self.planner.name,
                                 hypothesis=planned.hypothesis, predicted_change=planned.predicted_change,
                                 source_sha=cand.source_sha, source=planned.source, knobs=planned.knobs,
                                 llm=planned.llm, retry_of=retry_of, name=planned.name,
                                 predicted_us=planned.predicted_us, predicted_phases=planned.predicted_phases,
                                 best_seen=view.best_id if view is not None else self.best.id,
                                 in_flight=[v.id for v in self.archive.versions() if v.outcome == IN_FLIGHT]))
            self.planner.accepted(pid)
            twin = self.archive.duplicate_of(planned.source, planned.knobs)
            if twin is not None:   # refused before the GPU: the same source and knobs were evaluated as `twin`
                failure = Failure(cls=FailureClass.duplicate, phase="proposal", message=f"the same source and knob "
                                  f"values as {twin} ({self.archive.get(twin).outcome})")
                res = EvalResult(task=self.task.spec.name, size=self.task.spec.size, key="", failure=failure)
                self._decide(pid, planned, parent_id, cand, res, Verdict(kept=False, reason=failure.message), failure)
                return
            self.archive.add(in_flight(pid, parent_id, planned, cand), planned.source, planned.knobs)
            self._queued[pid] = cand
        self.on_progress(step=f"{pid}: {planned.hypothesis[:60]}", best=self.best, budget=self.budget)
        if view is not None:
            self._build_ahead(planned, view)
        self._running[self._attempts.submit(self._attempt, pid, planned, parent_id, retry_of)] = pid

    def _build_ahead(self, planned: PlannedVersion, view: PlannerView) -> None:
        """Hand the lanes what waits for a lane, this proposal and the planner's likely next ones (foreseen from
        the view it was proposed from) to compile on the CPU while the GPUs check and time (a wrong guess costs
        CPU time only)."""
        upcoming = self.planner.upcoming(view, LOOKAHEAD + 1)   # the view does not hold `planned` yet
        later = [p for p in upcoming if (p.source, p.knobs) != (planned.source, planned.knobs)][:LOOKAHEAD]
        with self._lock:
            waiting = list(self._queued.values())
            fresh = [Candidate(source=p.source, knobs=p.knobs) for p in later
                     if self.archive.duplicate_of(p.source, p.knobs) is None]
        self.lanes.prebuild(waiting + fresh)

    def _add_usage(self, usage: LlmUsage | None) -> None:
        if usage is not None:
            with self._lock:
                self.llm_total.calls += usage.calls
                self.llm_total.cost_usd += usage.cost_usd

    def _attempt(self, pid: str, planned: PlannedVersion, parent_id: str, retry_of: str | None = None) -> None:
        """One attempt, on its own thread: evaluate on a free lane, then judge against the best on that lane's GPU
        and decide, under the session's lock. Nothing is decided once the session is stopping."""
        cand = Candidate(source=planned.source, knobs=planned.knobs)
        with self.lanes.borrow() as lane:
            if self._stopping or self.budget.remaining() <= END_MARGIN_S:   # too late to start: left for a resume
                return
            res = self.evaluate(pid, cand, lane)
            with self._lock:
                self._queued.pop(pid, None)   # only now: a build it waits for must not be dropped as stale
                if self._stopping or self._cut_by_budget(res.failure):
                    return
                self._watch_lane(lane, res)
                if res.build is not None:
                    self.record(Build(id=pid, result=res.build))
                self.record(Evaluate(id=pid, result=res.model_copy(update={"build": None})))
                gpu = lane.gpu(res)
                verdict, failure = self._judge(pid, lane, gpu, cand, res)
                if self._stopping or self._cut_by_budget(failure):   # a re-timing ran into the budget's end
                    return
                if failure is None and not verdict.kept:
                    failure = Failure(cls=FailureClass.slower, phase="decision", message=verdict.reason)
                self._decide(pid, planned, parent_id, cand, res, verdict, failure, gpu)
                if failure is not None and failure.retryable and retry_of is None and len(self.lanes) > 1:
                    self.retries.append(Retry(planned, parent_id, retry_of=pid))   # once more, maybe on another lane

    @staticmethod
    def _cut_by_budget(failure: Failure | None) -> bool:
        """The session's deadline (the budget's end) cut this evaluation, or a re-timing of the attempt, short: not
        the candidate's timeout, and nothing to judge. Read from the failure itself, not the clock, so a real
        timeout decided after the budget ended is still the candidate's; only the evaluator's own timeout message
        counts (a kernel's printf can reach an infra message's log tail, never a timeout's start)."""
        return (failure is not None and failure.cls == FailureClass.timeout
                and failure.message.startswith(DEADLINE_PASSED))

    def _watch_lane(self, lane: Lane, res: EvalResult) -> None:
        """Retire a lane whose evaluations keep failing on our side (a GPU gone, an actor past its restarts), so
        that it stops taking proposals, unless it is the last lane; the trace notes it."""
        f = res.failure
        lane.infra_streak = lane.infra_streak + 1 if f is not None and f.cls == FailureClass.infra else 0
        if lane.infra_streak >= LANE_INFRA_LIMIT and self.lanes.retire(lane):
            self.record(Note(id=f"lane-{lane.name}-{self.counter}", author="session",
                             kind="observation",
                             text=f"lane {lane.name} retired after {lane.infra_streak} infra failures in a row; "
                                  f"the last: {f.message[:300]}"))

    def _judge(self, pid: str, lane: Lane, gpu: str, cand: Candidate, res: EvalResult
               ) -> tuple[Verdict, Failure | None]:
        """The keep rule against the best's timings on this GPU (the best is timed here first when it never was);
        a first win is confirmed interleaved on the same lane."""
        if res.failure is not None:
            return judge(self.best.result, res), res.failure
        best_here, failure = self._best_on(pid, lane, gpu)
        if failure is not None:
            return Verdict(kept=False, reason=failure.message), failure
        verdict = judge(best_here, res)
        if verdict.kept:
            return self._confirm(pid, lane, gpu, cand, res, best_here)
        return verdict, None

    def _best_on(self, pid: str, lane: Lane, gpu: str) -> tuple[EvalResult | None, Failure | None]:
        """The best's timings on `gpu`: from when it was measured or kept there, else timed now on `lane` (recorded
        as `<pid>~best-on-<lane>`). A re-timing that fails, or lands on another GPU, fails the attempt as infra."""
        best = self.best
        known = self._timed.get((best.id, gpu))
        if known is not None:
            return known, None
        label = f"{pid}~best-on-{lane.name}"
        r = self.evaluate(label, Candidate(source=best.source, knobs=best.knobs), lane, check=False, baseline=False)
        self.record(Evaluate(id=label, result=r.model_copy(update={"build": None})))
        if not r.ok or lane.gpu(r) != gpu:
            why = (f"{r.failure.cls.value}: {r.failure.message[:300]}" if not r.ok
                   else f"the lane moved from {gpu} to {lane.gpu(r)}")
            return None, Failure(cls=FailureClass.infra, phase="decision", retryable=True,
                                 message=f"the best {best.id} could not be timed on this candidate's GPU ({why})")
        self._timed[(best.id, gpu)] = r
        return r, None

    def _decide(self, pid: str, planned: PlannedVersion, parent_id: str, cand: Candidate, res: EvalResult,
                verdict: Verdict, failure: Failure | None, gpu: str = "") -> None:
        """Record the failure (if any) and the decision, archive the version, and move the best if kept."""
        kept = verdict.kept
        if failure is not None:
            self.record(FailureEvent(id=pid, failure=failure))
        outcome = (f"{failure.cls.value}: {failure.message[:200]}"
                   if failure is not None and failure.cls != FailureClass.slower else verdict.reason)
        version = Version(pid, planned.source, planned.knobs, res) if kept else self.best
        self.record(Decision(id=pid, kept=kept, rule=RULE, reason=verdict.reason, ratio=verdict.ratio,
                             ratio_low=verdict.low, ratio_high=verdict.high,
                             prediction=planned.predicted_change, outcome=outcome, best_id=version.id, gpu=gpu,
                             by_load=True))
        self.results[pid] = res
        self.archive.add(archived(pid, parent_id, planned.name, planned.hypothesis, cand.source_sha,
                                  "kept" if kept else failure.cls.value,
                                  failure.message if failure else verdict.reason, res),
                         planned.source, planned.knobs, retryable=bool(failure and failure.retryable))
        if kept:
            self._timed[(pid, gpu)] = res
            self._set_best(version)

    def _confirm(self, pid: str, lane: Lane, gpu: str, cand: Candidate, res: EvalResult, best_here: EvalResult
                 ) -> tuple[Verdict, Failure | None]:
        """A first win is re-timed interleaved with the best (A B B A) on the same lane, so drift cannot fake a gain,
        each timing from a module load of its own, so one load's code placement cannot either.

        The re-timings are recorded as Evaluate events with ids like `p3~confirm-best-1`. A re-timing that
        fails (a hang, a crash) is the attempt's failure with its own class; when it was the best's re-timing
        that failed, the candidate is not to blame and the failure is marked retryable.
        """
        best_c = Candidate(source=self.best.source, knobs=self.best.knobs)
        a, b = [], []
        pair = ((a, "best", best_c), (b, "candidate", cand))
        for i in range(1, 3):
            for runs, which, c in pair if i == 1 else pair[::-1]:   # A B B A: neither always runs first
                label = f"{pid}~confirm-{which}-{i}"
                r = self.evaluate(label, c, lane, check=False, baseline=False)
                self.record(Evaluate(id=label, result=r.model_copy(update={"build": None})))
                if r.ok and lane.gpu(r) != gpu:   # an actor restarted elsewhere: these samples are another GPU's
                    moved = Failure(cls=FailureClass.infra, phase=f"confirm ({which} re-timing)", retryable=True,
                                    message=f"the lane moved from {gpu} to {lane.gpu(r)} while confirming")
                    return Verdict(kept=False, reason=moved.message), moved
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
        merged_best = _merge_timings(best_here, a)
        merged_cand = _merge_timings(res, b)
        loads = min((len(t.groups()) for t in merged_cand.timings), default=0)
        if loads < 1 + len(b):   # its timings shared a module load (later loads ran out of GPU memory)
            short = Failure(cls=FailureClass.infra, phase="confirm", retryable=True, message=(
                f"the candidate's {1 + len(b)} timings ran from {loads} distinct module load(s), so its code "
                f"placement's bias cannot be told from a gain; left for a retry"))
            return Verdict(kept=False, reason=short.message), short
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
                self.lanes.close()
            finally:
                self.rec.close()
        return note


def _merge_timings(base: EvalResult, extra: list[EvalResult]) -> EvalResult:
    """Pool the timing samples of several evaluations of one version, per context, keeping the module load each
    sample ran from (TimingResult.sample_loads), as the keep rule resamples loads whole. An evaluation whose load
    was not recorded (a scripted sandbox) counts as a load of its own."""
    merged = base.model_copy(deep=True)
    for t in merged.timings:
        pairs = base.loaded_samples(t.ctx, "unrecorded 0")
        for r in extra:   # a label unused so far: the count of samples before this evaluation's
            pairs += r.loaded_samples(t.ctx, f"unrecorded {len(pairs)}")
        t.samples_us, t.sample_loads = [x for _, x in pairs], [load for load, _ in pairs]
        t.median_us = statistics.median(t.samples_us)
    return merged


def now_tag() -> str:
    return time.strftime("%Y%m%d-%H%M%S")
