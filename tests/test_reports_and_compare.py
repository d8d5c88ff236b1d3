"""Reports from a fixture trace, and compare's interleaving and verdicts with a scripted sandbox."""

import matplotlib.pyplot as plt
from rich.console import Console

from megakernel_agent.agent.compare import Version, print_compare, run_compare
from megakernel_agent.agent.reexecute import print_reexecute, reexecute
from megakernel_agent.sandbox.candidate import Candidate
from megakernel_agent.traces.diffs import diff_text
from megakernel_agent.traces.loader import load
from megakernel_agent.traces.phases import timelines_of
from megakernel_agent.traces.plots import draw_waterfall
from megakernel_agent.traces.report import write_report
from megakernel_agent.traces.results import EvalResult, FailureClass
from megakernel_agent.traces.schema import Evaluate

from .fake_sandbox import FakeSandbox, failed, timed
from .trace_fixtures import phase_timeline, write_session

PNG = b"\x89PNG"


def test_html_report_is_self_contained(tmp_path):
    trace = load(write_session(tmp_path / "t.jsonl"))
    page = write_report(trace, tmp_path / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 3
    assert "timeline" in page.lower() and "try {&#x27;A&#x27;: 2}" in page


def test_markdown_report_writes_plots_beside_it(tmp_path):
    trace = load(write_session(tmp_path / "t.jsonl"))
    md = write_report(trace, tmp_path / "report.md").read_text()
    for name in ("progress", "speedup", "roofline"):
        png = tmp_path / f"report-{name}.png"
        assert png.read_bytes().startswith(PNG) and f"report-{name}.png" in md
    assert "| 1 | p1 |" in md


def test_phase_timelines_of_the_seed_and_the_best_become_a_waterfall(tmp_path):
    trace = load(write_session(tmp_path / "t.jsonl", phases=True))
    assert {v: [t.ctx for t in tls] for v, tls in timelines_of(trace).items()} == {"seed": [2048, 16384],
                                                                                   "p1": [16384]}
    md = write_report(trace, tmp_path / "report.md").read_text()
    assert (tmp_path / "report-phases.png").read_bytes().startswith(PNG) and "report-phases.png" in md
    assert write_report(trace, tmp_path / "report.html").read_text().count("data:image/png;base64,") == 4


def test_a_later_profile_of_a_version_replaces_its_timeline_at_that_context(tmp_path):
    trace = load(write_session(tmp_path / "t.jsonl", phases=True))
    profile = EvalResult(task="kimi_linear", size="full", key="k", phases=[phase_timeline(16384, [30.0, 90.0])])
    trace.events.append(Evaluate(id="seed", result=profile))
    seed = timelines_of(trace)["seed"]
    assert [t.ctx for t in seed] == [2048, 16384] and seed[1].kernel_us == 121.0


def test_the_waterfall_stacks_each_span_and_wait_after_the_phases_before_it():
    fig, ax = plt.subplots()
    draw_waterfall(ax, phase_timeline(16384, [50.0, 130.0, 20.0], wait=2.0), "seed")
    bars = [(p.get_x(), p.get_width()) for p in ax.patches]
    plt.close(fig)
    spans, waits = bars[:3], bars[3:]
    assert spans == [(0.0, 50.0), (52.0, 130.0), (184.0, 20.0)]
    assert waits == [(50.0, 2.0), (182.0, 2.0), (204.0, 0.0)]


def test_a_trace_without_timelines_has_no_waterfall(tmp_path):
    trace = load(write_session(tmp_path / "t.jsonl"))
    assert timelines_of(trace) == {}
    write_report(trace, tmp_path / "report.md")
    assert not (tmp_path / "report-phases.png").exists()


def test_compare_interleaves_and_judges(tmp_path):
    src = "// @knob A 1 {1,2,3}\nint k;\n"
    speed = {1: 100.0, 2: 90.0, 3: 100.0}

    def script(cand, opts):
        knobs = cand.resolved_knobs()
        if knobs["A"] == 3 and opts.get("time") is False:
            return failed(cand, FailureClass.wrong)
        return timed(cand, speed[knobs["A"]], seed=len(sandbox.calls))

    sandbox = FakeSandbox(script)
    versions = [Version("a", Candidate(source=src)), Version("b", Candidate(source=src, knobs={"A": 2})),
                Version("c", Candidate(source=src, knobs={"A": 3})), Version("a2", Candidate(source=src))]
    console = Console(record=True, width=200)
    rows = run_compare(versions, sandbox, rounds=3, samples=2, console=console)
    timed_order = [c.resolved_knobs()["A"] for c, o in sandbox.calls if o.get("check") is False]
    assert timed_order == [1, 2, 1, 2, 1, 1, 1, 1, 2]   # a b a2, b a2 a, a2 a b (the wrong one is never timed)
    verdicts = {(r["label"], r["ctx"]): r.get("verdict") for r in rows}
    assert verdicts[("b", 2048)] == "faster" and verdicts[("a2", 2048)] == "within noise"
    assert not versions[2].ok and "wrong" in versions[2].check
    print_compare(versions, rows, console, show_diff=True)
    out = console.export_text()
    assert "knobs: A 1->2" in out and "faster" in out
    a, b = versions[0], versions[3]
    assert diff_text(a.label, a.candidate, b.label, b.candidate) == "(identical source and knobs)"


def test_one_round_of_compare_gives_a_ratio_but_no_verdict(tmp_path):
    src = "// @knob A 1 {1,2}\nint k;\n"
    sandbox = FakeSandbox(lambda cand, opts: timed(cand, 100.0 if cand.resolved_knobs()["A"] == 1 else 80.0))
    versions = [Version("a", Candidate(source=src)), Version("b", Candidate(source=src, knobs={"A": 2}))]
    rows = run_compare(versions, sandbox, rounds=1, samples=5, console=Console(record=True, width=200))
    judged = [r for r in rows if "ratio" in r]
    assert judged and all(r["ratio"] > 1.2 and r["verdict"].startswith("no verdict") for r in judged)


def test_compare_rounds_that_share_a_module_load_count_as_one():
    """A worker keeps a bounded number of loads per build; rounds past it run from loads used before, and the
    interval must not count them as new placements."""
    src = "// @knob A 1 {1,2}\nint k;\n"
    turns = {}

    def script(cand, opts):
        res = timed(cand, 100.0 if cand.resolved_knobs()["A"] == 1 else 80.0, seed=len(sandbox.calls))
        turns[res.key] = turns.get(res.key, -1) + 1
        return res.model_copy(update={"placement": f"w:{res.key[:8]}:{turns[res.key] % 2}"})

    sandbox = FakeSandbox(script)
    versions = [Version("a", Candidate(source=src)), Version("b", Candidate(source=src, knobs={"A": 2}))]
    rows = run_compare(versions, sandbox, rounds=4, samples=2, console=Console(record=True, width=200))
    assert len(versions[1].rounds[2048]) == 2 and len(versions[1].samples[2048]) == 4 * 7   # 4 rounds, 2 loads
    assert all(r["verdict"] == "faster" for r in rows if "ratio" in r)


def test_a_version_that_drops_out_leaves_the_others_rotating_evenly():
    src = "// @knob A 1 {1,2,3}\nint k;\n"
    timings = {"n": 0}

    def script(cand, opts):
        a = cand.resolved_knobs()["A"]
        if a == 3 and opts.get("check") is False:
            timings["n"] += 1
            if timings["n"] == 1:
                return failed(cand, FailureClass.timeout)
        return timed(cand, 100.0)

    sandbox = FakeSandbox(script)
    versions = [Version(str(a), Candidate(source=src, knobs={"A": a})) for a in (1, 2, 3)]
    run_compare(versions, sandbox, rounds=4, samples=2, console=Console(record=True, width=200))
    order = [c.resolved_knobs()["A"] for c, o in sandbox.calls if o.get("check") is False]
    assert order == [1, 2, 3, 2, 1, 1, 2, 2, 1]   # 3 fails in round 0; then 2 1, 1 2, 2 1


def test_reexecute_says_why_a_recorded_version_now_fails(tmp_path):
    trace = load(write_session(tmp_path / "t.jsonl"))
    why = "step seed=7 ctx=3001: tensor out rel_l2=0.19 (max 0.05)"
    sandbox = FakeSandbox(lambda c, o: failed(c, FailureClass.wrong, message=why) if c.knobs.get("A") == 2
                          else timed(c, 200.0))
    rows = reexecute(trace, sandbox, kept_only=True, console=Console())
    assert {r["id"]: r["now"] for r in rows} == {"seed": "pass", "p1": "wrong"}
    console = Console(record=True, width=200)
    print_reexecute(trace, rows, console, "NVIDIA H200")
    assert f"p1 now fails: {why}" in console.export_text()
