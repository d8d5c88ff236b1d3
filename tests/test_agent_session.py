"""The session loop with a scripted sandbox: keep/revert, failures of every class, budget, Ctrl-C, resume."""

import subprocess
import time

import pytest

import megakernel_agent.agent.session as session_mod
from megakernel_agent.agent.planners.base import PlannedVersion, Planner, PlannerExhausted
from megakernel_agent.agent.planners.tuner import TunerPlanner
from megakernel_agent.agent.session import Session, StartError
from megakernel_agent.sandbox.candidate import Candidate, parse_knobs
from megakernel_agent.tasks.registry import get_task
from megakernel_agent.traces.loader import load
from megakernel_agent.traces.results import FailureClass

from .fake_sandbox import FakeSandbox, failed, timed

SRC = """// @knob A 2 {1,2,3,4,5} first
// @knob B 8 {4,8,16,32} second
// @knob C 0 {0,1} third
int kernel;
"""
TASK = get_task("kimi_linear", "small")


def objective(knobs: dict) -> float:
    """Separable, with its optimum at A=4, B=16, C=1 (a coordinate descent must find it)."""
    return 100.0 + 6 * abs(knobs["A"] - 4) + 5 * abs([4, 8, 16, 32].index(knobs["B"]) - 2) + 4 * (1 - knobs["C"])


def synthetic(cand: Candidate, _opts):
    return timed(cand, objective(cand.resolved_knobs()))


class Scripted(Planner):
    name = "scripted"

    def __init__(self, steps):
        self.steps = list(steps)

    def propose(self, view):
        if not self.steps:
            raise PlannerExhausted("script done")
        step = self.steps.pop(0)
        if isinstance(step, BaseException):
            raise step
        return PlannedVersion(source=SRC + step[0], knobs=step[1], hypothesis=step[0] or "knobs",
                              predicted_change="-")


def session(tmp_path, planner, script, budget=60.0, **kw):
    return Session(TASK, planner, FakeSandbox(script), budget, tmp_path, start_source=SRC, **kw)


def test_tuner_finds_the_optimum_of_a_synthetic_objective_without_repeats(tmp_path):
    s = session(tmp_path, TunerPlanner(seed=0), synthetic)
    summary = s.run()
    points = [tuple(sorted(c.resolved_knobs().items())) for c, o in s.ev.calls if o.get("check", True)]
    assert len(points) == len(set(points)), "the tuner repeated an evaluated point"
    assert s.best.knobs == {"A": 4, "B": 16, "C": 1}
    assert summary.reason.startswith("planner finished") and summary.kept >= 3
    assert (tmp_path / "best.cu").read_text().startswith("// @knob A 4 ")
    trace = load(tmp_path / "trace.jsonl")
    assert [e.type for e in trace.events[-2:]] == ["planner_finished", "session_end"]
    assert trace.events[-2].message in summary.reason and trace.events[-2].llm is None


def test_tuner_tries_two_knobs_at_once_when_no_single_move_helps(tmp_path):
    def coupled(cand, _opts):   # moving A or B alone costs 2; moving both to (3, 16) gains 6
        k = cand.resolved_knobs()
        return timed(cand, 100.0 + 2 * (k["A"] != 2) + 2 * (k["B"] != 8) - 10 * (k["A"] == 3 and k["B"] == 16))

    s = session(tmp_path, TunerPlanner(seed=0), coupled)
    summary = s.run()
    points = [tuple(sorted(c.resolved_knobs().items())) for c, o in s.ev.calls if o.get("check", True)]
    assert len(points) == len(set(points)), "the tuner repeated an evaluated point"
    assert s.best.knobs["A"] == 3 and s.best.knobs["B"] == 16
    assert "two-knob" in summary.reason
    hyps = [e.hypothesis for e in load(tmp_path / "trace.jsonl").events if e.type == "proposal"]
    assert any("A 2->3 and B 8->16 together" in h for h in hyps)


def test_tuner_is_deterministic_for_a_seed(tmp_path):
    runs = []
    for i in range(2):
        s = session(tmp_path / str(i), TunerPlanner(seed=1), synthetic)
        s.run()
        runs.append([tuple(sorted(c.knobs.items())) for c, _ in s.ev.calls])
    assert runs[0] == runs[1]


def test_keep_and_revert_rules_over_every_outcome(tmp_path):
    outcomes = {"fast": 90.0, "slower": 101.0, "noise": 99.95}

    def script(cand, opts):
        tag = cand.source[len(SRC):]
        if tag in outcomes:
            return timed(cand, outcomes[tag])
        if tag == "":
            return timed(cand, 100.0)
        return failed(cand, FailureClass(tag), "build" if tag == "build" else "check")

    plan = [("fast", {}), ("wrong", {}), ("slower", {}), ("crash", {}), ("build", {}), ("noise", {})]
    s = session(tmp_path, Scripted(plan), script)
    s.run()
    trace = load(tmp_path / "trace.jsonl")
    outcome = {a.proposal.hypothesis: a.outcome for a in trace.attempts()}
    assert outcome == {"fast": "kept", "wrong": "wrong", "slower": "slower", "crash": "crash", "build": "build",
                       "noise": "slower"}
    decisions = [e for e in trace.events if e.type == "decision"]
    assert all(d.rule and d.reason for d in decisions)
    assert decisions[0].kept and decisions[0].ratio > 1.05 and decisions[-1].best_id == decisions[0].id
    # the win was confirmed by interleaved re-timing of best and candidate without re-checking
    assert [o for _, o in s.ev.calls].count({"check": False, "baseline": False}) == 4
    confirms = [e.id for e in trace.events if e.type == "evaluate" and "~confirm-" in e.id]
    assert confirms == ["p1~confirm-best-1", "p1~confirm-candidate-1", "p1~confirm-candidate-2", "p1~confirm-best-2"]


def test_session_ends_within_budget_even_when_every_kernel_hangs(tmp_path):
    def script(cand, opts):
        return "hang" if cand.knobs else timed(cand, 100.0)

    t0 = time.monotonic()
    s = session(tmp_path, TunerPlanner(), script, budget=8.0)
    s.run()
    assert time.monotonic() - t0 < 8.0 + 10.0
    trace = load(tmp_path / "trace.jsonl")
    # cut off by the budget's end, not by its own phase limit: not the candidate's timeout, left for a resume
    assert [a.outcome for a in trace.attempts()] == ["unfinished"]
    assert trace.events[-1].type == "session_end"


def test_ctrl_c_ends_cleanly_with_trace_and_best(tmp_path):
    s = session(tmp_path, Scripted([("fast", {}), KeyboardInterrupt()]),
                lambda c, o: timed(c, 90.0 if c.source.endswith("fast") else 100.0))
    summary = s.run()
    assert summary.reason.startswith("interrupted") and summary.best_id == "p1"
    assert (tmp_path / "best.cu").read_text().endswith("fast")
    assert load(tmp_path / "trace.jsonl").events[-1].reason.startswith("interrupted")
    assert s.ev.closed


def test_resume_continues_without_repeating(tmp_path):
    first = session(tmp_path, Scripted([("", {"A": 3}), ("", {"A": 1})]), synthetic)
    first.run()
    trace = load(tmp_path / "trace.jsonl")
    second = Session(TASK, TunerPlanner(), FakeSandbox(synthetic), 60.0, tmp_path, resume=trace)
    second.run()
    merged = load(tmp_path / "trace.jsonl")
    starts = [e for e in merged.events if e.type == "session_start"]
    assert len(starts) == 2 and starts[1].resumed_from == starts[0].session_id
    tried = [tuple(sorted(a.proposal.knobs.items())) for a in merged.attempts()]
    assert len(tried) == len(set(tried))
    assert second.best.knobs == {"A": 4, "B": 16, "C": 1}
    ids = [a.proposal.id for a in merged.attempts()]
    assert len(ids) == len(set(ids))


def test_refuses_to_start_from_an_incorrect_kernel(tmp_path):
    s = session(tmp_path, TunerPlanner(), lambda c, o: failed(c, FailureClass.wrong, message="L0.S rel 0.4"))
    with pytest.raises(StartError, match="not usable: wrong failure in check: L0.S rel 0.4"):
        s.run()
    assert load(tmp_path / "trace.jsonl").events[-1].reason.startswith("start failed")


def test_declared_knobs_reach_the_planner(tmp_path):
    seen = {}

    class Spy(Planner):
        name = "spy"

        def propose(self, view):
            seen["knobs"] = [k.name for k in view.declared_knobs]
            seen["best"] = view.best_knobs
            raise PlannerExhausted("done")

    session(tmp_path, Spy(), synthetic).run()
    assert seen == {"knobs": [k.name for k in parse_knobs(SRC)], "best": {"A": 2, "B": 8, "C": 0}}


def test_project_commit_prefers_the_stated_commit_marks_a_dirty_tree_and_needs_its_own_checkout(tmp_path, monkeypatch):
    monkeypatch.setenv("MK_PROJECT_COMMIT", "f" * 40)
    assert session_mod.project_commit() == "f" * 40
    monkeypatch.delenv("MK_PROJECT_COMMIT")
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    (repo / "f.txt").write_text("a")
    subprocess.run([*git, "add", "f.txt"], check=True)
    subprocess.run([*git, "commit", "-qm", "c"], check=True)
    monkeypatch.setattr(session_mod, "ROOT", repo)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    assert session_mod.project_commit() == head
    (repo / "f.txt").write_text("b")
    assert session_mod.project_commit() == head + "-dirty"
    (repo / "project").mkdir()
    monkeypatch.setattr(session_mod, "ROOT", repo / "project")   # a copy of the project inside another repository
    assert session_mod.project_commit() == "unknown"
    monkeypatch.setattr(session_mod, "ROOT", tmp_path / "nowhere")
    assert session_mod.project_commit() == "unknown"


def test_tuner_orders_knobs_by_the_phase_with_the_largest_gap_to_its_floor():
    from megakernel_agent.agent.archive import ArchivedVersion
    from megakernel_agent.agent.planners.tuner import knob_order, phase_gaps
    from megakernel_agent.traces.results import PhaseRow, PhaseTimeline

    knobs = parse_knobs("// @knob KSPLIT_KDA 3 {2,3} K slices of the KDA q/k/v/g projections\n"
                        "// @knob PREFETCH 1 {0,1} issue the next phase's first chunk early\n"
                        "// @knob KSPLIT_GU 9 {6,9} K slices of the routed experts' gate/up\n")
    rows = [PhaseRow(name="L0 kda project", span_us=20, mean_us=15, wait_us=1, bytes=10_000_000, tbs=0.5),
            PhaseRow(name="L0 g/u+down", span_us=40, mean_us=30, wait_us=1, bytes=10_000_000, tbs=0.25)]
    v = ArchivedVersion(id="seed", source_sha="x", outcome="measured",
                        phases=[PhaseTimeline(ctx=2048, steps=3, blocks=264, rows=rows, kernel_us=62)])
    gaps = phase_gaps(v, copy_tbs=4.0)   # floors: 2.5 µs each
    assert gaps == {"L0 kda project": 17.5, "L0 g/u+down": 37.5}
    assert [k.name for k in knob_order(knobs, gaps)] == ["KSPLIT_GU", "KSPLIT_KDA", "PREFETCH"]


def test_tuner_profiles_its_base_and_moves_on_to_the_next_fastest_version(tmp_path):
    from megakernel_agent.traces.results import PhaseRow, PhaseTimeline

    def script(cand, opts):
        if opts.get("profile"):
            rows = [PhaseRow(name="L0 second", span_us=50, mean_us=40, wait_us=1, bytes=1000, tbs=0.1)]
            res = timed(cand, 100.0)
            res.phases = [PhaseTimeline(ctx=2048, steps=3, blocks=264, rows=rows, kernel_us=51)]
            return res
        k = cand.resolved_knobs()
        return timed(cand, 100.0 + (k["A"] != 2) * 1 + (k["B"] != 8) * 2 + (k["C"] != 0) * 3)

    s = session(tmp_path, TunerPlanner(seed=0), script, budget=60.0)
    summary = s.run()
    trace = load(tmp_path / "trace.jsonl")
    proposals = [e for e in trace.events if e.type == "proposal"]
    assert proposals[0].hypothesis.startswith("B 8->") and "L0 second" in proposals[0].hypothesis  # 'second' knob
    profiled = [e.input["version"] for e in trace.events if e.type == "tool_call" and e.tool == "profile"]
    assert profiled[0] == "seed" and len(profiled) >= 2                   # later bases are profiled too
    assert any(p.parent_id != "seed" for p in proposals)                  # a version that was not kept as base
    assert summary.kept == 0 and "two-value" in summary.reason


class Loads:
    """Module loads as a worker hands them out (sandbox.build.Placements): each build's evaluations take its loads
    in turn, `per_build` of them, so a build evaluated more often runs again from loads it used before."""

    def __init__(self, per_build: int = 16):
        self.per_build, self.turns = per_build, {}

    def __call__(self, res):
        n = self.turns[res.key] = self.turns.get(res.key, -1) + 1
        return res.model_copy(update={"placement": f"worker:{res.key[:8]}:{n % self.per_build}"})


@pytest.mark.parametrize("gain, kept", [(0.015, False), (0.06, True)])
def test_the_keep_rule_resamples_loads_whole_so_one_placement_cannot_pass_as_many_draws(tmp_path, gain, kept):
    """Each evaluation runs one module load whose placement biases all its samples alike (here ±1 %, steadily):
    a 1.5 % gain sits inside that spread and is not kept, though its pooled samples would clear the rule."""
    from megakernel_agent.sandbox.stats import rule_interval
    from megakernel_agent.traces.timings import judgements

    placement, loads = {"": iter([0.0, 0.01, -0.01]), "cand": iter([0.0, 0.01, -0.01])}, Loads()

    def script(cand, _opts):
        tag = cand.source[len(SRC):]
        return loads(timed(cand, 100.0 * (1 - (gain if tag else 0.0)) * (1 + next(placement[tag])), noise=0.0005))

    s = session(tmp_path, Scripted([("cand", {})]), script)
    s.run()
    trace = load(tmp_path / "trace.jsonl")
    decision = next(e for e in trace.events if e.type == "decision")
    assert decision.kept == kept and decision.by_load
    judged = judgements(trace)[decision.id]
    assert min(lo for _, lo, _ in judged.ratios.values()) == pytest.approx(decision.ratio_low)
    if not kept:   # the same samples pooled would have passed: a confirmed decision judged three loads a side
        evaluations = [e.result for e in trace.events if e.type in ("measure", "evaluate")]
        by_side = [[r.timings[0].samples_us for r in evaluations if (r.key == evaluations[0].key) == best]
                   for best in (True, False)]
        assert len(by_side[0]) == len(by_side[1]) == 3
        assert rule_interval(*by_side, by_load=False)[1] > 1.0 > rule_interval(*by_side)[1]
    else:
        best = s.results[decision.id].timings[0]
        assert len(set(best.sample_loads)) == 3 and len(best.groups()) == 3


def test_a_win_whose_timings_shared_one_module_load_is_not_kept_but_left_for_a_retry(tmp_path):
    """A worker short of memory reuses a build's loads (Placements): the candidate's three timings then share one
    placement, whose bias the rule could not see, so the confirmation gives no verdict."""
    def script(cand, _opts):
        res = timed(cand, 100.0 if cand.source == SRC else 90.0)
        return res.model_copy(update={"placement": f"worker:{res.key[:8]}:0"})

    s = session(tmp_path, Scripted([("fast", {})]), script)
    s.run()
    trace = load(tmp_path / "trace.jsonl")
    (attempt,) = trace.attempts()
    assert not attempt.decision.kept and attempt.failure.failure.cls == FailureClass.infra
    assert attempt.failure.failure.retryable and "1 distinct module load" in attempt.failure.failure.message


def test_the_report_recomputes_every_decision_against_a_best_whose_loads_repeat(tmp_path):
    """Several kept versions, each judged later against a confirmed best whose re-timings come back to loads it
    used before (3 loads per build): the report's intervals are the decisions' own, grouped by load."""
    from megakernel_agent.traces.timings import judgements

    loads = Loads(per_build=3)
    s = session(tmp_path, TunerPlanner(seed=0), lambda cand, opts: loads(synthetic(cand, opts)))
    s.run()
    trace = load(tmp_path / "trace.jsonl")
    decided = [a.decision for a in trace.attempts() if a.decision and a.decision.ratio is not None]
    assert sum(d.kept for d in decided) >= 3
    judged = judgements(trace)
    for d in decided:
        ratios = judged[d.id].ratios.values()
        assert (min(lo for _, lo, _ in ratios), max(hi for *_, hi in ratios)) == (
            pytest.approx(d.ratio_low), pytest.approx(d.ratio_high))
    kept = s.results[[d.id for d in decided if d.kept][-1]].timings[0]
    assert len(kept.groups()) == 3 and len(kept.samples_us) == 21
