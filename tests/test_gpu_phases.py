"""GPU: the phase timeline as a product instrument — `bench --phases`, a profile-only request whose spans and
waits add up to the kernel time CUDA events measure (the barrier stamps do not slow the step), and a task
without phases refused cleanly."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from megakernel_agent.sandbox.candidate import Candidate
from megakernel_agent.sandbox.pool import Evaluator
from megakernel_agent.tasks.kimi_linear.task import KimiTask
from megakernel_agent.traces.results import FailureClass

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parent.parent
SEED = (ROOT / "kernels/kimi_linear/seed.cu").read_text()
CTX = 2048


def test_bench_phases_prints_the_tasks_phases_in_order():
    out = subprocess.run([sys.executable, str(ROOT / "run_agent.py"), "bench", "--size", "small", "--phases",
                          "--samples", "3"], capture_output=True, text=True, timeout=900,
                         env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    table = out.stdout[out.stdout.index("phase timeline at ctx 64"):]
    at = 0
    for name in KimiTask("small").phase_names():
        at = table.index(f" {name} ", at)   # every phase, in the task's order
    assert "phase timeline at ctx 300" in out.stdout


def test_profile_only_request_adds_up_to_the_kernel_time_of_cuda_events(tmp_path):
    seed = Candidate(source=SEED)
    with Evaluator("kimi_linear", "full", work_dir=tmp_path) as ev:
        timed = ev.evaluate(seed, check=False, baseline=False, contexts=[CTX], samples=3)
        profiled = ev.evaluate(seed, check=False, time=False, profile=[CTX])
    assert timed.ok, timed.failure
    assert profiled.ok, profiled.failure
    assert profiled.check is None and profiled.timings == []
    (tl,) = profiled.phases
    assert tl.ctx == CTX and tl.blocks == timed.build.resources.grid and tl.steps > 1
    assert [r.name for r in tl.rows] == KimiTask("full").phase_names()
    assert all(r.span_us > 0 and r.mean_us >= 0 and r.wait_us >= 0 and r.tbs > 0 for r in tl.rows)
    assert sum(r.bytes for r in tl.rows) == timed.timings[0].bytes_per_step
    assert tl.kernel_us == pytest.approx(sum(r.span_us + r.wait_us for r in tl.rows))
    assert all(not r.events for r in tl.rows)   # barrier stamps only: the in-phase events slow the step ~7%
    assert tl.kernel_us == pytest.approx(timed.median_us(CTX), rel=0.04)   # launch gaps in the timed step only


def test_profiling_a_task_without_phases_is_a_build_failure(tmp_path):
    source = (ROOT / "kernels/w4a16_gemv/seed.cu").read_text()
    with Evaluator("w4a16_gemv", "small", work_dir=tmp_path) as ev:
        res = ev.evaluate(Candidate(source=source), check=False, time=False, profile=[0])
        again = ev.evaluate(Candidate(source=source), time=False)
    assert res.failure is not None and res.failure.cls == FailureClass.build and res.failure.phase == "profile"
    assert "declare no phases" in res.failure.message and res.phases == []
    assert again.ok, again.failure
