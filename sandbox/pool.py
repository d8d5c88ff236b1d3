"""Parent side of evaluation: a warm worker process, per-phase timeouts, kill-the-group on expiry.

The parent never imports torch or touches CUDA. A worker that times out is killed with its whole
process group; one that crashes or reports a CUDA error is retired; the next evaluation starts a
fresh worker transparently.
"""

from __future__ import annotations

import json
import os
import random
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

from traces.results import DeviceInfo, EvalResult, Failure, FailureClass

from .candidate import Candidate
from .protocol import EvalRequest, PhaseTimeouts

ROOT = Path(__file__).resolve().parent.parent


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

    def read(self, deadline: float) -> dict | None:
        """Next message, or None on timeout; raises EOFError if the worker died."""
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not self.sel.select(timeout=left):
                return None
            chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
            if not chunk:
                raise EOFError
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self.sel.close()

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


class Evaluator:
    """Evaluate candidates of one task in isolated, warm worker processes."""

    def __init__(self, task: str, size: str = "full", weight_seed: int = 0, work_dir: Path | None = None,
                 timeouts: PhaseTimeouts | None = None, worker_module: str = "sandbox.worker"):
        self.task, self.size, self.weight_seed = task, size, weight_seed
        self.worker_module = worker_module
        self.work_dir = Path(work_dir or ROOT / "runs" / "sandbox")
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.timeouts = timeouts or PhaseTimeouts()
        self.device: DeviceInfo | None = None
        self._worker: _Worker | None = None
        self._started = 0
        self._rng = random.SystemRandom()

    # ---- lifecycle ----
    def _spawn(self, startup_timeout: float) -> _Worker:
        self._started += 1
        log_path = self.work_dir / f"worker-{self._started}.log"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               "CUPY_CACHE_DIR": str(self.work_dir / "cupy-cache"), "PYTHONUNBUFFERED": "1"}
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", self.worker_module, "--task", self.task, "--size", self.size,
                 "--weight-seed", str(self.weight_seed)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, cwd=ROOT, env=env, start_new_session=True,
            )
        w = _Worker(proc, log_path)
        try:
            msg = w.read(time.monotonic() + startup_timeout)
        except EOFError:
            msg = {"event": "fatal", "message": f"worker exited during start-up:\n{w.log_tail()}"}
        if msg is None:
            w.kill()
            raise WorkerStartError(f"worker did not start within {startup_timeout:.0f} s (log: {log_path})")
        if msg["event"] != "ready":
            w.kill()
            text = msg.get("message", str(msg))
            if "no CUDA GPU" in text:
                raise NoGpuError(text)
            raise WorkerStartError(text)
        self.device = DeviceInfo.model_validate(msg["device"])
        return w

    def start(self, startup_timeout: float | None = None) -> DeviceInfo:
        if self._worker is None:
            self._worker = self._spawn(startup_timeout or self.timeouts.startup)
        return self.device

    def close(self) -> None:
        if self._worker is not None:
            try:
                self._worker.send({"op": "shutdown"})
                self._worker.proc.wait(timeout=10)
            except Exception:  # noqa: BLE001
                pass
            self._worker.kill()
            self._worker = None

    def __enter__(self) -> Evaluator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def fresh_seeds(self, n: int) -> list[int]:
        return [self._rng.randrange(1, 2**31 - 1) for _ in range(n)]

    # ---- evaluation ----
    def evaluate(self, candidate: Candidate, timeouts: PhaseTimeouts | None = None,
                 fresh_seeds: list[int] | None = None, deadline: float | None = None, **options) -> EvalResult:
        """Build, check and time `candidate`; every outcome (hang, crash, refusal) is a classified result.

        `deadline` (time.monotonic()) caps every phase: past it the worker is killed and the result is a
        timeout, so a caller's budget holds even when a kernel hangs.
        """
        t = timeouts or self.timeouts
        if deadline is not None:
            t = t.scaled_to(deadline - time.monotonic())
        req = EvalRequest(source=candidate.source, knobs=candidate.knobs,
                          fresh_seeds=self.fresh_seeds(2) if fresh_seeds is None else fresh_seeds, **options)
        base = EvalResult(task=self.task, size=self.size, key="", knobs=candidate.knobs, device=self.device)
        try:
            self.start(t.startup if deadline is None else max(1.0, min(t.startup, deadline - time.monotonic())))
        except (WorkerStartError, NoGpuError) as e:
            base.failure = Failure(cls=FailureClass.infra, phase="startup", message=str(e), retryable=True)
            return base
        w = self._worker
        w.send({"op": "evaluate", "request": req.model_dump()})
        phase = "build"
        phase_end = time.monotonic() + t.build
        limits = t.model_dump()
        while True:
            try:
                msg = w.read(phase_end if deadline is None else min(phase_end, deadline))
            except EOFError:
                self._retire()
                base.failure = Failure(cls=FailureClass.crash, phase=phase,
                                       message=f"worker died during {phase}:\n{w.log_tail()}")
                return base
            if msg is None:
                self._retire()
                why = ("the caller's deadline passed" if deadline is not None and time.monotonic() >= deadline
                       else f"{phase} exceeded {limits.get(phase, t.time):.0f} s")
                base.failure = Failure(cls=FailureClass.timeout, phase=phase,
                                       message=f"{why}; worker process group killed")
                return base
            if msg["event"] == "phase":
                phase = msg["phase"]
                phase_end = time.monotonic() + limits.get(phase, t.time)
            elif msg["event"] == "result":
                res = EvalResult.model_validate(msg["result"])
                if msg.get("retire"):
                    self._retire()
                return res

    def _retire(self) -> None:
        if self._worker is not None:
            self._worker.kill()
            self._worker = None
