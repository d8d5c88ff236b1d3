"""The report's numbers from fixture traces and the shipped examples: one baseline, one best with its source,
outcome words, per-context intervals, failure reasons, kept diffs, resources, and plots that draw measured
values only, on a scale that shows the improvement."""

import math
import re
import statistics
from pathlib import Path

import matplotlib.pyplot as plt
import pytest

from megakernel_agent.sandbox.stats import ratio_interval
from megakernel_agent.traces.loader import load
from megakernel_agent.traces.plots import bars, plots, progress
from megakernel_agent.traces.recorder import Recorder
from megakernel_agent.traces.render import NOT_FASTER, primary_ctx, timeline
from megakernel_agent.traces.report import summary_rows, write_report
from megakernel_agent.traces.results import FailureClass
from megakernel_agent.traces.schema import SessionEnd
from megakernel_agent.traces.sections import failures, per_context, resources
from megakernel_agent.traces.timings import judgements

from .trace_fixtures import Try, session_start, write_session

EXAMPLES = sorted(Path(__file__).resolve().parent.parent.glob("traces/examples/*/trace.jsonl"))
FIVE = (0.99, 1.0, 1.01, 1.0, 0.995)   # the fixture's sample factors


def session(tmp_path, *tries: Try):
    return load(write_session(tmp_path / "t.jsonl", tries=tries))


def test_every_speedup_divides_the_seed_workers_baseline_and_the_report_says_so(tmp_path):
    trace = session(tmp_path, Try("p1", 180.0, kept=True, base=28000.0), Try("p2", 190.0, cls=FailureClass.slower,
                                                                              base=21000.0))
    assert [r["speedup"] for r in timeline(trace)] == pytest.approx([15000 / 220, 15000 / 198, 15000 / 209])
    fig = bars(trace, "speedup")
    heights = [p.get_height() for p in fig.axes[0].patches]
    plt.close(fig)
    assert heights == pytest.approx([15000 / 200, 15000 / 220, 15000 / 180, 15000 / 198])
    line = dict(summary_rows(trace))["baseline"]
    assert "timed with seed: 15000 / 15000" in line and "15000-28000" in line


def test_a_confirmed_best_is_one_pooled_figure_with_its_source_everywhere(tmp_path):
    trace = session(tmp_path, Try("p1", 180.0, kept=True, retimed_us=[190.0, 188.0]))
    pooled = statistics.median([u * 1.1 * f for u in (180.0, 190.0, 188.0) for f in FIVE])
    assert timeline(trace)[-1]["best_us"] == pytest.approx(pooled)
    rows = dict(summary_rows(trace))
    assert f"{pooled:.1f} µs" in rows["outcome"] and "session's line" not in rows
    assert "median of 15 samples: first timing + 2 interleaved confirmation re-timings" in rows["best"]
    trace.events[-1] = SessionEnd(best_id="p1", reason="budget", summary={"line": "old", "best_us": {"16384": 198.0}})
    assert "old (its best differs" in dict(summary_rows(trace))["session's line"]


def test_a_version_not_faster_beyond_noise_is_not_called_slower(tmp_path):
    trace = session(tmp_path, Try("p1", 198.0, cls=FailureClass.slower, ratio=(1.012, 0.999, 1.027)),
                    Try("p2", 230.0, cls=FailureClass.slower, ratio=(0.87, 0.86, 0.88)))
    assert [r["shown"] for r in timeline(trace)][1:] == [NOT_FASTER, "slower"]
    assert [r["outcome"] for r in timeline(trace)][1:] == ["slower", "slower"]   # the recorded class stays
    md = write_report(trace, tmp_path / "r.md").read_text()
    assert f"| 1 | p1 | try {{'A': 2}} | {NOT_FASTER} |" in md and "| 2 | p2 | try {'A': 2} | slower |" in md


def test_the_per_context_table_gives_each_judged_ratio_with_its_interval(tmp_path):
    trace = session(tmp_path, Try("p1", 180.0, kept=True, ratio=(1.11, 1.1, 1.12)),
                    Try("p2", 185.0, {"A": 1}, cls=FailureClass.slower, ratio=(0.97, 0.96, 0.98)))
    table = per_context(trace)
    rows = {r[0]: dict(zip(table.head, r, strict=True)) for r in table.rows}
    r, lo, hi = ratio_interval([200 * f for f in FIVE], [180 * f for f in FIVE])
    assert rows["p1"]["ctx 2048: µs · ratio [95%]"] == f"180.0 · {r:.3f}x [{lo:.3f}, {hi:.3f}]"
    assert rows["p1"]["judged against"] == "seed" and rows["p1"]["decision: geomean [lowest, highest]"] == (
        "1.110x [1.100, 1.120]")
    assert rows["p2"]["judged against"] == "p1"
    assert rows["seed"]["ctx 16384: µs · ratio [95%]"] == "220.0"


def test_failures_are_given_in_the_words_recorded(tmp_path):
    why_wrong = "step seed=7 ctx=3001: tensor out cos=0.9811 (min 0.98) rel_l2=0.1947 (max 0.05)"
    why_build = "grid cannot co-reside: kernel asks for 2 blocks/SM of 512 threads but only 1 fit"
    trace = session(tmp_path, Try("p1", None, cls=FailureClass.wrong, message=why_wrong),
                    Try("p2", None, cls=FailureClass.build, message=why_build),
                    Try("p3", 201.0, cls=FailureClass.slower, ratio=(0.99, 0.98, 1.0)))
    assert [r[:2] + r[3:] for r in failures(trace).rows] == [["p1", "wrong", why_wrong], ["p2", "build", why_build]]
    assert why_build in write_report(trace, tmp_path / "r.html").read_text()


def test_each_kept_change_is_shown_as_its_diff_against_its_parent(tmp_path):
    trace = session(tmp_path, Try("p1", 180.0, {"A": 2}, kept=True), Try("p2", 181.0, {"A": 1},
                                                                          cls=FailureClass.slower))
    md = write_report(trace, tmp_path / "r.md").read_text()
    kept = md[md.index("## Kept changes"):]
    assert "### p1 against its parent seed" in kept and "knobs: A 1->2" in kept and "p2 against" not in kept


def test_resources_per_version_are_tabled_and_a_failed_build_has_none(tmp_path):
    trace = session(tmp_path, Try("p1", 180.0, kept=True), Try("p2", None, cls=FailureClass.build, message="e"))
    table = resources(trace)
    assert [r[0] for r in table.rows] == ["seed", "p1"]
    row = dict(zip(table.head, table.rows[1], strict=True))
    assert (row["registers"], row["spills (B)"], row["dynamic smem (B)"], row["blocks/SM (fit)"]) == (
        "128", "24", "57568", "2 (2)")


def test_an_attempt_without_a_timing_has_no_point_in_the_progress_plot(tmp_path):
    trace = session(tmp_path, Try("p1", 180.0, kept=True), Try("p2", None, cls=FailureClass.build, message="e"))
    fig = progress(trace)
    ax = fig.axes[0]
    points = [tuple(xy) for c in ax.collections for xy in c.get_offsets()]
    low, _ = ax.get_ylim()
    plt.close(fig)
    assert sorted(x for x, _ in points) == [0, 1] and low > 190   # no point at step 2, nothing below the best


def test_one_slow_outlier_does_not_flatten_the_improvement(tmp_path):
    trace = session(tmp_path, Try("p1", 190.0, kept=True), Try("p2", 317.0, cls=FailureClass.slower))
    fig = progress(trace)
    low, high = fig.axes[0].get_ylim()
    labels = [t.get_text() for t in fig.axes[0].texts]
    plt.close(fig)
    assert high < 1.2 * 220 and (220 - 209) / (high - low) > 0.25
    assert f"{317 * 1.1:.0f}" in labels   # the outlier is drawn on the top edge with its value


def test_a_trace_with_only_its_first_line_renders_without_plots(tmp_path):
    with Recorder(tmp_path / "t.jsonl") as rec:
        rec.record(session_start())
    trace = load(tmp_path / "t.jsonl")
    assert plots(trace) == {}
    md = write_report(trace, tmp_path / "r.md").read_text()
    assert "no version was timed" in md and "interrupted" in md and not list(tmp_path.glob("*.png"))
    assert "data:image/png" not in write_report(trace, tmp_path / "r.html").read_text()


def _timeline_table(md: str) -> list[list[str]]:
    body = md[md.index("## Timeline"):].split("\n## ")[0]
    return [[c.strip() for c in line.strip("|").split(" | ")] for line in body.splitlines()
            if re.match(r"\| \d+ \|", line)]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.parent.name)
def test_each_shipped_report_is_current_and_agrees_with_the_replay_timeline(path, tmp_path):
    trace = load(path)
    shipped = (path.parent / "report.md").read_text()
    assert shipped == write_report(trace, tmp_path / "report.md").read_text()   # re-rendered with this code
    rows = timeline(trace)
    want = [[str(r["step"]), r["id"], r["shown"], f"{r['us']:.1f}" if r["us"] else "-",
             f"{r['speedup']:.1f}x" if r["speedup"] else "-", f"{r['best_us']:.1f}"] for r in rows]
    assert [[c[0], c[1], *c[3:]] for c in _timeline_table(shipped)] == want
    outcome = dict(summary_rows(trace))["outcome"]
    assert outcome.endswith(f"ctx {primary_ctx(trace)}: {rows[0]['us']:.1f} -> {rows[-1]['best_us']:.1f} µs")


@pytest.mark.parametrize("name", ["kimi-tuner-h200-10m", "kimi-scripted-history"])
def test_where_the_trace_holds_every_sample_the_report_reproduces_the_sessions_own_figures(name):
    trace = load(next(p for p in EXAMPLES if p.parent.name == name))
    end = trace.events[-1]
    assert timeline(trace)[-1]["best_us"] == pytest.approx(end.summary["best_us"][str(primary_ctx(trace))])
    judged = judgements(trace)
    decided = [a.decision for a in trace.attempts() if a.decision and a.decision.ratio is not None]
    assert len(judged) == len(decided)
    for d in decided:
        ratios = judged[d.id].ratios.values()
        geomean = math.exp(statistics.mean(math.log(r) for r, _, _ in ratios))
        assert (geomean, min(lo for _, lo, _ in ratios), max(hi for *_, hi in ratios)) == (
            pytest.approx(d.ratio), pytest.approx(d.ratio_low), pytest.approx(d.ratio_high))


def test_a_lone_measure_gets_whole_attempt_ticks_and_a_readable_span(tmp_path):
    fig = progress(session(tmp_path))
    ax = fig.axes[0]
    ticks, (low, high) = [t for t in ax.get_xticks() if -0.5 <= t <= 0.5], ax.get_ylim()
    plt.close(fig)
    assert list(ticks) == [0] and high - low >= 0.04 * 220
