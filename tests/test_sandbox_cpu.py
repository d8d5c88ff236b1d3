"""Sandbox behaviour that needs no GPU: knobs, includes, keys, result schemas, the timeout/kill path."""

import json
import os
import time

import pytest
import torch

from megakernel_agent.sandbox.build import Placements
from megakernel_agent.sandbox.candidate import Candidate, CandidateError, parse_knobs, resolve_knobs
from megakernel_agent.sandbox.pool import Evaluator
from megakernel_agent.sandbox.protocol import PhaseTimeouts
from megakernel_agent.traces.results import EvalResult, FailureClass

SRC = """// @knob THREADS 256 {128,256,512}
// @knob SPLIT 2 {1,2,4}
#include <cuda_bf16.h>
#include <cooperative_groups.h>
"""


def test_knobs_parse_resolve_and_reject():
    knobs = parse_knobs(SRC)
    assert [(k.name, k.default, k.values) for k in knobs] == [
        ("THREADS", 256, (128, 256, 512)),
        ("SPLIT", 2, (1, 2, 4)),
    ]
    assert resolve_knobs(knobs, {"SPLIT": 4}) == {"THREADS": 256, "SPLIT": 4}
    with pytest.raises(CandidateError, match="not one of"):
        resolve_knobs(knobs, {"SPLIT": 3})
    with pytest.raises(CandidateError, match="unknown knob"):
        resolve_knobs(knobs, {"NOPE": 1})
    with pytest.raises(CandidateError, match="default 5"):
        parse_knobs("// @knob A 5 {1,2}\n")
    with pytest.raises(CandidateError, match="declared twice"):
        parse_knobs("// @knob A 1 {1,2}\n// @knob A 2 {1,2}\n")
    with pytest.raises(CandidateError, match="malformed"):
        parse_knobs("// @knob A one {1,2}\n")


def test_build_key_depends_on_source_knobs_and_options():
    a = Candidate(source=SRC)
    assert a.key("x") == Candidate(source=SRC, knobs={"THREADS": 256}).key("x")  # defaults are explicit
    assert a.key("x") != Candidate(source=SRC, knobs={"THREADS": 512}).key("x")
    assert a.key("x") != a.key("y")
    assert a.key("x") != Candidate(source=SRC + "\n").key("x")


def test_a_builds_evaluations_take_its_placements_in_turn_loading_each_once():
    loads = []

    def load():
        loads.append(f"load {len(loads) + 1}")
        return loads[-1]

    placements = Placements(load, "first", count=3)
    got = [placements.next() for _ in range(7)]
    assert got == ["first", "load 1", "load 2", "first", "load 1", "load 2", "first"]
    assert loads == ["load 1", "load 2"]   # loaded when first needed, then kept


class OutOfMemory(RuntimeError):
    pass


def scripted_loads(*outcomes):
    """A load function that returns or raises `outcomes` in turn, and the list of its calls."""
    calls, it = [], iter(outcomes)

    def load():
        calls.append(len(calls) + 1)
        got = next(it)
        if isinstance(got, Exception):
            raise got
        return got

    return load, calls


@pytest.mark.parametrize("fails_at, held", [(2, ["first"]), (3, ["first", "load 1"])])
def test_a_later_load_out_of_memory_ends_the_turns_at_the_loads_held(fails_at, held):
    load, calls = scripted_loads(*["load 1"][:fails_at - 2], OutOfMemory("out of memory"))
    placements = Placements(load, "first", count=4, transient=OutOfMemory)
    got = [placements.next() for _ in range(6)]
    assert got == [held[i % len(held)] for i in range(6)]   # the evaluation asking still runs, from a held load
    assert len(calls) == fails_at - 1                        # and no load is tried again
    assert f"load {fails_at} of the build failed (out of memory)" in placements.lost
    assert placements.last == 5 % len(held)


def test_any_other_load_failure_reaches_the_evaluation_and_keeps_the_turn():
    load, calls = scripted_loads(RuntimeError("CUDA_ERROR_INVALID_IMAGE"), "load 1")
    placements = Placements(load, "first", count=2, transient=OutOfMemory)
    assert placements.next() == "first"
    with pytest.raises(RuntimeError, match="INVALID_IMAGE"):
        placements.next()
    assert [placements.next() for _ in range(3)] == ["load 1", "first", "load 1"] and calls == [1, 2]


def test_eval_result_round_trips_through_json():
    res = EvalResult(task="t", size="s", key="k", knobs={"A": 1})
    assert EvalResult.model_validate_json(res.model_dump_json()) == res
    assert res.ok


@pytest.fixture
def fake_pool(tmp_path):
    pool = Evaluator(
        "fake",
        work_dir=tmp_path,
        worker_module="tests.fake_worker",
        timeouts=PhaseTimeouts(startup=30, build=10, check=2, time=10),
        extra_env={"FAKE_WORKER_PIDFILE": str(tmp_path / "child.pid")},
    )
    yield pool
    pool.close()


def test_hang_is_killed_with_its_process_group_and_the_next_candidate_runs(fake_pool, tmp_path):
    t0 = time.monotonic()
    res = fake_pool.evaluate(Candidate(source="HANG_CHECK"))
    assert res.failure.cls == FailureClass.timeout and res.failure.phase == "check"
    assert time.monotonic() - t0 < 30
    child = int((tmp_path / "child.pid").read_text().split()[1])
    for _ in range(50):
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("grandchild of the hung worker survived the kill")
    assert fake_pool.evaluate(Candidate(source="fine")).ok


def test_dead_worker_is_a_crash_and_is_replaced(fake_pool):
    res = fake_pool.evaluate(Candidate(source="DIE"))
    assert res.failure.cls == FailureClass.crash and res.failure.phase == "build"
    assert fake_pool.evaluate(Candidate(source="fine")).ok


def test_no_gpu_is_an_infra_failure(tmp_path):
    with Evaluator("fake", work_dir=tmp_path, worker_module="tests.fake_worker",
                   extra_env={"FAKE_WORKER_NO_GPU": "1"}) as pool:
        res = pool.evaluate(Candidate(source="fine"))
    assert res.failure.cls == FailureClass.infra and "no CUDA GPU" in res.failure.message


def test_knob_docs_and_baking_chosen_values_into_the_source():
    from megakernel_agent.sandbox.candidate import with_knob_defaults

    src = "// @knob A   1 {1,2} more parallel units\n// @knob B 4 {4,8}\nint x;\n"
    assert parse_knobs(src)[0].doc == "more parallel units"
    baked = with_knob_defaults(src, {"A": 2})
    assert [(k.name, k.default) for k in parse_knobs(baked)] == [("A", 2), ("B", 4)]
    assert baked.endswith("int x;\n")
    with pytest.raises(CandidateError):
        with_knob_defaults(src, {"A": 3})


def test_worker_environment_is_an_allow_list_without_secrets(monkeypatch):
    from megakernel_agent.sandbox.environment import worker_environment

    for name, value in {"PATH": "/usr/bin", "LC_ALL": "C", "CUDA_HOME": "/cuda", "CUDA_TOKEN": "t" * 20,
                        "AWS_SECRET_ACCESS_KEY": "a" * 40, "GH_PAT": "g" * 30, "ANTHROPIC_API_KEY": "k" * 30,
                        "SOME_SERVICE_URL": "https://x", "TORCH_HOME": "/t",
                        "MK_ALLOW_UNCONFINED_COMPILER": "1"}.items():
        monkeypatch.setenv(name, value)
    env = worker_environment({"FAKE_WORKER_X": "1"})
    assert {"PATH", "LC_ALL", "CUDA_HOME", "TORCH_HOME", "FAKE_WORKER_X", "MK_ALLOW_UNCONFINED_COMPILER"} <= env.keys()
    assert not {"CUDA_TOKEN", "AWS_SECRET_ACCESS_KEY", "GH_PAT", "ANTHROPIC_API_KEY", "SOME_SERVICE_URL"} & env.keys()
    with pytest.raises(ValueError, match="MY_TOKEN"):
        worker_environment({"MY_TOKEN": "x"})


def test_a_worker_inherits_no_secret(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "a" * 40)
    monkeypatch.setenv("GH_PAT", "g" * 30)
    out = tmp_path / "env.json"
    with Evaluator("fake", work_dir=tmp_path, worker_module="tests.fake_worker",
                   extra_env={"FAKE_WORKER_ENV_OUT": str(out)}) as pool:
        assert pool.evaluate(Candidate(source="ENV_DUMP")).ok
    env = json.loads(out.read_text())
    assert "AWS_SECRET_ACCESS_KEY" not in env and "GH_PAT" not in env and env["PYTHONUNBUFFERED"] == "1"


def test_knob_lines_are_matched_within_their_line_and_sources_are_capped():
    from megakernel_agent.sandbox.candidate import KNOB_LOOSE_RE, KNOB_RE, MAX_SOURCE_CHARS

    text = "\n\n\n// @knob A 1 {1,2}\n"
    # a match that began on an earlier blank line (\s* over newlines) made parsing quadratic in blank lines
    assert KNOB_RE.search(text).start() == 3 and KNOB_LOOSE_RE.search(text).start() == 3
    assert [k.name for k in parse_knobs("\n" * 1000 + text)] == ["A"]
    with pytest.raises(CandidateError, match="at most"):
        parse_knobs("x" * (MAX_SOURCE_CHARS + 1))


def test_the_weight_guard_sees_one_flipped_bit_in_any_weight():
    from megakernel_agent.sandbox.integrity import WeightGuard

    model = torch.nn.Module()
    model.w = torch.nn.Parameter(torch.randn(64, 33, dtype=torch.bfloat16), requires_grad=False)
    model.register_buffer("packed", torch.randint(0, 255, (1001,), dtype=torch.uint8))   # not a whole word
    guard = WeightGuard(model)
    assert guard.changed(reference=model) == []
    with torch.no_grad():
        model.w.view(torch.int16)[17, 5] ^= 1
    assert guard.changed(reference=model, other=model) == ["reference: w", "other: w"]
    with torch.no_grad():
        model.w.view(torch.int16)[17, 5] ^= 1
        model.packed[1000] ^= 128
    assert guard.changed(reference=model) == ["reference: packed"]


def test_each_weight_check_uses_a_key_of_its_own_until_the_keys_run_out():
    from megakernel_agent.sandbox.integrity import GuardExhausted, WeightGuard

    model = torch.nn.Module()
    model.register_buffer("w", torch.arange(12, dtype=torch.bfloat16)[1:9])   # bytes 2 past a 4-byte boundary
    guard = WeightGuard(model, checks=2)
    assert len({guard._pristine["w"][0], guard._pristine["w"][1]}) == 2   # two keys, two fingerprints
    assert guard.changed(reference=model) == [] and guard.remaining == 1
    model.w[3] += 1
    assert guard.changed(reference=model) == ["reference: w"] and guard.remaining == 0
    with pytest.raises(GuardExhausted):
        guard.changed(reference=model)


def test_a_load_out_of_memory_is_our_side_and_any_other_cuda_error_the_candidates_crash():
    from megakernel_agent.sandbox.worker import unexpected_failure
    from megakernel_agent.tasks.cuda_runtime import CudaError, CudaOutOfMemory

    oom = CudaOutOfMemory("cuModuleLoadData failed: CUDA_ERROR_OUT_OF_MEMORY (2)")
    assert unexpected_failure(oom, "build", True) == {"cls": FailureClass.infra, "phase": "build", "retryable": True}
    assert unexpected_failure(oom, "time", True)["cls"] == FailureClass.crash        # its own allocation at run time
    assert unexpected_failure(oom, "build", False)["cls"] == FailureClass.crash      # the context is broken
    illegal = CudaError("cuLaunchKernelEx failed: CUDA_ERROR_ILLEGAL_ADDRESS (700)")
    assert unexpected_failure(illegal, "check", True) == {"cls": FailureClass.crash, "phase": "check",
                                                          "retryable": False}
    assert unexpected_failure(KeyError("x"), "check", True)["cls"] == FailureClass.infra
