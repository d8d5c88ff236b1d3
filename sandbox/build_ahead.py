"""Build ahead on the CPU: compile candidates, several at once, while the GPU worker checks and times others.

NVRTC takes 3-7 s per build of the Kimi seed, and a worker that compiles leaves its GPU idle meanwhile.
Here the session's own process compiles (each compile in its confined child, sandbox.compiler) on a
thread pool, as soon as a planner names a candidate it is about to propose. Each build is stored as
<key>.json under the key the worker computes (sandbox.build.build_key: source, knobs, task defines,
arch, CuPy and CUDA versions), so the worker loads it instead of compiling; a build that fails is
reported by the evaluator and never reaches a worker.
"""

from __future__ import annotations

import os
import tempfile
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from megakernel_agent.tasks.base import Task
from megakernel_agent.traces.results import DeviceInfo

from .build import BuiltAhead, build_key, compile_candidate
from .candidate import Candidate, CandidateError
from .compiler import CompileLimits


class BuildAhead:
    """A pool of `builders` compile threads writing into `folder`; one build per key, however often asked."""

    def __init__(self, task: Task, folder: Path, builders: int, limits: CompileLimits | None = None):
        self.task, self.folder, self.limits = task, Path(folder), limits
        self.folder.mkdir(parents=True, exist_ok=True)
        self._pool = ThreadPoolExecutor(max_workers=builders, thread_name_prefix="build-ahead")
        self._builds: dict[str, Future] = {}
        self._lock = threading.Lock()

    def submit(self, cand: Candidate, device: DeviceInfo) -> str | None:
        """Start building `cand` for the GPU `device` describes, unless it is built or being built; returns its
        key (None when its knobs are malformed: the worker reports that, as it would without building ahead)."""
        try:
            key = build_key(self.task, cand, device)
        except CandidateError:
            return None
        with self._lock:
            if key not in self._builds:
                arch = "sm_" + device.capability.replace(".", "")
                self._builds[key] = self._pool.submit(self._build, cand, arch, key)
        return key

    def result(self, key: str, timeout: float) -> BuiltAhead | None:
        """The build under `key`, waiting up to `timeout` s for it; None when nobody asked for it or its source
        breaks a rule (left to the worker, which reports it) or could not be stored. TimeoutError when it is still
        compiling."""
        with self._lock:
            future = self._builds.get(key)
        if future is None:
            return None
        try:
            return future.result(timeout=max(0.0, timeout))
        except (CandidateError, OSError):   # a rule the worker will report; a build that could not be stored
            return None

    def _build(self, cand: Candidate, arch: str, key: str) -> BuiltAhead:
        knobs, out = compile_candidate(self.task, cand, arch, self.limits)
        made = BuiltAhead(knobs=knobs, output=out)
        fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=f".{key}.", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(made.model_dump_json())
        os.replace(tmp, self.folder / f"{key}.json")   # a worker never reads half a build
        return made

    def close(self) -> None:
        """Drop the builds not started; those compiling finish in their confined children (seconds)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
