"""Building ahead on the CPU (real NVRTC, no GPU): one build per key, stored where the worker looks, a failed build
judged without a worker, and the session handing the planner's next proposals to the builders."""

from pathlib import Path

from megakernel_agent.agent.planners.tuner import TunerPlanner
from megakernel_agent.agent.session import Session
from megakernel_agent.sandbox.build import build_key, built_ahead
from megakernel_agent.sandbox.build_ahead import BuildAhead
from megakernel_agent.sandbox.candidate import Candidate
from megakernel_agent.sandbox.pool import Evaluator
from megakernel_agent.tasks.registry import get_task
from megakernel_agent.traces.results import FailureClass
from tests.fake_sandbox import DEVICE, FakeSandbox, timed

GEMV = get_task("w4a16_gemv", "small")
H100_LIKE = DEVICE.model_copy(update={"capability": "9.0"})


def test_a_build_is_made_once_per_key_and_stored_under_the_workers_key(tmp_path):
    folder = tmp_path / "builds"
    ahead = BuildAhead(GEMV, folder, builders=2)
    cand = Candidate(source=GEMV.seed_source())
    broken = Candidate(source=GEMV.seed_source().replace("float ss = 0.0f;", "float ss = 0.0f"))
    try:
        key = ahead.submit(cand, H100_LIKE)
        assert ahead.submit(Candidate(source=GEMV.seed_source()), H100_LIKE) == key
        assert key == build_key(GEMV, cand, H100_LIKE)
        made = ahead.result(key, timeout=120)
        assert made.output.ok and made.output.cubin and made.knobs == cand.resolved_knobs()
        assert built_ahead(folder, key) == made
        assert [p.name for p in folder.iterdir()] == [f"{key}.json"]   # no temporary file left beside it
        assert ahead.result("not-asked-for", timeout=1) is None
        bad = ahead.submit(broken, H100_LIKE)
        assert not ahead.result(bad, timeout=120).output.ok
        assert ahead.result(bad, timeout=1) is None   # a failed build is forgotten once reported: a retry compiles
    finally:
        ahead.close()
    assert not folder.exists()


def test_a_failed_build_is_the_result_and_never_reaches_the_worker(tmp_path):
    broken = GEMV.seed_source().replace("float ss = 0.0f;", "float ss = 0.0f")
    # the fake worker passes whatever it is sent: a build failure can only come from this process
    with Evaluator("w4a16_gemv", "small", work_dir=tmp_path, worker_module="tests.fake_worker", build_ahead=2,
                   extra_env={"FAKE_WORKER_CAPABILITY": "9.0"}) as ev:
        res = ev.evaluate(Candidate(source=broken))
        assert res.failure is not None and res.failure.cls == FailureClass.build, res.failure
        assert res.build.built_ahead and "error" in res.build.error and res.worker_pid is None
        assert res.build.compile_seconds > 0, "the compile made ahead keeps its own seconds"
        fine = Candidate(source=GEMV.seed_source())
        ev.prebuild([fine])
        assert ev.evaluate(fine).ok
        assert (tmp_path / "builds" / f"{build_key(GEMV, fine, ev.device)}.json").is_file()


def test_the_session_hands_the_proposal_and_the_tuners_next_moves_to_the_builders(tmp_path: Path):
    seed = GEMV.seed_source()
    sandbox = FakeSandbox(lambda cand, _: timed(cand, 100.0 if cand.knobs == {} else 101.0))
    Session(GEMV, TunerPlanner(profile=False), sandbox, 30.0, tmp_path / "run").run()
    proposed = [cand for cand, options in sandbox.calls if options == {}][1:]   # after the seed's measurement
    assert len(sandbox.prebuilt) == len(proposed) > 6
    assert [asked[0].knobs for asked in sandbox.prebuilt] == [cand.knobs for cand in proposed]  # each proposal first
    for i, asked in enumerate(sandbox.prebuilt[:6]):   # the seed's own neighbourhood: nothing kept, order foreseen
        assert [c.knobs for c in asked[1:]] == [c.knobs for c in proposed[i + 1:i + 5]]
        assert all(c.source == seed for c in asked)
