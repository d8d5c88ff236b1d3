"""The Anthropic planner through the real SDK against a local Messages API server."""

import pytest

from agent.planners.anthropic_planner import AnthropicPlanner
from agent.planners.base import PlannerExhausted, PlannerFailure, PlannerView
from agent.session import Session
from sandbox.candidate import parse_knobs
from tasks.registry import get_task
from traces.loader import load

from .fake_anthropic import FakeAnthropic, error, message, tool_use
from .fake_sandbox import FakeSandbox, timed
from .trace_fixtures import DEVICE

KEY = "sk-ant-api03-" + "K" * 48
SRC = "// @knob A 2 {1,2,3}\n__global__ void k() { int unroll = 4; }\n"
GOOD = {"hypothesis": "unroll more", "predicted_change": "-3%",
        "edits": [{"search": "int unroll = 4;", "replace": "int unroll = 8;"}], "knobs": {"A": 3}}


@pytest.fixture(autouse=True)
def api_key(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)


def view() -> PlannerView:
    return PlannerView(task_name="t", task_description="d", dims={}, context_lengths=[2048],
                       bytes_per_step={2048: 10**8}, hardware=DEVICE, abi="struct P {};", best_id="seed",
                       best_source=SRC, best_knobs={"A": 2}, declared_knobs=parse_knobs(SRC),
                       best_us_per_ctx={2048: 200.0}, baseline_us_per_ctx={2048: 15000.0}, history=[],
                       budget_left_s=500)


def planner(url, **kw) -> AnthropicPlanner:
    return AnthropicPlanner(model="claude-sonnet-4-5", base_url=url, retry_wait_initial=0.01, retry_wait_max=0.05,
                            **kw)


def test_transient_errors_are_retried_then_the_tool_call_is_used():
    script = [error(429, "rate_limit_error"), error(529, "overloaded_error"), error(500, "api_error"),
              tool_use(GOOD, {"cache_creation_input_tokens": 5000})]
    with FakeAnthropic(script) as srv:
        p = planner(srv.url)
        out = p.propose(view())
    assert len(srv.requests) == 4
    assert out.source == SRC.replace("unroll = 4", "unroll = 8") and out.knobs == {"A": 3}
    assert out.llm.retries == 3 and out.llm.calls == 1
    assert out.llm.cost_usd == pytest.approx((1200 * 3 + 300 * 15 + 5000 * 3.75) / 1e6)
    req = srv.requests[-1]
    assert req["system"][0]["cache_control"] == {"type": "ephemeral"}          # cached static prefix
    assert req["tools"][0]["name"] == "propose_kernel" and req["model"] == "claude-sonnet-4-5"
    sent = srv.headers[-1].get("x-api-key", "") + srv.headers[-1].get("authorization", "")
    assert KEY in sent  # the SDK authenticates with it; the planner stores it nowhere


def test_bad_replies_go_back_to_the_model_with_the_exact_error():
    bad_edit = {**GOOD, "edits": [{"search": "int unroll = 5;", "replace": "x"}]}
    malformed = {"hypothesis": "h", "predicted_change": "p", "knobs": "not-an-object"}
    script = [message([{"type": "text", "text": "thinking aloud, no tool"}], stop="end_turn"),
              tool_use(malformed, tid="t2"), tool_use(bad_edit, tid="t3"),
              tool_use(GOOD, {"cache_read_input_tokens": 5000}, tid="t4")]
    errors = []
    with FakeAnthropic(script) as srv:
        p = planner(srv.url)
        p.on_error = lambda msg, usage: errors.append(msg)
        out = p.propose(view())
    assert out.hypothesis == "unroll more" and out.llm.calls == 4 and out.llm.cache_read_tokens == 5000
    assert "no propose_kernel tool call" in errors[0]
    assert "knobs" in errors[1] and "search text not found" in errors[2]
    last = srv.requests[-1]["messages"]
    assert last[-1]["content"][0]["type"] == "tool_result" and last[-1]["content"][0]["is_error"] is True
    assert "search text not found" in last[-1]["content"][0]["content"]


def test_turn_retries_are_bounded():
    script = [message([{"type": "text", "text": "no"}], stop="end_turn")] * 3
    with FakeAnthropic(script) as srv, pytest.raises(PlannerFailure, match="no usable proposal after 3"):
        planner(srv.url, max_turn_retries=2).propose(view())


def test_cost_cap_ends_planning():
    with FakeAnthropic([tool_use(GOOD, {"output_tokens": 100000})]) as srv:
        p = planner(srv.url, max_cost_usd=1.0)
        p.propose(view())
        with pytest.raises(PlannerExhausted, match="cost cap"):
            p.propose(view())


def test_a_session_records_usage_and_never_the_key(tmp_path):
    second = {"hypothesis": "fewer units", "predicted_change": "+1%", "knobs": {"A": 1}}
    script = [error(429, "rate_limit_error"), tool_use(GOOD), tool_use(second)]
    task = get_task("kimi_linear", "small")
    with FakeAnthropic(script) as srv:
        sandbox = FakeSandbox(lambda c, o: timed(c, 90.0 if "unroll = 8" in c.source else 100.0))
        s = Session(task, planner(srv.url, max_cost_usd=100), sandbox, 60.0, tmp_path, start_source=SRC)
        summary = s.run()
    text = (tmp_path / "trace.jsonl").read_text()
    assert KEY not in text
    trace = load(tmp_path / "trace.jsonl")
    proposals = [e for e in trace.events if e.type == "proposal"]
    assert proposals[0].llm.retries == 1 and proposals[0].llm.cost_usd > 0
    assert len(proposals) == 2 and proposals[1].knobs == {"A": 1}
    charged = [e.llm.cost_usd for e in trace.events if e.type in ("proposal", "planner_error") and e.llm]
    assert summary.llm_cost_usd == pytest.approx(sum(charged)) and summary.llm_cost_usd > 0
    assert trace.start.planner_settings["model"] == "claude-sonnet-4-5"
