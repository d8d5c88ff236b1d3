"""The LLM planner as an agent, through the real SDK against a local Messages API, in real sessions with a
scripted sandbox: every tool, the repair loop, caching, every stop_reason, the cost cap, the deadline,
knob merging, parents and duplicates, the notebook."""

import time

import pytest

from megakernel_agent.agent.planners.anthropic_planner import AnthropicPlanner
from megakernel_agent.agent.planners.prices import Price, UnknownModelPrice, parse_price, price_for
from megakernel_agent.agent.session import Session
from megakernel_agent.tasks.registry import get_task
from megakernel_agent.traces.loader import load
from megakernel_agent.traces.results import BuildResult, FailureClass

from .fake_anthropic import FakeAnthropic, calls, error, message, tool_use
from .fake_sandbox import FakeSandbox, failed, timed

KEY = "sk-ant-api03-" + "K" * 48
SRC = """// @knob A 2 {1,2,3}
// @knob B 8 {8,16}
__device__ float ss_init() { float ss = 0.0f; return ss; }
__global__ void k() { int unroll = 4; }
"""
TASK = get_task("kimi_linear", "small")
FASTER = {"search": "int unroll = 4;", "replace": "int unroll = 8;"}


@pytest.fixture(autouse=True)
def api_key(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)


def sandbox(cand, _opts):
    """'SYNTAX' does not build, 'BUG' is wrong, every 'unroll = 8' and A=3 make it faster."""
    if "SYNTAX" in cand.source:
        res = failed(cand, FailureClass.build, "build", "candidate.cu(4): error: expected a \";\"")
        res.build = BuildResult(ok=False, key="k", error=res.failure.message,
                                log="candidate.cu(4): error: expected a \";\"\n  __global__ void k() { SYNTAX }\n")
        return res
    if "BUG" in cand.source:
        return failed(cand, FailureClass.wrong, "check", "step seed=0 ctx=1: tensor out cos=0.1 rel_l2=1.3")
    k = cand.resolved_knobs()
    return timed(cand, 100.0 - 10 * cand.source.count("unroll = 8") - 5 * (k["A"] == 3))


def planner(url, **kw) -> AnthropicPlanner:
    return AnthropicPlanner(model="claude-sonnet-4-5", base_url=url, retry_wait_initial=0.01, retry_wait_max=0.05,
                            **kw)


def run(tmp_path, script, budget=120.0, **kw):
    with FakeAnthropic(script) as srv:
        s = Session(TASK, planner(srv.url, **kw), FakeSandbox(sandbox), budget, tmp_path / "run", start_source=SRC)
        summary = s.run()
    return s, summary, srv, load(tmp_path / "run" / "trace.jsonl")


def last_result(request) -> str:
    """The text of the last tool_result the planner sent."""
    blocks = [b for b in request["messages"][-1]["content"] if b.get("type") == "tool_result"]
    return blocks[-1]["content"] if blocks else ""


def test_every_study_tool_runs_and_is_recorded(tmp_path):
    script = [calls(("outline", {"version": "best"})),
              calls(("read", {"symbol": "ss_init"}), ("read", {"start": 4, "end": 4})),
              calls(("diagnose", {"version": "seed"})),
              calls(("note", {"kind": "prediction", "text": "unroll 8 halves the loop overhead: -10 us", "refs": []}),
                    ("propose", {"name": "u8", "hypothesis": "unroll 8", "predicted_us": {"2048": 90.0},
                                 "edits": [FASTER]})),
              calls(("compare", {"a": "seed", "b": "u8", "rounds": 2})),
              calls(("finish", {"reason": "done"}))]
    s, summary, srv, trace = run(tmp_path, script)
    assert summary.reason.startswith("planner finished: the model finished: done") and summary.kept == 1
    tools = {e.tool: e for e in trace.events if e.type == "tool_call"}
    assert set(tools) == {"outline", "read", "diagnose", "note", "compare"} and all(t.ok for t in tools.values())
    assert "function ss_init" in tools["outline"].output and "3| __device__ float ss_init" in srv.requests[2][
        "messages"][-1]["content"][0]["content"]
    assert "seed: correct" in tools["diagnose"].output
    assert "speedup of B over A" in tools["compare"].output and tools["compare"].device_s >= 0
    assert len(tools["compare"].versions) == 4   # two rounds of A and B, each an Evaluate event in the trace
    note = next(e for e in trace.events if e.type == "note")
    assert note.kind == "prediction" and "halves" in note.text
    proposal = next(e for e in trace.events if e.type == "proposal")
    assert proposal.name == "u8" and proposal.predicted_us == {2048: 90.0} and proposal.parent_id == "seed"
    assert "u8" in last_result(srv.requests[4]) or "kept" in last_result(srv.requests[4])


def test_a_failed_build_comes_back_with_its_log_and_is_repaired(tmp_path):
    broken = {"search": "int unroll = 4;", "replace": "int unroll = 8; SYNTAX"}
    fix = {"search": "int unroll = 8; SYNTAX", "replace": "int unroll = 8;"}
    script = [tool_use({"name": "v1", "hypothesis": "unroll 8", "edits": [broken]}),
              tool_use({"parent": "v1", "name": "v1-fixed", "hypothesis": "repair", "edits": [fix]}, tid="t2"),
              calls(("finish", {"reason": "done"}))]
    s, summary, srv, trace = run(tmp_path, script)
    shown = last_result(srv.requests[1])
    assert "build failed" in shown and "expected a" in shown and "propose with parent='p1'" in shown
    p2 = next(e for e in trace.events if e.type == "proposal" and e.id == "p2")
    assert p2.parent_id == "p1" and summary.kept == 1 and s.best.id == "p2"


def test_repairs_in_a_row_are_bounded(tmp_path):
    bug = [{"search": "int unroll = 4;", "replace": "int unroll = 4; BUG"}]
    def again(n):
        return [{"search": "BUG" + "x" * (n - 1), "replace": "BUG" + "x" * n}]

    script = [tool_use({"name": "b1", "hypothesis": "x", "edits": bug}),
              tool_use({"parent": "b1", "name": "b2", "hypothesis": "x", "edits": again(1)}, tid="t2"),
              tool_use({"parent": "b2", "name": "b3", "hypothesis": "x", "edits": again(2)}, tid="t3"),
              tool_use({"parent": "b3", "name": "b4", "hypothesis": "x", "edits": again(3)}, tid="t4"),
              calls(("finish", {"reason": "done"}))]
    s, summary, srv, trace = run(tmp_path, script, max_repairs=3)
    assert summary.failed_by_class == {"wrong": 3}
    refused = next(e for e in trace.events if e.type == "planner_error" and "failed versions in a row" in e.message)
    assert "p3 ends 3 failed versions" in refused.message
    assert "diverging" in last_result(srv.requests[1]) or "tensor out" in last_result(srv.requests[1])


def test_parents_by_name_knobs_merge_and_duplicates_are_refused_before_the_gpu(tmp_path):
    script = [tool_use({"name": "a3", "hypothesis": "A=3", "knobs": {"A": 3}}),
              tool_use({"parent": "a3", "name": "a3-u8", "hypothesis": "unroll on top", "edits": [FASTER]}, tid="t2"),
              tool_use({"parent": "a3-u8", "hypothesis": "B=16 too", "knobs": {"B": 16}}, tid="t3"),
              tool_use({"parent": "seed", "hypothesis": "A=3 again", "knobs": {"A": 3}}, tid="t4"),
              calls(("finish", {"reason": "done"}))]
    s, summary, srv, trace = run(tmp_path, script)
    props = {e.id: e for e in trace.events if e.type == "proposal"}
    assert props["p2"].parent_id == "p1" and props["p2"].knobs == {"A": 3}            # inherited
    assert props["p3"].parent_id == "p2" and props["p3"].knobs == {"A": 3, "B": 16}   # merged
    fails = {e.id: e.failure for e in trace.events if e.type == "failure"}
    assert fails["p4"].cls == FailureClass.duplicate and "p1" in fails["p4"].message
    evaluated = [(c.source_sha, c.knobs) for c, o in s.ev.calls if o.get("check", True)]
    assert evaluated.count((props["p1"].source_sha, {"A": 3})) == 1                    # never on the GPU twice
    assert "duplicate" in last_result(srv.requests[4])


def test_cache_breakpoints_and_cache_reads_over_several_turns(tmp_path):
    script = [calls(("outline", {}), usage={"cache_creation_input_tokens": 4000}),
              calls(("read", {"start": 1, "end": 2}), usage={"cache_read_input_tokens": 4000}),
              tool_use({"hypothesis": "unroll", "edits": [FASTER]}, {"cache_read_input_tokens": 4500}, tid="t3"),
              calls(("finish", {"reason": "done"}), usage={"cache_read_input_tokens": 5200})]
    s, summary, srv, trace = run(tmp_path, script)
    for req in srv.requests:
        assert req["system"][-1]["cache_control"] == {"type": "ephemeral"}
        marks = [b for m in req["messages"] for b in m["content"] if "cache_control" in b]
        assert len(marks) == 1 and marks[0] is req["messages"][-1]["content"][-1]
        assert [t["name"] for t in req["tools"]] == ["outline", "read", "profile", "diagnose", "compare", "model",
                                                     "note", "propose", "finish"]
    assert "Outline of the starting version seed" in srv.requests[0]["system"][-1]["text"]
    p1 = next(e for e in trace.events if e.type == "proposal")
    assert p1.llm.calls == 3 and p1.llm.cache_read_tokens == 8500 and p1.llm.cache_write_tokens == 4000
    assert summary.llm_cost_usd == pytest.approx(
        (4 * 1200 * 3 + 4 * 300 * 15 + 4000 * 3.75 + (4000 + 4500 + 5200) * 0.30) / 1e6)


def test_every_stop_reason_is_handled(tmp_path):
    script = [message([{"type": "text", "text": "thinking"}], stop="end_turn"),
              message([{"type": "text", "text": "x"}], stop="stop_sequence"),
              tool_use({"hypothesis": "cut"}, stop="max_tokens"),
              message([{"type": "text", "text": "working"}], stop="pause_turn"),
              message([], stop="model_context_window_exceeded"),
              tool_use({"hypothesis": "unroll", "edits": [FASTER]}, tid="t9"),
              message([{"type": "text", "text": "I will not"}], stop="refusal")]
    s, summary, srv, trace = run(tmp_path, script)
    errors = [e.message for e in trace.events if e.type == "planner_error"]
    assert any("no tool call" in m and "end_turn" in m for m in errors)
    assert any("stop_sequence" in m for m in errors) and any("max_tokens" in m for m in errors)
    after_cut = srv.requests[3]["messages"][-1]["content"]
    assert after_cut[0]["is_error"] and "token limit" in after_cut[-1]["text"]
    assert srv.requests[4]["messages"][-1]["role"] == "assistant"          # pause_turn: sent back as it was
    assert any(e.type == "note" and e.kind == "context" for e in trace.events)  # the window overflow compacted
    assert summary.kept == 1
    assert "refused" in summary.reason and any("refused" in m for m in errors)


def test_context_compaction_keeps_summaries_and_notes_it(tmp_path):
    script = [calls(("read", {"start": 1, "end": 4}), usage={"input_tokens": 1000}),
              calls(("outline", {}), usage={"input_tokens": 1000}),
              calls(("read", {"symbol": "ss_init"}), usage={"input_tokens": 200_000}),
              calls(("finish", {"reason": "done"}))]
    s, summary, srv, trace = run(tmp_path, script, keep_recent_messages=2)
    first_result = srv.requests[3]["messages"][2]["content"][0]["content"]
    assert first_result.startswith("[summary] read lines 1-4 of seed")
    assert any(e.type == "note" and e.kind == "context" and "summaries" in e.text for e in trace.events)


def test_the_cost_cap_holds_before_every_call(tmp_path):
    script = [calls(("outline", {}), usage={"output_tokens": 4000})] * 10
    s, summary, srv, trace = run(tmp_path, script, max_cost_usd=0.35, max_tokens=8000)
    assert "cost cap" in summary.reason and summary.llm_cost_usd <= 0.35
    assert len(srv.requests) < 10


def test_calls_and_retries_end_at_the_session_deadline(tmp_path):
    t0 = time.monotonic()
    s, summary, srv, trace = run(tmp_path, [error(529, "overloaded_error")] * 1000, budget=9.0,
                                 api_retries=1000)
    assert time.monotonic() - t0 < 15
    assert summary.reason in ("budget",) or "budget" in summary.reason or "planner failed" in summary.reason


def test_a_broken_response_body_is_a_planner_failure_and_the_session_goes_on(tmp_path):
    script = [(200, b"<html>proxy error</html>"), (200, b'{"id": "msg", "type": "mess'),
              tool_use({"hypothesis": "unroll", "edits": [FASTER]}), calls(("finish", {"reason": "done"}))]
    s, summary, srv, trace = run(tmp_path, script)
    errors = [e.message for e in trace.events if e.type == "planner_error"]
    assert sum("unusable API response" in m or "API error" in m for m in errors) == 2
    assert summary.kept == 1


def test_prices_are_data_and_unknown_models_are_refused():
    assert price_for("claude-opus-4-5-20251101").input == 5.0 and price_for("claude-opus-4-1").input == 15.0
    assert price_for("claude-haiku-4-5-20251001").output == 5.0
    with pytest.raises(UnknownModelPrice, match="--price"):
        price_for("gpt-9")
    assert price_for("gpt-9", parse_price("2,8")) == Price(input=2, output=8, cache_write=2.5, cache_read=0.2)
    haiku = price_for("claude-haiku-5-5")
    assert haiku.cost(150_000, 0, 0, 0) == pytest.approx(150_000 * 0.50 / 1e6)   # the long-prompt tier
    with pytest.raises(ValueError):
        AnthropicPlanner(model="some-new-model")


def test_a_resumed_session_starts_from_the_recorded_spend(tmp_path):
    script = [tool_use({"hypothesis": "unroll", "edits": [FASTER]}, {"output_tokens": 20000}),
              calls(("finish", {"reason": "done"}))]
    s, summary, srv, trace = run(tmp_path, script)
    spent = summary.llm_cost_usd
    assert spent > 0.3
    with FakeAnthropic([calls(("outline", {}))] * 5) as srv2:
        resumed = Session(TASK, planner(srv2.url, max_cost_usd=spent + 0.05), FakeSandbox(sandbox), 60,
                          tmp_path / "run", resume=trace)
        summary2 = resumed.run()
    assert "cost cap" in summary2.reason and len(srv2.requests) == 0


def test_the_profile_tool_shows_the_phase_timeline_and_records_it(tmp_path):
    from megakernel_agent.traces.phases import timelines_of
    from megakernel_agent.traces.results import PhaseRow, PhaseTimeline

    def profiled(cand, opts):
        res = sandbox(cand, opts)
        if opts.get("profile"):
            rows = [PhaseRow(name="L0 kda project", span_us=20.5, mean_us=15, wait_us=1.5, bytes=20_000_000, tbs=0.98)]
            res.phases = [PhaseTimeline(ctx=c, steps=7, blocks=264, rows=rows, kernel_us=22) for c in opts["profile"]]
        return res

    with FakeAnthropic([calls(("profile", {"version": "best", "contexts": [2048]})),
                        calls(("finish", {"reason": "done"}))]) as srv:
        s = Session(TASK, planner(srv.url), FakeSandbox(profiled), 60, tmp_path / "run", start_source=SRC)
        s.run()
    shown = last_result(srv.requests[1])
    assert "phase timeline of seed" in shown and "L0 kda project" in shown and "20.5" in shown
    trace = load(tmp_path / "run" / "trace.jsonl")
    call = next(e for e in trace.events if e.type == "tool_call")
    assert call.tool == "profile" and call.versions == ["seed~profile-t1"]
    assert timelines_of(trace)["seed"][0].rows[0].span_us == 20.5 and s.archive.get("seed").phases


def test_the_notebook_reaches_the_trace_and_the_report(tmp_path):
    from megakernel_agent.traces.report import write_report

    script = [calls(("note", {"kind": "prediction", "text": "unroll 8: -10 us from fewer loop branches",
                              "refs": ["seed"]}),
                    ("propose", {"name": "u8", "hypothesis": "unroll 8", "predicted_us": {"2048": 90, "16384": 95},
                                 "edits": [FASTER]})),
              calls(("note", {"kind": "dropped", "text": "B=16: no phase would gain", "refs": []})),
              calls(("finish", {"reason": "done"}))]
    s, summary, srv, trace = run(tmp_path, script)
    for suffix in (".html", ".md"):
        text = write_report(trace, tmp_path / f"r{suffix}").read_text()
        assert "Predictions against outcomes" in text and "90.0 / 95.0" in text
        assert "Notebook" in text and "fewer loop branches" in text and "B=16: no phase would gain" in text
        assert "Tool calls" in text and "cache read" in text


def test_a_full_context_with_nothing_left_to_shorten_ends_the_planner_instead_of_asking_again(tmp_path):
    script = [message([], stop="model_context_window_exceeded")] * 5
    s, summary, srv, trace = run(tmp_path, script)
    assert len(srv.requests) == 1
    assert summary.reason.startswith("planner failed 1 time(s): the context window is full")


def test_a_resumed_session_numbers_its_tool_calls_and_notes_on_from_the_trace(tmp_path):
    first = [calls(("outline", {"version": "best"})), calls(("note", {"kind": "observation", "text": "a"})),
             calls(("finish", {"reason": "pause"}))]
    run(tmp_path, first)
    again = [calls(("outline", {"version": "best"})), calls(("note", {"kind": "observation", "text": "b"})),
             calls(("finish", {"reason": "done"}))]
    with FakeAnthropic(again) as srv:
        Session(TASK, planner(srv.url), FakeSandbox(sandbox), 120.0, tmp_path / "run",
                resume=load(tmp_path / "run" / "trace.jsonl")).run()
    ids = [e.id for e in load(tmp_path / "run" / "trace.jsonl").events if e.type in ("tool_call", "note")]
    assert len(ids) == 6 and len(set(ids)) == 6, ids


def test_with_two_in_flight_the_model_proposes_while_its_last_version_evaluates_and_hears_the_outcome_later(tmp_path):
    def slow(cand, opts):
        time.sleep(0.6 if opts.get("check", True) and cand.source != SRC else 0.0)
        return sandbox(cand, opts)

    script = [calls(("propose", {"name": "u8", "hypothesis": "unroll 8", "edits": [FASTER]})),
              calls(("propose", {"name": "a3", "hypothesis": "A=3", "parent": "seed", "knobs": {"A": 3}})),
              calls(("finish", {"reason": "done"}))]
    with FakeAnthropic(script) as srv:
        s = Session(TASK, planner(srv.url), FakeSandbox(slow), 120.0, tmp_path / "run", start_source=SRC, inflight=2)
        summary = s.run()
    second, third = srv.requests[1], srv.requests[2]
    assert "p1: in flight" in last_result(second) and "being evaluated while you plan" in last_result(second)
    told = [b["text"] for b in third["messages"][-1]["content"] if b.get("type") == "text"]
    assert any(t.startswith("Decided since: p1: kept") for t in told), told
    trace = load(tmp_path / "run" / "trace.jsonl")
    p2 = next(e for e in trace.events if e.type == "proposal" and e.id == "p2")
    assert p2.in_flight == ["p1"] and p2.best_seen == "seed"
    assert summary.reason.startswith("planner finished")
    assert [a.outcome for a in trace.attempts()] == ["kept", "slower"]   # p2 is judged against p1, kept meanwhile


def test_the_compare_tool_waits_for_a_free_lane_instead_of_sharing_a_busy_one(tmp_path):
    import threading
    running, most, lock = [0], [0], threading.Lock()

    def exclusive(cand, opts):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.4)
        with lock:
            running[0] -= 1
        return sandbox(cand, opts)

    script = [calls(("propose", {"name": "u8", "hypothesis": "unroll 8", "edits": [FASTER]})),
              calls(("compare", {"a": "seed", "b": "seed", "rounds": 1})),
              calls(("finish", {"reason": "done"}))]
    with FakeAnthropic(script) as srv:
        s = Session(TASK, planner(srv.url), FakeSandbox(exclusive), 120.0, tmp_path / "run", start_source=SRC,
                    inflight=2)
        s.run()
    trace = load(tmp_path / "run" / "trace.jsonl")
    assert any(e.type == "tool_call" and e.tool == "compare" and e.ok for e in trace.events)
    assert most[0] == 1, "the compare tool ran on the lane an attempt was using"
