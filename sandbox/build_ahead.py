"""Build ahead on the CPU: compile candidates, several at once, while the GPU worker checks and times others.

NVRTC takes 3-7 s per build of the Kimi seed, and a worker that compiles leaves its GPU idle meanwhile.
Here the session's own process compiles (each compile in its confined child, sandbox.compiler) on a
thread pool, as soon as a planner names a candidate it is about to propose. Each build is stored as
<key>.json under the key the worker computes (sandbox.build.build_key: source, knobs, task defines,
arch, CuPy and CUDA versions), so the worker loads it instead of compiling; a build that fails is
reported by the evaluator and never reaches a worker. The folder holds this session's builds only
(emptied when the pool starts and when it closes); a failed build is forgotten once reported, so a
retry compiles again.
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import subprocess
import tempfile
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from megakernel_agent.tasks.base import Task
from megakernel_agent.traces.results import DeviceInfo

from .build import BuiltAhead, build_key, built_ahead, compile_candidate
from .candidate import Candidate, CandidateError
from .compiler import CompileLimits


class BuildAhead:
    """A pool of `builders` compile threads writing into `folder`; one build per key, however often asked."""

    def __init__(self, task: Task, folder: Path, builders: int, limits: CompileLimits | None = None):
        self.task, self.folder, self.limits = task, Path(folder), limits
        shutil.rmtree(self.folder, ignore_errors=True)   # a resumed session's old builds: made by other code
        self.folder.mkdir(parents=True)
        self._pool = ThreadPoolExecutor(max_workers=builders, thread_name_prefix="build-ahead")
        self._builds: dict[str, Future] = {}
        self._compilers: set[subprocess.Popen] = set()
        self._lock = threading.Lock()
        self._users = 1
        self._closed = False

    def share(self) -> BuildAhead:
        """One more user of this pool (evaluators of several GPUs of one host share it); each user closes it once,
        and the last close is the real one."""
        with self._lock:
            self._users += 1
        return self

    def submit(self, cand: Candidate, device: DeviceInfo) -> str | None:
        """Start building `cand` for the GPU `device` describes, unless it is built or being built; returns its
        key (None when its knobs are malformed: the worker reports that, as it would without building ahead)."""
        try:
            key = build_key(self.task, cand, device)
        except CandidateError:
            return None
        with self._lock:
            if self._closed:   # the session is ending: the worker compiles, if it is still asked
                return None
            if key not in self._builds:
                arch = "sm_" + device.capability.replace(".", "")
                self._builds[key] = self._pool.submit(self._build, cand, arch, key)
        return key

    def only(self, keys: set[str]) -> None:
        """Drop the queued builds (not started yet) whose keys are not in `keys`: guesses that a newer proposal
        made stale would otherwise stand in the queue before it."""
        with self._lock:
            for key, future in list(self._builds.items()):
                if key not in keys and future.cancel():
                    del self._builds[key]

    def result(self, key: str, timeout: float) -> BuiltAhead | None:
        """The build under `key`, waiting up to `timeout` s for it; None when nobody asked for it, its source breaks
        a rule (the worker reports it) or the build broke on our side (the worker compiles it). TimeoutError when
        it is still compiling. A failed compile is forgotten once returned: asked again, it is compiled again."""
        with self._lock:
            future = self._builds.get(key)
        if future is None:
            return None
        try:
            future.result(timeout=max(0.0, timeout))
            made = built_ahead(self.folder, key)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(f"build {key[:12]} still compiling after {timeout:.0f} s") from None
        except Exception:  # noqa: BLE001 - a rule broken (CandidateError), a build not stored, a compiler fault
            made = None
        if made is None or not made.output.ok:
            with self._lock:
                self._builds.pop(key, None)
        return made

    def _build(self, cand: Candidate, arch: str, key: str) -> None:
        knobs, out = compile_candidate(self.task, cand, arch, self.limits, track=self._track)
        fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=f".{key}.", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(BuiltAhead(knobs=knobs, output=out).model_dump_json())
        os.replace(tmp, self.folder / f"{key}.json")   # a worker never reads half a build

    def _track(self, proc: subprocess.Popen, done: bool) -> None:
        """Remember a running compiler process (forget it when `done`), so that close() can stop it."""
        with self._lock:
            if done:
                self._compilers.discard(proc)
            else:
                self._compilers.add(proc)

    def cancel(self) -> None:
        """Stop building now (the session is stopping): drop the queued builds, kill the running compilers and take
        no new ones, so that nobody waits for a build."""
        with self._lock:
            self._closed = True
            for key, future in list(self._builds.items()):
                if future.cancel():
                    del self._builds[key]
            running = list(self._compilers)
        for proc in running:
            proc.kill()

    def close(self) -> None:
        """The last user's close stops the builds (cancel) and removes the folder."""
        with self._lock:
            self._users -= 1
            if self._users > 0:
                return
            self._closed = True
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.cancel()
        shutil.rmtree(self.folder, ignore_errors=True)
