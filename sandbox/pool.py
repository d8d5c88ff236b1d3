"""Parent side of evaluation: a warm worker process, per-phase timeouts, kill-the-group on expiry.

The parent never touches the GPU. A worker that times out is killed with its whole
process group; one that crashes, reports a CUDA error or breaks the protocol is retired; the next
evaluation starts a fresh worker transparently. Each worker runs under sandbox.lifeline, so its group
dies with the session even when the session is killed outright; it gets an allow-listed environment
(sandbox.environment) and a log of its own (worker-<n>.log, never overwritten).
"""

from __future__ import annotations

import json
import os
import random
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from megakernel_agent import IMPORT_ROOT
from megakernel_agent.tasks.registry import get_task
from megakernel_agent.traces.results import DeviceInfo, EvalResult, Failure, FailureClass

from .build import failed_build
from .build_ahead import BuildAhead
from .candidate import Candidate
from .environment import worker_environment
from .protocol import (
    EvalRequest,
    Fatal,
    PhaseStarted,
    PhaseTimeouts,
    ProtocolError,
    Ready,
    ResultMessage,
    WorkerMessage,
    parse_message,
)

MAX_LINE = 64 << 20  # a worker that streams bytes without a newline is broken, not slow
DEADLINE_PASSED = "the caller's deadline passed"   # how a result cut off by the caller's deadline says so


class NoGpuError(RuntimeError):
    """The worker could not start because no CUDA GPU is visible."""


class WorkerStartError(RuntimeError):
    pass


class _Worker:
    def __init__(self, proc: subprocess.Popen, log_path: Path):
        self.proc, self.log_path = proc, log_path
        self.buf = b""
        self.sel = selectors.DefaultSelector()
        self.sel.register(proc.stdout, selectors.EVENT_READ)

    def send(self, obj: dict) -> None:
        self.proc.stdin.write((json.dumps(obj) + "\n").encode())
        self.proc.stdin.flush()

    def read(self, deadline: float) -> WorkerMessage | None:
        """Next message, or None on timeout; raises EOFError if the worker died, ProtocolError on garbage."""
        while b"\n" not in self.buf:
            if len(self.buf) > MAX_LINE:
                raise ProtocolError(f"a line longer than {MAX_LINE} bytes")
            left = deadline - time.monotonic()
            if left <= 0 or not self.sel.select(timeout=left):
                return None
            chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
            if not chunk:
                raise EOFError
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return parse_message(line)

    def kill(self) -> None:
        """SIGKILL the whole group (lifeline, worker, anything the worker started) and release the pipes."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self.sel.close()
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                pipe.close()
            except OSError:  # unflushed bytes to a dead reader
                pass

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


class Evaluator:
    """Evaluate candidates of one task in isolated, warm worker processes.

    `extra_env` adds variables to the allow-listed worker environment (tests pass their fake worker's
    settings this way); the environment is fixed when the evaluator is made. With `build_ahead` > 0 this
    process compiles candidates on that many threads (sandbox.build_ahead) and the worker only loads them;
    `prebuild` starts builds before their evaluation is asked for. `build_ahead` may also be a pool that
    evaluators of several GPUs share (sandbox.lanes). `name` labels the evaluator's lane in messages.
    """

    def __init__(self, task: str, size: str = "full", weight_seed: int = 0, work_dir: Path | None = None,
                 timeouts: PhaseTimeouts | None = None, worker_module: str = "megakernel_agent.sandbox.worker",
                 extra_env: Mapping[str, str] | None = None, build_ahead: int | BuildAhead = 0, name: str = "gpu"):
        self.task, self.size, self.weight_seed, self.name = task, size, weight_seed, name
        self.worker_module = worker_module
        self.work_dir = Path(work_dir or tempfile.mkdtemp(prefix="mk-sandbox-"))   # never beside the installed code
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.timeouts = timeouts or PhaseTimeouts()
        self.device: DeviceInfo | None = None
        self._worker: _Worker | None = None
        self._logs = 0
        self._rng = random.SystemRandom()
        self._aborted = False
        self._starting: _Worker | None = None   # a worker still loading, for abort() to reach
        self._ahead: BuildAhead | None = None
        if isinstance(build_ahead, BuildAhead):
            self._ahead = build_ahead.share()
        elif build_ahead:
            self._ahead = BuildAhead(get_task(task, size), self.work_dir / "builds", build_ahead)
        self._env = worker_environment({
            "PYTHONPATH": os.pathsep.join([str(IMPORT_ROOT), os.environ.get("PYTHONPATH", "")]),
            "CUPY_CACHE_DIR": str(self.work_dir / "cupy-cache"), "PYTHONUNBUFFERED": "1", **(extra_env or {})})

    # ---- lifecycle ----
    def _new_log(self) -> tuple[Path, int]:
        """The next free worker-<n>.log, created here: no earlier log (this session's or another's) is overwritten."""
        while True:
            self._logs += 1
            path = self.work_dir / f"worker-{self._logs}.log"
            try:
                return path, os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                continue

    def _spawn(self, startup_timeout: float) -> _Worker:
        log_path, log_fd = self._new_log()
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "megakernel_agent.sandbox.lifeline", str(os.getpid()),
                 sys.executable, "-m", self.worker_module, "--task", self.task, "--size", self.size,
                 "--weight-seed", str(self.weight_seed),
                 *(["--builds", str(self._ahead.folder)] if self._ahead else [])],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log_fd, cwd=IMPORT_ROOT, env=self._env,
                start_new_session=True,
            )
        finally:
            os.close(log_fd)
        w = _Worker(proc, log_path)
        self._starting = w
        try:
            if self._aborted:   # abort() ran while this process was being made
                os.killpg(proc.pid, signal.SIGKILL)
            msg = self._first_message(w, startup_timeout)
        except BaseException:
            w.kill()
            raise
        finally:
            self._starting = None
        if not isinstance(msg, Ready):
            w.kill()
            text = msg.message if isinstance(msg, Fatal) else f"worker sent {msg.event!r} before 'ready'"
            if "no CUDA GPU" in text:
                raise NoGpuError(text)
            raise WorkerStartError(text)
        self.device = msg.device
        return w

    @staticmethod
    def _first_message(w: _Worker, startup_timeout: float) -> WorkerMessage:
        try:
            msg = w.read(time.monotonic() + startup_timeout)
        except EOFError:
            return Fatal(event="fatal", message=f"worker exited during start-up:\n{w.log_tail()}")
        except ProtocolError as e:
            raise WorkerStartError(f"worker sent {e} before 'ready' (log: {w.log_path})") from None
        if msg is None:
            raise WorkerStartError(f"worker did not start within {startup_timeout:.0f} s (log: {w.log_path})")
        return msg

    def start(self, startup_timeout: float | None = None) -> DeviceInfo:
        """Start the worker unless it runs; `startup_timeout` caps the configured start-up limit."""
        if self._worker is None:
            limit = self.timeouts.startup if startup_timeout is None else min(startup_timeout, self.timeouts.startup)
            self._worker = self._spawn(limit)
            if self._aborted:   # abort() or close() ran from another thread while this worker loaded
                self._retire()
                raise WorkerStartError("the session is stopping")
        return self.device

    def close(self) -> None:
        """Ask the worker to stop, and kill its group whatever happens meanwhile (a second Ctrl-C included). A worker
        that another thread is still starting is stopped as soon as it is ready."""
        self._aborted = True
        ahead, self._ahead = self._ahead, None   # closed once, however often close() is called
        if ahead is not None:
            ahead.close()
        w, self._worker = self._worker, None
        if w is None:
            return
        try:
            w.send({"op": "shutdown"})
            w.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            pass
        finally:
            w.kill()

    def abort(self) -> None:
        """The session is stopping: from any thread, stop the builds and kill the worker's group now. An evaluation
        in progress on another thread ends as soon as it sees that (its result is not the candidate's), and
        no evaluation starts again; close() follows."""
        self._aborted = True
        ahead = self._ahead
        if ahead is not None:
            ahead.cancel()
        for w in (self._worker, self._starting):
            if w is not None:
                try:
                    os.killpg(w.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def __enter__(self) -> Evaluator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def prebuild(self, candidates: list[Candidate]) -> None:
        """Start building `candidates` on the CPU, the first first, dropping queued builds of earlier guesses
        (no-op without build-ahead or before the worker said which GPU it has)."""
        if self._ahead is not None and self.device is not None:
            keys = {self._ahead.submit(cand, self.device) for cand in candidates}
            self._ahead.only(keys)

    def fresh_seeds(self, n: int) -> list[int]:
        return [self._rng.randrange(1, 2**31 - 1) for _ in range(n)]

    # ---- evaluation ----
    def evaluate(self, candidate: Candidate, timeouts: PhaseTimeouts | None = None,
                 fresh_seeds: list[int] | None = None, deadline: float | None = None, **options) -> EvalResult:
        """Build, check and time `candidate`; every outcome (hang, crash, refusal, garbage) is a classified result.

        `deadline` (time.monotonic()) caps every phase: past it the worker is killed and the result is a
        timeout, so a caller's budget holds even when a kernel hangs. An interrupt mid-request kills the
        worker (its state is unknown) before it propagates.
        """
        t = timeouts or self.timeouts
        if deadline is not None:
            t = t.scaled_to(deadline - time.monotonic())
        req = EvalRequest(source=candidate.source, knobs=candidate.knobs,
                          fresh_seeds=self.fresh_seeds(2) if fresh_seeds is None else fresh_seeds, **options)
        base = EvalResult(task=self.task, size=self.size, key="", knobs=candidate.knobs, device=self.device)
        if self._aborted:
            return _failed(base, FailureClass.infra, "startup", "the session is stopping")
        try:
            self.start(t.startup if deadline is None else max(1.0, min(t.startup, deadline - time.monotonic())))
        except (WorkerStartError, NoGpuError) as e:
            return _failed(base, FailureClass.infra, "startup", str(e), retryable=not self._aborted)
        if self._aborted:
            return _failed(base, FailureClass.infra, "startup", "the session is stopping")
        waited, ahead = 0.0, self._ahead   # held here: another thread may close the evaluator meanwhile
        if ahead is not None:
            refused, waited = self._build_first(ahead, candidate, t, deadline, base)
            if refused is not None:
                return refused
            if self._aborted:
                return _failed(base, FailureClass.infra, "build", "the session is stopping")
        try:
            res = self._exchange(req, t, deadline, base)
        except BaseException:
            self._retire()
            raise
        if waited:
            res.phase_seconds["build"] = res.phase_seconds.get("build", 0.0) + waited
        return res

    def _build_first(self, ahead: BuildAhead, cand: Candidate, t: PhaseTimeouts, deadline: float | None,
                     base: EvalResult) -> tuple[EvalResult | None, float]:
        """Build `cand` here (or wait for its build made ahead) before the worker sees it: (the result when the
        build failed, no worker involved, or None when the worker is to load it or report a broken rule;
        seconds waited)."""
        t0 = time.monotonic()
        key = ahead.submit(cand, self.device)
        limit = t.build if deadline is None else min(t.build, deadline - t0)
        try:
            made = ahead.result(key, limit) if key is not None else None
        except TimeoutError:
            why = DEADLINE_PASSED if deadline is not None and limit < t.build else \
                f"build exceeded {t.build:.0f} s"
            return _failed(base, FailureClass.timeout, "build", f"{why} (compiling ahead, on the CPU)"), limit
        waited = time.monotonic() - t0
        if made is None or made.output.ok:
            return None, waited
        build = failed_build(key, made.knobs, made.output, waited, ahead=True)
        return base.model_copy(update={
            "key": key, "knobs": made.knobs, "build": build, "phase_seconds": {"build": waited}, "device": self.device,
            "failure": Failure(cls=FailureClass.build, phase="build", message=build.error)}), waited

    def _exchange(self, req: EvalRequest, t: PhaseTimeouts, deadline: float | None, base: EvalResult) -> EvalResult:
        """Send one request and follow the worker's phases to its result."""
        w = self._worker
        phase = "build"
        try:
            w.send({"op": "evaluate", "request": req.model_dump()})
        except OSError as e:
            self._retire()
            return _failed(base, FailureClass.infra, phase, f"the idle worker was gone ({e}):\n{w.log_tail()}",
                           retryable=True)
        phase_end = time.monotonic() + t.build
        limits = t.model_dump()
        while True:
            try:
                msg = w.read(phase_end if deadline is None else min(phase_end, deadline))
            except EOFError:
                self._retire()
                return _failed(base, FailureClass.crash, phase, f"worker died during {phase}:\n{w.log_tail()}")
            except ProtocolError as e:
                self._retire()
                return _failed(base, FailureClass.infra, phase,
                               f"worker protocol error during {phase}: {e}; worker killed", retryable=True)
            if msg is None:
                self._retire()
                why = (DEADLINE_PASSED if deadline is not None and time.monotonic() >= deadline
                       else f"{phase} exceeded {limits.get(phase, t.time):.0f} s")
                return _failed(base, FailureClass.timeout, phase, f"{why}; worker process group killed")
            if isinstance(msg, PhaseStarted):
                phase = msg.phase
                phase_end = time.monotonic() + limits.get(phase, t.time)
            elif isinstance(msg, ResultMessage):
                if msg.retire:
                    self._retire()
                return msg.result
            else:
                self._retire()
                return _failed(base, FailureClass.infra, phase, f"worker protocol error during {phase}: an "
                               f"unexpected {msg.event!r} message; worker killed", retryable=True)

    def _retire(self) -> None:
        if self._worker is not None:
            self._worker.kill()
            self._worker = None


def _failed(base: EvalResult, cls: FailureClass, phase: str, message: str, retryable: bool = False) -> EvalResult:
    base.failure = Failure(cls=cls, phase=phase, message=message, retryable=retryable)
    return base
