"""Trace schema, recorder durability, loader recovery, redaction and rendering (CPU only)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from megakernel_agent.sandbox.stats import grouped_ratio_interval, ratio_interval, verdict, verdict_of
from megakernel_agent.traces.loader import TraceError, load
from megakernel_agent.traces.recorder import Recorder
from megakernel_agent.traces.redaction import redact
from megakernel_agent.traces.render import render, timeline
from megakernel_agent.traces.schema import EVENT, PlannerError

from .trace_fixtures import SEED_SRC, write_session

ROOT = Path(__file__).resolve().parent.parent


def test_schema_round_trip(tmp_path):
    trace = load(write_session(tmp_path / "t.jsonl"))
    for ev in trace.events:
        again = EVENT.validate_json(ev.model_dump_json())
        assert again == ev
    assert [a.outcome for a in trace.attempts()] == ["kept", "wrong", "slower"]


def test_sources_are_stored_once(tmp_path):
    path = write_session(tmp_path / "t.jsonl")
    lines = path.read_text().splitlines()
    carrying = [ln for ln in lines if '"source":"' in ln.replace(" ", "")]
    assert len(carrying) == 1  # the measure carries it; every proposal only references it
    trace = load(path)
    assert trace.version("p3") == (SEED_SRC, {"A": 2})


def test_first_use_of_a_source_must_carry_it(tmp_path):
    from megakernel_agent.traces.schema import Proposal

    with Recorder(tmp_path / "t.jsonl") as rec, pytest.raises(ValueError, match="must carry"):
        rec.record(Proposal(id="p", parent_id="s", planner="x", hypothesis="h", predicted_change="",
                            source_sha="abc"))


def test_torn_last_line_is_dropped_with_a_warning(tmp_path):
    path = write_session(tmp_path / "t.jsonl")
    text = path.read_text()
    path.write_text(text + text.splitlines()[1][:50])
    trace = load(path)
    assert len(trace.events) == len(text.splitlines()) and "incomplete" in trace.warnings[0]


def test_corrupt_middle_line_is_an_error(tmp_path):
    path = write_session(tmp_path / "t.jsonl")
    lines = path.read_text().splitlines()
    lines[2] = lines[2][:30]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceError, match=":3: corrupt"):
        load(path)


WRITER = """
import sys, time
sys.path.insert(0, {root!r})
from megakernel_agent.traces.recorder import Recorder
from megakernel_agent.traces.schema import PlannerError
rec = Recorder({path!r})
i = 0
while True:
    rec.record(PlannerError(id=f"p{{i}}", planner="x", message="m" * 2000))
    i += 1
"""


def test_kill_9_mid_stream_leaves_a_valid_prefix(tmp_path):
    path = tmp_path / "killed.jsonl"
    proc = subprocess.Popen([sys.executable, "-c", WRITER.format(root=str(ROOT), path=str(path))])
    deadline = time.time() + 20
    while (not path.exists() or path.stat().st_size < 200_000) and time.time() < deadline:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    trace = load(path)
    assert len(trace.events) > 50
    assert all(isinstance(e, PlannerError) for e in trace.events)
    assert [e.id for e in trace.events] == [f"p{i}" for i in range(len(trace.events))]


def test_secrets_never_reach_the_file(tmp_path, monkeypatch):
    key = "sk-ant-api03-" + "Z" * 40
    monkeypatch.setenv("ANTHROPIC_API_KEY", key)
    with Recorder(tmp_path / "t.jsonl") as rec:
        rec.record(PlannerError(id="p", planner="anthropic", message=f"401 for key {key}; header x-api-key: {key}"))
        rec.record(PlannerError(id="q", planner="anthropic", message="Authorization: Bearer abcdefghijklmnop1234"))
    text = (tmp_path / "t.jsonl").read_text()
    assert key not in text and "abcdefghijklmnop1234" not in text and text.count("[REDACTED]") >= 2
    assert redact("nothing secret here") == "nothing secret here"


def test_every_secret_named_variable_and_common_token_shapes_are_redacted(monkeypatch):
    aws = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
    pat = "a1b2c3d4e5f6a7b8c9d0"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", aws)
    monkeypatch.setenv("GH_PAT", pat)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3,4,5")  # not secret-named: stays
    shapes = ["sk-proj-" + "a" * 30, "AKIA" + "B" * 16, "ghp_" + "c" * 36, "github_pat_" + "d" * 40,
              "xoxb-123456789-abcdef", "aws_secret_access_key=" + "E" * 40, "Bearer " + "f" * 24]
    text = redact(" | ".join([aws, pat, "0,1,2,3,4,5", *shapes, "mask-based-tiling-for-the-phase"]))
    assert aws not in text and pat not in text
    assert not any(s[-8:] in text for s in shapes)
    assert "0,1,2,3,4,5" in text and "mask-based-tiling-for-the-phase" in text
    assert "aws_secret_access_key=[REDACTED]" in text and "Bearer [REDACTED]" in text


def test_render_timeline_of_a_fixture_trace(tmp_path):
    trace = load(write_session(tmp_path / "t.jsonl"))
    rows = timeline(trace)
    assert [r["outcome"] for r in rows] == ["measured", "kept", "wrong", "slower"]
    assert rows[1]["best_us"] == pytest.approx(198.0) and rows[3]["best_us"] == pytest.approx(198.0)
    console = Console(record=True, width=200)
    render(trace, console, this_gpu="NVIDIA A100")
    out = console.export_text()
    assert "timeline" in out and "kept" in out and "not comparable" in out


def test_unfinished_session_is_reported(tmp_path):
    trace = load(write_session(tmp_path / "t.jsonl", finish=False))
    console = Console(record=True, width=200)
    render(trace, console)
    assert "interrupted" in console.export_text()


def test_compare_statistics_on_synthetic_samples():
    import random

    rng = random.Random(1)
    a = [100 + rng.gauss(0, 0.5) for _ in range(30)]
    faster = [90 + rng.gauss(0, 0.5) for _ in range(30)]
    same = [100 + rng.gauss(0, 0.5) for _ in range(30)]
    noisy = [100 + rng.gauss(0, 15) for _ in range(6)]
    assert verdict(a, faster)[0] == "faster"
    assert verdict(faster, a)[0] == "slower"
    assert verdict(a, same)[0] == "within noise"
    assert verdict(a, noisy)[0] == "within noise"
    r, lo, hi = ratio_interval(a, faster)
    assert lo < r < hi and lo > 1.05
    assert json.dumps(ratio_interval(a, a, seed=3)) == json.dumps(ratio_interval(a, a, seed=3))  # deterministic


def test_rounds_that_share_a_bias_widen_the_interval_instead_of_passing_for_independent_samples():
    def rounds(base, biases):   # three tight samples per round around the round's own offset (its module load)
        return [[base + b + e for e in (-0.2, 0.0, 0.2)] for b in biases]

    a, b = rounds(204.0, [0, 4, -3, 2, -1]), rounds(200.0, [-3, 3, -1, -2, 1])
    pooled = ratio_interval([x for r in a for x in r], [x for r in b for x in r])
    grouped = grouped_ratio_interval(a, b)
    assert grouped[0] == pooled[0]
    assert grouped[1] < pooled[1] and grouped[2] > pooled[2]
    assert verdict_of(pooled) == "faster" and verdict_of(grouped) == "within noise"   # 5 rounds, not 15 samples
    steady = rounds(204.0, [0] * 5), rounds(200.0, [0] * 5)
    assert verdict_of(grouped_ratio_interval(*steady)) == "faster"   # no shared offsets: a real 2 % still shows
    assert grouped_ratio_interval(a, b, seed=3) == grouped_ratio_interval(a, b, seed=3)   # deterministic
    with pytest.raises(ValueError, match="both sides"):
        grouped_ratio_interval(a, [[]])


def test_a_stop_recorded_as_a_planner_error_by_older_writers_reads_as_planner_finished(tmp_path):
    path = write_session(tmp_path / "t.jsonl")
    old = {"schema_version": 1, "at": "2026-12-04T16:39:47.868+00:00", "type": "planner_error", "id": "p9",
           "planner": "anthropic", "message": "finished: the model finished: done", "retryable": False}
    end = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(end[:-1]) + json.dumps(old).encode() + b"\n" + end[-1])
    stop = load(path).events[-2]
    assert stop.type == "planner_finished" and stop.message == "the model finished: done"
    assert not [e for e in load(path).events if e.type == "planner_error"]


def test_a_timings_samples_group_by_the_load_each_ran_from():
    from pydantic import ValidationError

    from .trace_fixtures import timing

    plain = timing(2048, 200.0)
    xs = plain.samples_us
    t = plain.model_copy(update={"sample_loads": ["a", "a", "b", "a", "c"]})
    assert t.groups() == [[xs[0], xs[1], xs[3]], [xs[2]], [xs[4]]] and plain.groups() == [xs]
    with pytest.raises(ValidationError, match="4 sample_loads for 5 samples"):
        type(t).model_validate(t.model_dump() | {"sample_loads": ["a"] * 4})
