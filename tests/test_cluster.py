"""A session over a Ray cluster: a local one-host cluster whose GPUs are a custom resource, and fake workers.

The lanes are real Ray actors running real Evaluators; only the GPU is a stand-in (tests/fake_worker.py).
"""

import sys
import threading
import time

import pytest

from megakernel_agent.agent.cli import main
from megakernel_agent.agent.session import Session
from megakernel_agent.sandbox.candidate import Candidate
from megakernel_agent.sandbox.protocol import PhaseTimeouts
from megakernel_agent.traces.loader import load
from megakernel_agent.traces.results import FailureClass

from .test_agent_session import TASK
from .test_faults import wait_until
from .test_lanes import attempts_complete

ray = pytest.importorskip("ray")
from megakernel_agent.sandbox.cluster import ClusterError, RayEvaluator, ray_evaluators  # noqa: E402

FAKE_GPUS = 2


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, resources={"fake_gpu": FAKE_GPUS}, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def lanes(tmp_path, n=FAKE_GPUS, **env) -> list[RayEvaluator]:
    return ray_evaluators("fake", "x", n, resource="fake_gpu", worker_module="tests.fake_worker",
                          timeouts=PhaseTimeouts(startup=60, build=30, check=120, time=30),
                          extra_env={k: str(v) for k, v in env.items()})


def close(evs):
    for ev in evs:
        ev.close()


def test_each_lane_holds_one_fake_gpu_and_evaluations_on_two_lanes_overlap(cluster, tmp_path):
    spans = tmp_path / "spans"
    evs = lanes(tmp_path, FAKE_WORKER_SPANS=spans, FAKE_WORKER_SLEEP_S=1.5)
    try:
        with pytest.raises(ClusterError, match="0 no_such_gpu free; 1 lanes were asked for"):
            ray_evaluators("fake", "x", 1, resource="no_such_gpu")
        for ev in evs:
            ev.start()
        results = [None] * len(evs)
        threads = [threading.Thread(target=lambda i=i: results.__setitem__(
            i, evs[i].evaluate(Candidate(source=f"SLEEP {i}"), deadline=time.monotonic() + 60)))
            for i in range(len(evs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert all(r.ok for r in results), [r.failure for r in results]
        rows = [line.split() for line in spans.read_text().splitlines()]
        (pid_a, a0, a1), (pid_b, b0, b1) = [(p, float(s), float(e)) for p, s, e in rows]
        assert pid_a != pid_b, "both evaluations ran on one worker"
        assert min(a1, b1) - max(a0, b0) > 1.0, "the two lanes did not evaluate at the same time"
        assert {r.worker_pid for r in results} == {int(pid_a), int(pid_b)}
    finally:
        close(evs)


def test_a_session_over_the_cluster_retries_the_candidate_whose_actor_was_killed(cluster, tmp_path):
    from megakernel_agent.agent.planners.base import PlannedVersion, PlannerExhausted

    from .test_lanes import Scripted

    class Sources(Scripted):
        def propose(self, view):
            if not self.steps:
                raise PlannerExhausted("script done")
            return PlannedVersion(source=self.steps.pop(0), knobs={}, hypothesis="h")

    pids = tmp_path / "pids"
    evs = lanes(tmp_path, FAKE_WORKER_ONCE_FILE=tmp_path / "once", FAKE_WORKER_PIDFILE=pids)
    def kill_every_actor():   # the hung one's, whichever lane it is on; an idle one comes back just the same
        if wait_until(pids.exists, 120):
            for ev in evs:
                ray.kill(ev.actor, no_restart=False)

    killer = threading.Thread(target=kill_every_actor)
    killer.start()
    s = Session(TASK, Sources(["HANG_ONCE", "fine", "also fine"]), evs, 180.0, tmp_path / "run", start_source="seed",
                inflight=1)
    summary = s.run()
    killer.join()
    trace, attempts = attempts_complete(tmp_path / "run" / "trace.jsonl")
    assert summary.reason.startswith("planner finished")
    hung = attempts[0]
    lost = next((e for e in trace.events if e.type == "evaluate" and e.id == f"{hung.proposal.id}~retried"), None)
    assert lost is not None, [(e.type, getattr(e, "id", ""), getattr(getattr(e, "result", None), "failure", None))
                              for e in trace.events]
    assert lost.result.failure.cls == FailureClass.infra and "actor died" in lost.result.failure.message
    assert hung.evaluate.result.ok, "the retry on the restarted actor did not run the candidate"
    assert {a.decision.gpu for a in attempts} <= {"ray0", "ray1"}
    assert all(a.outcome == "slower" for a in attempts)   # fake results carry no timings
    assert len(load(tmp_path / "run" / "trace.jsonl").start.environment.lanes) == FAKE_GPUS


def test_cluster_without_ray_says_what_to_install(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)
    assert main(["run", "--task", "w4a16_gemv", "--cluster", "auto", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pip install 'megakernel-agent[cluster]'" in err
    assert not (tmp_path / "r").exists()
