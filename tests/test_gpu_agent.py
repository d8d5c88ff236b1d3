"""GPU: real tuner sessions (smoke task and the Kimi seed), re-execution of a recorded trace, compare."""

from pathlib import Path

import pytest
from rich.console import Console

from megakernel_agent.agent.compare import Version, run_compare
from megakernel_agent.agent.planners.tuner import TunerPlanner
from megakernel_agent.agent.reexecute import reexecute
from megakernel_agent.agent.session import Session
from megakernel_agent.sandbox.candidate import Candidate
from megakernel_agent.sandbox.pool import Evaluator
from megakernel_agent.tasks.registry import get_task
from megakernel_agent.traces.loader import load

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def smoke_session(tmp_path_factory):
    out = tmp_path_factory.mktemp("smoke-session")
    task = get_task("w4a16_gemv", "full")
    summary = Session(task, TunerPlanner(), Evaluator("w4a16_gemv", "full", work_dir=out / "sandbox"), 60.0,
                      out).run()
    return out, summary


def test_tuner_session_on_the_smoke_task_improves_it(smoke_session):
    out, summary = smoke_session
    trace = load(out / "trace.jsonl")
    assert trace.events[-1].type == "session_end" and summary.tried >= 5
    assert summary.kept >= 1 and summary.best_us[0] < summary.seed_us[0] * 0.9
    assert (out / "best.cu").is_file()


def test_reexecute_the_recorded_kept_versions(smoke_session):
    out, _ = smoke_session
    trace = load(out / "trace.jsonl")
    with Evaluator("w4a16_gemv", "full", work_dir=out / "reexec") as ev:
        rows = reexecute(trace, ev, kept_only=True, console=Console())
    assert {r["now"] for r in rows} == {"pass"} and len({r["id"] for r in rows}) >= 2
    assert all(r.get("drift") for r in rows)


def test_compare_two_knob_settings_of_the_smoke_task(tmp_path):
    src = (Path(__file__).resolve().parent.parent / "kernels/w4a16_gemv/seed.cu").read_text()
    versions = [Version("seed", Candidate(source=src)),
                Version("KSPLIT=32", Candidate(source=src, knobs={"KSPLIT": 32, "THREADS": 128}))]
    with Evaluator("w4a16_gemv", "full", work_dir=tmp_path) as ev:
        rows = run_compare(versions, ev, rounds=3, samples=3, console=Console())
    row = next(r for r in rows if r["label"] == "KSPLIT=32")
    assert row["verdict"] == "faster" and row["low"] > 1.0


def test_short_tuner_session_on_the_kimi_seed(tmp_path):
    task = get_task("kimi_linear", "small")
    summary = Session(task, TunerPlanner(), Evaluator("kimi_linear", "small", work_dir=tmp_path / "sb"), 60.0,
                      tmp_path).run()
    trace = load(tmp_path / "trace.jsonl")
    assert trace.measure.result.ok and summary.tried >= 1
    assert trace.events[-1].type == "session_end"
