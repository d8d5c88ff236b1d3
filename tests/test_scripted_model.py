"""The scripted model (a recorded model replayed through the real SDK) and the git-history script writer."""

import json
import subprocess
from pathlib import Path

import pytest

from megakernel_agent.agent.edits import Edit, apply_edits
from megakernel_agent.agent.history_script import edits_between, prediction, script
from megakernel_agent.agent.planners.anthropic_planner import AnthropicPlanner
from megakernel_agent.agent.scripted_model import ScriptedModel, load_script
from megakernel_agent.agent.session import Session
from megakernel_agent.tasks.registry import get_task
from megakernel_agent.traces.loader import load
from megakernel_agent.traces.results import FailureClass

from .fake_sandbox import FakeSandbox, failed, timed

ROOT = Path(__file__).resolve().parent.parent
SRC = "// @knob A 2 {1,2,3}\nint unroll = 4;\nint other = 1;\n"


def test_edits_between_reproduce_the_new_version_with_unique_anchors():
    old = "".join(f"void f{i}() {{\n  x += 1;\n  y += 1;\n}}\n" for i in range(20))   # many repeated lines
    new = old.replace("void f3() {\n  x += 1;", "void f3() {\n  x += 2;").replace(
        "void f9() {\n  x += 1;\n  y += 1;\n", "void f9() {\n  y += 1;\n")
    edits = edits_between(old, new)
    assert apply_edits(old, edits) == new
    assert all(old.count(e.search) >= 1 for e in edits)


def test_the_prediction_is_the_last_triple_after_an_arrow():
    msg = "compare vs x: 329.2/340.4/352.7 -> 294.2/307.9/318.8 (refactor) -> 293.0/305.4/316.4 µs/token"
    assert prediction(msg) == {2048: 293.0, 8192: 305.4, 16384: 316.4}
    assert prediction("comment only") == {}


def test_a_session_plays_a_scripted_model_through_the_sdk(tmp_path):
    turns = [{"model": "claude-sonnet-4-5", "description": "test"},
             {"content": [{"type": "tool_use", "name": "outline", "input": {}}]},
             {"content": [{"type": "tool_use", "name": "propose", "input": {
                 "name": "u8", "hypothesis": "unroll", "predicted_us": {"2048": 90},
                 "edits": [{"search": "int unroll = 4;", "replace": "int unroll = 8;"}]}}]},
             {"content": [{"type": "tool_use", "name": "propose", "input": {
                 "parent": "u8", "name": "a3", "hypothesis": "A=3 on top", "knobs": {"A": 3}}}]},
             {"content": [{"type": "tool_use", "name": "compare", "input": {"a": "seed", "b": "best", "rounds": 1}}]}]
    path = tmp_path / "script.jsonl"
    path.write_text("\n".join(json.dumps(t) for t in turns) + "\n")
    header, parsed = load_script(path)
    assert header.model == "claude-sonnet-4-5" and len(parsed) == 4

    def sandbox(cand, _opts):
        return timed(cand, 100.0 - 10 * cand.source.count("unroll = 8") - 5 * (cand.resolved_knobs()["A"] == 3))

    with ScriptedModel.from_file(path) as model:
        planner = AnthropicPlanner(model=header.model, base_url=model.url, api_key="scripted-model")
        summary = Session(get_task("kimi_linear", "small"), planner, FakeSandbox(sandbox), 60, tmp_path / "run",
                          start_source=SRC).run()
    assert summary.kept == 2 and summary.reason.startswith("planner finished: the model finished: the script")
    trace = load(tmp_path / "run" / "trace.jsonl")
    props = [e for e in trace.events if e.type == "proposal"]
    assert [p.name for p in props] == ["u8", "a3"] and props[1].parent_id == props[0].id
    assert props[1].llm.cache_read_tokens > 0       # the scripted usage models the cached prefix
    assert any(e.type == "tool_call" and e.tool == "compare" for e in trace.events)


def _has(commit: str) -> bool:
    return subprocess.run(["git", "cat-file", "-e", commit], cwd=ROOT, capture_output=True).returncode == 0


@pytest.mark.skipif(not _has("2d0f2c2") or not _has("b7b7e0a"), reason="needs this repository's git history")
def test_the_history_script_replays_real_commits_as_edits():
    start, turns = script("2d0f2c2", "b7b7e0a", ROOT)
    proposals = [b["input"] for t in turns for b in t["content"] if b.get("name") == "propose"]
    names = [p.get("name") for p in proposals]
    assert names == ["h-66b1e36", "attn-skip-new-token", "h-b7b7e0a"]
    assert proposals[2]["parent"] == "h-66b1e36" and proposals[2]["predicted_us"]
    version = start
    for p in (proposals[0], proposals[2]):
        version = apply_edits(version, [Edit(**e) for e in p["edits"]])
    assert version == subprocess.run(["git", "show", "b7b7e0a:kernels/kimi_linear/seed.cu"], cwd=ROOT,
                                     capture_output=True, text=True).stdout
    assert turns[-1]["content"][0]["name"] == "finish"


@pytest.mark.skipif(not _has("2d0f2c2") or not _has("755e76e"), reason="needs this repository's git history")
def test_the_whole_history_script_runs_through_a_session(tmp_path):
    """The shipped script's logic on a scripted sandbox: every edit applies, names resolve, the wrong and the
    broken proposals are refused with their reasons, the broken one is repaired, the slower one not kept."""
    start, turns = script("2d0f2c2", "755e76e", ROOT, skip={"069d75e"})
    path = tmp_path / "script.jsonl"
    path.write_text("\n".join(json.dumps(t) for t in [{"model": "claude-sonnet-4-5"}, *turns]) + "\n")

    def sandbox(cand, opts):
        if "const int tokens = cx.ctx_len;" in cand.source:
            return failed(cand, FailureClass.wrong, "check", "step seed=0 ctx=1: tensor L3.c_kv_row cos=0.5")
        if "__device__ float block_sum(float v, float* red)\n" in cand.source:   # the scripted typo
            return failed(cand, FailureClass.build, "build", "candidate.cu(196): error: expected a \"{\"")
        return timed(cand, 330.0 - len(cand.source) / 1000 + 3 * (cand.resolved_knobs().get("PREFETCH") == 0))

    with ScriptedModel.from_file(path) as model:
        planner = AnthropicPlanner(model="claude-sonnet-4-5", base_url=model.url, api_key="scripted-model")
        summary = Session(get_task("kimi_linear", "full"), planner, FakeSandbox(sandbox), 300, tmp_path / "run",
                          start_source=start).run()
    trace = load(tmp_path / "run" / "trace.jsonl")
    outcome = {a.proposal.name: a.outcome for a in trace.attempts()}
    assert outcome["attn-skip-new-token"] == "wrong" and outcome["c0861b6-typo"] == "build"
    assert outcome["h-c0861b6"] == "kept" and outcome["no-prefetch"] == "slower"
    refused = [e for e in trace.events if e.type == "planner_error"]
    assert not refused, "every scripted call was accepted"
    assert summary.reason.startswith("planner finished") and summary.kept >= 3
    assert {e.tool for e in trace.events if e.type == "tool_call"} >= {"outline", "profile", "diagnose", "note",
                                                                         "compare"}
