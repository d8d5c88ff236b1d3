"""A scripted stand-in for sandbox.pool.Evaluator: same interface, results from a Python function.

Timings come from an objective over the knob values with small deterministic noise, so the loop's
decisions are exercised as on a real GPU; 'hang' sleeps until the caller's deadline, like a killed worker.
"""

from __future__ import annotations

import random
import statistics
import threading
import time
from collections.abc import Callable

from megakernel_agent.sandbox.candidate import Candidate
from megakernel_agent.traces.results import (
    BuildResult,
    CheckResult,
    EvalResult,
    Failure,
    FailureClass,
    Resources,
    TimingResult,
)

from .trace_fixtures import DEVICE

CTXS = (2048, 16384)


def timed(cand: Candidate, us: float, noise: float = 0.002, seed: int = 0) -> EvalResult:
    rng = random.Random(hash((cand.source_sha, tuple(sorted(cand.knobs.items())), seed)))
    timings = []
    for i, ctx in enumerate(CTXS):
        samples = [us * (1 + 0.05 * i) * (1 + rng.gauss(0, noise)) for _ in range(7)]
        med = statistics.median(samples)
        timings.append(TimingResult(ctx=ctx, steps_per_sample=20, samples_us=samples, median_us=med, spread=0.01,
                                    tok_s=1e6 / med, bytes_per_step=250_000_000, achieved_tbs=1.0, roofline=0.25,
                                    host_us=5.0, baseline_median_us=15000.0, baseline_samples_us=[15000.0] * 3,
                                    speedup=15000.0 / med))
    return EvalResult(task="kimi_linear", size="full", key=cand.key(), knobs=cand.resolved_knobs(),
                      build=BuildResult(ok=True, key="k", resources=Resources(
                          registers=96, local_bytes=0, static_smem=0, dynamic_smem=0, max_threads=256, threads=256,
                          blocks_per_sm=2, blocks_fit_per_sm=2, grid=264)),
                      check=CheckResult(passed=True, seeds=[0, 1], fresh_seeds=[1]), timings=timings,
                      device=DEVICE, phase_seconds={"build": 1.0, "check": 2.0, "time": 1.0})


def failed(cand: Candidate, cls: FailureClass, phase: str = "check", message: str = "scripted",
           retryable: bool = False) -> EvalResult:
    return EvalResult(task="kimi_linear", size="full", key=cand.key(), knobs=cand.resolved_knobs(),
                      failure=Failure(cls=cls, phase=phase, message=message, retryable=retryable), device=DEVICE)


class FakeSandbox:
    """`on_close` runs when the session closes the sandbox, before it counts as closed (to inject faults there)."""

    def __init__(self, script: Callable[[Candidate, dict], EvalResult | str],
                 on_close: Callable[[], None] | None = None, name: str = "gpu"):
        self.script, self.name = script, name
        self.on_close = on_close or (lambda: None)
        self.device = DEVICE
        self.calls: list[tuple[Candidate, dict]] = []
        self.prebuilt: list[list[Candidate]] = []   # what the session asked to build ahead, per proposal
        self.closed = False
        self.aborted = threading.Event()

    def start(self, *_):
        return self.device

    def prebuild(self, candidates: list[Candidate]) -> None:
        self.prebuilt.append(list(candidates))

    def evaluate(self, cand: Candidate, deadline: float | None = None, **options) -> EvalResult:
        self.calls.append((cand, options))
        out = self.script(cand, options)
        if out == "hang":
            if self.aborted.wait(max(0.0, (deadline or time.monotonic()) - time.monotonic())):
                return failed(cand, FailureClass.crash, "check", "worker died during check (killed)")
            return failed(cand, FailureClass.timeout, "check", "the caller's deadline passed; worker killed")
        return out

    def abort(self) -> None:
        self.aborted.set()

    def close(self):
        self.on_close()
        self.closed = True
