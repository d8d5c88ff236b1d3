"""Several proposals in flight over several lanes (GPUs): concurrency, per-GPU judging, the trace's order, faults.

Scripted sandboxes stand for GPUs here; tests/test_cluster.py runs the same session over a Ray cluster.
"""

import json
import os
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from rich.console import Console

from megakernel_agent.agent.archive import Archive
from megakernel_agent.agent.planners.base import PlannedVersion, Planner, PlannerExhausted
from megakernel_agent.agent.planners.tuner import TunerPlanner
from megakernel_agent.agent.resume import retries
from megakernel_agent.agent.session import Session
from megakernel_agent.sandbox.candidate import Candidate
from megakernel_agent.sandbox.lanes import GpuCountError, host_gpus, local_evaluators, pick_gpus
from megakernel_agent.traces.loader import load
from megakernel_agent.traces.render import render
from megakernel_agent.traces.report import write_report
from megakernel_agent.traces.results import FailureClass
from megakernel_agent.traces.timings import judgements

from .fake_sandbox import FakeSandbox, failed, timed
from .test_agent_session import SRC, TASK, Scripted, synthetic
from .trace_fixtures import DEVICE


def gpu(uuid: str):
    return DEVICE.model_copy(update={"uuid": uuid})


class Gauge:
    """Counts evaluations running at once (each takes `seconds`), to show lanes really overlap."""

    def __init__(self, seconds: float):
        self.seconds, self.now, self.most, self.lock = seconds, 0, 0, threading.Lock()

    def __call__(self, cand, opts):
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        time.sleep(self.seconds)
        with self.lock:
            self.now -= 1
        return synthetic(cand, opts)


def lanes_of(script, n: int, speed=lambda i: 1.0):
    """`n` scripted sandboxes, each its own GPU (UUID GPU-<i>), the i-th running at `speed(i)` times the time."""
    def on(i):
        def run(cand, opts):
            res = script(cand, opts)
            if isinstance(res, str):
                return res
            for t in res.timings:
                t.samples_us = [u * speed(i) for u in t.samples_us]
                t.median_us *= speed(i)
            return res.model_copy(update={"device": gpu(f"GPU-{i}")})
        return run
    return [FakeSandbox(on(i), name=f"gpu{i}") for i in range(n)]


def attempts_complete(path: Path):
    trace = load(path)
    attempts = trace.attempts()
    assert attempts and all(a.decision is not None for a in attempts), "an attempt was left undecided"
    return trace, attempts


def test_lanes_run_at_once_up_to_their_number_and_the_tuner_never_repeats_what_is_in_flight(tmp_path):
    gauge = Gauge(0.15)
    s = Session(TASK, TunerPlanner(seed=0), lanes_of(gauge, 3), 60.0, tmp_path, start_source=SRC, inflight=5)
    summary = s.run()
    assert gauge.most == 3, f"{gauge.most} evaluations overlapped on 3 lanes"
    trace, attempts = attempts_complete(tmp_path / "trace.jsonl")
    assert trace.start.inflight == 5 and len(trace.start.environment.lanes) == 3
    assert not summary.failed_by_class.get("duplicate"), "a point in flight was proposed again"
    assert s.best.knobs == {"A": 4, "B": 16, "C": 1} and summary.reason.startswith("planner finished")
    assert max(len(a.proposal.in_flight) for a in attempts) == 4
    for a in attempts:   # causal order: what a proposal saw in flight and as the best had been proposed before it
        before = {e.id for e in trace.events[:trace.events.index(a.proposal)] if e.type in ("proposal", "measure")}
        assert set(a.proposal.in_flight) <= before and a.proposal.best_seen in before
    per_lane = Counter(a.decision.gpu for a in attempts)
    assert set(per_lane) == {"GPU-0", "GPU-1", "GPU-2"}, per_lane


def test_a_candidate_is_judged_against_the_best_timed_on_its_own_gpu(tmp_path):
    """GPU-1 runs everything in half the time of GPU-0, where the seed was measured. A candidate 5% slower than the
    seed would look 1.9x faster against GPU-0's figures: it must be compared with the seed re-timed on GPU-1. One
    lane at a time, the lanes take turns (p1 on GPU-1, p2 on GPU-0, p3 on GPU-1)."""
    us = {"slower": 105.0, "faster": 90.0, "fastest": 80.0}

    def script(cand, _opts):
        return timed(cand, us.get(cand.source[len(SRC):], 100.0))

    planner = Scripted([("slower", {}), ("faster", {}), ("fastest", {})])
    s = Session(TASK, planner, lanes_of(script, 2, speed=lambda i: 0.5 if i == 1 else 1.0), 60.0, tmp_path,
                start_source=SRC, inflight=1)
    s.run()
    trace, attempts = attempts_complete(tmp_path / "trace.jsonl")
    assert trace.measure.result.device.uuid == "GPU-0"
    assert [a.decision.gpu for a in attempts] == ["GPU-1", "GPU-0", "GPU-1"]
    assert [a.decision.kept for a in attempts] == [False, True, True]
    assert attempts[0].decision.ratio < 1.0, attempts[0].decision.reason
    retimed = {e.id: e.result for e in trace.events if e.type == "evaluate" and "~best-on-" in e.id}
    assert list(retimed) == ["p1~best-on-gpu1", "p3~best-on-gpu1"], "the best is timed once per GPU it is judged on"
    assert all(r.device.uuid == "GPU-1" for r in retimed.values())
    assert trace.source_of(attempts[2].proposal.source_sha).endswith("fastest") and s.best.id == "p3"
    shown = Console(record=True, width=200)
    render(trace, shown)
    text = shown.export_text()
    assert "2 GPU lane(s), up to 1 in flight" in text and "GPU-1" in text and "GPU-0" in text
    write_report(trace, tmp_path / "report.md")
    report = (tmp_path / "report.md").read_text()
    assert "evaluated on 2 GPUs" in report and "| GPU |" in report.replace("|GPU|", "| GPU |")
    judged = judgements(trace)   # the report recomputes each comparison on the decision's own GPU
    assert judged["p1"].against == "seed" and all(r < 1.0 for r, _, _ in judged["p1"].ratios.values())
    assert judged["p3"].against == "p2" and all(1.05 < r < 1.2 for r, _, _ in judged["p3"].ratios.values())


def test_with_more_in_flight_than_lanes_the_planner_proposes_while_the_gpu_works(tmp_path):
    thinking, evaluating = [], []

    class Slow(Planner):
        """A planner that thinks for 0.3 s per proposal (an LLM's reply), four proposals."""
        name = "slow"

        def __init__(self):
            self.left = 4

        def propose(self, view):
            if not self.left:
                raise PlannerExhausted("done")
            self.left -= 1
            t0 = time.monotonic()
            time.sleep(0.3)
            thinking.append((t0, time.monotonic()))
            return PlannedVersion(source=SRC + f"v{self.left}", knobs={}, hypothesis="h")

    def script(cand, opts):
        t0 = time.monotonic()
        time.sleep(0.3)
        if cand.source != SRC:
            evaluating.append((t0, time.monotonic()))
        return timed(cand, 100.0)

    s = Session(TASK, Slow(), FakeSandbox(script), 60.0, tmp_path, start_source=SRC, inflight=2)
    s.run()
    attempts_complete(tmp_path / "trace.jsonl")
    assert len(evaluating) == 4
    overlaps = [min(b, d) - max(a, c) for a, b in thinking for c, d in evaluating]
    assert sum(o > 0.1 for o in overlaps) >= 3, "the planner did not think while the GPU evaluated"


def test_interrupted_with_attempts_in_flight_the_trace_stays_consistent_and_resume_retries_them(tmp_path):
    def script(cand, _opts):
        return "hang" if cand.source.endswith("hang") else timed(cand, 100.0)

    class InterruptAfter(Scripted):
        """Ctrl-C once the quick candidate is decided and the hung one is still in flight."""

        def propose(self, view):
            if not self.steps:
                deadline = time.monotonic() + 10
                while [v.outcome == "in flight" for v in s.archive.versions()] != [False, True, False]:
                    assert time.monotonic() < deadline
                    time.sleep(0.05)
                raise KeyboardInterrupt
            return super().propose(view)

    s = Session(TASK, InterruptAfter([("hang", {}), ("", {"A": 1})]), lanes_of(script, 2), 120.0, tmp_path,
                start_source=SRC, inflight=3)
    t0 = time.monotonic()
    summary = s.run()
    assert time.monotonic() - t0 < 30 and summary.reason.startswith("interrupted")
    trace = load(tmp_path / "trace.jsonl")
    assert trace.events[-1].type == "session_end"
    undecided = [a for a in trace.attempts() if a.decision is None]
    assert [trace.source_of(a.proposal.source_sha)[len(SRC):] for a in undecided] == ["hang"]
    assert Archive.from_trace(trace).get(undecided[0].proposal.id).outcome == "unfinished"
    again = Session(TASK, Scripted([]), lanes_of(lambda c, o: timed(c, 100.0), 2), 60.0, tmp_path, resume=trace)
    again.run()
    retry = [a for a in load(tmp_path / "trace.jsonl").attempts() if a.proposal.retry_of == undecided[0].proposal.id]
    assert len(retry) == 1 and retry[0].decision is not None
    assert all(lane.ev.closed for lane in s.lanes.all)
    render(trace)


def test_several_local_gpus_pin_one_worker_each_and_an_infra_failure_is_retried_on_a_fresh_one(tmp_path):
    """Real evaluators and fake workers: each lane's worker sees its own CUDA_VISIBLE_DEVICES; a worker that reports
    our side broke is replaced, and the candidate tried once more there, then failed with the reason."""
    evs = local_evaluators("fake", "x", ["3", "5"], tmp_path / "sandbox", worker_module="tests.fake_worker",
                           extra_env={"FAKE_WORKER_ENV_OUT": str(tmp_path / "env.json")})
    try:
        assert [ev.name for ev in evs] == ["gpu3", "gpu5"]
        seen = set()
        for ev in evs:
            assert ev.evaluate(Candidate(source="ENV_DUMP")).ok
            seen.add(json.loads((tmp_path / "env.json").read_text())["CUDA_VISIBLE_DEVICES"])
        assert seen == {"3", "5"}
        assert {p.name for p in (tmp_path / "sandbox").iterdir()} >= {"gpu3", "gpu5"}
    finally:
        for ev in evs:
            ev.close()

    class Planned(Scripted):
        def propose(self, view):
            if not self.steps:
                raise PlannerExhausted("script done")
            return PlannedVersion(source=self.steps.pop(0), knobs={}, hypothesis="h")

    evs = local_evaluators("fake", "x", ["0", "1"], tmp_path / "run" / "sandbox", worker_module="tests.fake_worker")
    s = Session(TASK, Planned(["ok one", "INFRA", "ok two"]), evs, 60.0, tmp_path / "run", start_source="seed")
    s.run()
    trace, attempts = attempts_complete(tmp_path / "run" / "trace.jsonl")
    infra = next(a for a in attempts if trace.source_of(a.proposal.source_sha) == "INFRA")
    assert infra.failure.failure.cls == FailureClass.infra and infra.failure.failure.message == "scripted infra"
    assert any(e.type == "evaluate" and e.id == f"{infra.proposal.id}~retried" for e in trace.events)
    first, retried = (e.result.worker_pid for e in trace.events
                      if e.type == "evaluate" and e.id in (f"{infra.proposal.id}~retried", infra.proposal.id))
    assert first != retried, "the retry ran on the worker that had reported the failure"


def test_gpus_are_counted_without_touching_cuda(monkeypatch, tmp_path):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2, 7")
    assert host_gpus() == ["2", "7"] and pick_gpus("all") == ["2", "7"] and pick_gpus("2") == ["2", "7"]
    assert pick_gpus("1") == [], "one GPU is not pinned: the worker takes what it sees"
    with pytest.raises(GpuCountError, match="more GPUs than this host shows"):
        pick_gpus("3")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-a)'\necho 'GPU 1: NVIDIA H200 (UUID: GPU-b)'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{smi.parent}{os.pathsep}{os.environ['PATH']}")
    assert pick_gpus("all") == ["0", "1"]
    smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    with pytest.raises(GpuCountError, match="cannot count"):
        pick_gpus("2")
    assert subprocess.run(["nvidia-smi"], capture_output=True).returncode == 9


def test_the_best_is_the_last_decision_s_even_when_decisions_come_out_of_proposal_order(tmp_path):
    """p1 (the fastest kernel) takes longer to evaluate than p2: p2 is kept first, then p1 over it. The best, the
    report and a resume follow the decisions, not the proposal order."""
    from megakernel_agent.traces.timings import best_id

    def script(cand, _opts):
        tag = cand.source[len(SRC):]
        if tag == "fastest" and _opts.get("check", True):
            time.sleep(1.0)
        return timed(cand, {"fastest": 80.0, "fast": 90.0}.get(tag, 100.0))

    s = Session(TASK, Scripted([("fastest", {}), ("fast", {})]), lanes_of(script, 2), 60.0, tmp_path,
                start_source=SRC, inflight=2)
    s.run()
    trace, attempts = attempts_complete(tmp_path / "trace.jsonl")
    decided = [e.id for e in trace.events if e.type == "decision"]
    assert decided == ["p2", "p1"] and all(a.decision.kept for a in attempts)
    assert s.best.id == "p1" and best_id(trace) == "p1" and trace.events[-1].best_id == "p1"
    again = Session(TASK, Scripted([]), lanes_of(script, 1), 60.0, tmp_path, resume=trace)
    again.run()
    assert again.seed.id == "p1" and (tmp_path / "best.cu").read_text().endswith("fastest")


def test_a_lane_that_keeps_failing_on_our_side_is_retired_and_the_others_go_on(tmp_path):
    def broken(cand, _opts):
        return failed(cand, FailureClass.infra, "startup", "the worker did not start", retryable=True)

    good, bad = lanes_of(synthetic, 2)
    bad.script = lambda c, o: synthetic(c, o) if c.source == SRC and not c.knobs else broken(c, o)
    s = Session(TASK, TunerPlanner(seed=0), [good, bad], 60.0, tmp_path, start_source=SRC, inflight=2)
    summary = s.run()
    trace = load(tmp_path / "trace.jsonl")
    notes = [e for e in trace.events if e.type == "note" and e.id.startswith("lane-gpu1-")]
    assert len(notes) == 1 and "retired after 3 infra failures" in notes[0].text
    on_bad = [e for e in trace.events if e.type == "decision" and e.gpu in ("gpu1", "GPU-1")]
    assert len(on_bad) == 3, "the retired lane went on taking candidates"
    by_id = {a.proposal.id: a for a in trace.attempts()}
    first_tries = {e.id for e in on_bad if not by_id[e.id].proposal.retry_of}
    assert first_tries <= {a.proposal.retry_of for a in by_id.values()}, "a candidate its lane failed was not retried"
    later = [e for e in trace.events[trace.events.index(notes[0]):] if e.type == "decision"][1:]   # after its last
    assert later and not any(e.gpu in ("gpu1", "GPU-1") for e in later), "the retired lane decided again"
    assert s.best.knobs == {"A": 4, "B": 16, "C": 1} and summary.kept >= 3


def test_an_abort_reaches_a_worker_that_is_still_starting(tmp_path):
    evs = local_evaluators("fake", "x", [], tmp_path / "sandbox", worker_module="tests.fake_worker",
                           extra_env={"FAKE_WORKER_START_S": "30"})
    ev = evs[0]
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("res", ev.evaluate(Candidate(source="x"))))
    try:
        t.start()
        time.sleep(1.0)
        t0 = time.monotonic()
        ev.abort()
        t.join(15)
        assert not t.is_alive() and time.monotonic() - t0 < 10, "the evaluation waited for the worker to load"
        res = out["res"]
        assert res.failure.cls == FailureClass.infra and not res.failure.retryable
    finally:
        ev.close()


def test_a_win_whose_confirmation_runs_into_the_budget_s_end_is_left_for_a_resume(tmp_path):
    def script(cand, opts):
        if cand.source.endswith("win"):
            return "hang" if not opts.get("check", True) else timed(cand, 80.0)   # the re-timing hits the deadline
        return timed(cand, 100.0)

    Session(TASK, Scripted([("win", {})]), [FakeSandbox(script)], 7.0, tmp_path, start_source=SRC).run()
    trace = load(tmp_path / "trace.jsonl")
    assert [a.outcome for a in trace.attempts()] == ["unfinished"]
    assert [r.retry_of for r in retries(trace)] == ["p1"]


def test_a_candidate_s_own_timeout_is_its_own_even_when_decided_after_the_budget_s_end(tmp_path):
    """p2 times out on its own at ~3 s of a 12-s budget, but gets the session's lock only after p1's confirmation
    (re-timings of 3.5 s each) has run past the budget's end: still p2's timeout, read from its failure."""
    def script(cand, opts):
        tail = cand.source[len(SRC):]
        if not opts.get("check", True):
            time.sleep(3.5)
        if tail == "win":
            time.sleep(0.5)
            return timed(cand, 80.0)
        if tail == "hangs":
            time.sleep(3.0)
            return failed(cand, FailureClass.timeout, "check", "check exceeded 3 s; worker process group killed")
        return timed(cand, 100.0)

    Session(TASK, Scripted([("win", {}), ("hangs", {})]), lanes_of(script, 2), 12.0, tmp_path, start_source=SRC,
            inflight=2).run()
    outcomes = {a.proposal.id: a.outcome for a in load(tmp_path / "trace.jsonl").attempts()}
    assert outcomes["p2"] == "timeout", outcomes


def test_a_failed_lane_start_is_raised_at_once_while_another_lane_still_loads(tmp_path):
    from megakernel_agent.agent.lanes import Lanes

    class Slow(FakeSandbox):
        def start(self, *_):
            self.aborted.wait(30)
            return self.device

    class Broken(FakeSandbox):
        def start(self, *_):
            raise RuntimeError("no GPU 1")

    slow = Slow(synthetic, name="gpu0")
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="no GPU 1"):
        Lanes([slow, Broken(synthetic, name="gpu1")]).start()
    assert time.monotonic() - t0 < 5 and slow.aborted.is_set(), "the loading lane was not aborted"
