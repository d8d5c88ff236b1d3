"""The confined compiler (NVRTC in its own process, no GPU needed): builds, logs, limits, confinement."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from megakernel_agent.sandbox.build import GLOBALS_LIMIT, build_defines, compile_only
from megakernel_agent.sandbox.candidate import Candidate, CandidateError
from megakernel_agent.sandbox.compiler import (
    CompileLimits,
    child_environment,
    compile_cuda,
    first_error,
    nvrtc_options,
    strip_log,
)
from megakernel_agent.tasks.registry import get_task

ROOT = Path(__file__).resolve().parent.parent
GEMV = get_task("w4a16_gemv", "small")


def options(task=GEMV, knobs=None):
    knobs = knobs if knobs is not None else Candidate(source=task.seed_source()).resolved_knobs()
    return nvrtc_options("sm_90", build_defines(task, knobs))


@pytest.mark.parametrize("task,size", [("kimi_linear", "full"), ("kimi_linear", "small"), ("w4a16_gemv", "full")])
def test_shipped_kernels_compile_with_build_facts(task, size):
    t = get_task(task, size)
    res = compile_only(t, Candidate(source=t.seed_source()))
    assert res.ok, res.log[-3000:]
    assert 0 < res.resources.registers <= 255 and res.spill_bytes >= 0
    assert res.compiler.startswith("NVRTC ")


def test_device_globals_past_the_limit_fail_the_build_since_every_load_allocates_them():
    source = GEMV.seed_source() + f'\n__device__ char ballast[{GLOBALS_LIMIT + 1}];\n'
    res = compile_only(GEMV, Candidate(source=source))
    assert not res.ok and "device globals take" in res.error and "every load" in res.error
    small = compile_only(GEMV, Candidate(source=GEMV.seed_source() + "\n__device__ char ballast[4096];\n"))
    assert small.ok, small.error
    said = compile_only(GEMV, Candidate(source=GEMV.seed_source() + '\n#warning "keeps 99999999 bytes gmem free"\n'))
    assert said.ok, said.error   # only ptxas' own line counts, never the candidate's text in the log


def test_errors_name_the_candidates_own_lines():
    source = GEMV.seed_source().replace("float ss = 0.0f;", "float ss = 0.0f")
    line = source.splitlines().index(next(x for x in source.splitlines() if "float ss = 0.0f" in x)) + 1
    res = compile_only(GEMV, Candidate(source=source))
    assert not res.ok and res.error.startswith(f"candidate.cu({line + 1}): error")
    assert "task_prelude.cu" not in res.error and "/" not in res.log.split("error detected")[0].split(":")[0]


def test_source_rules_and_reserved_knob_names_apply_before_compiling():
    refused = compile_only(GEMV, Candidate(source='#include "/etc/passwd"\n' + GEMV.seed_source()))
    assert not refused.ok and "line 1: only #include <header>" in refused.error and not refused.log
    with pytest.raises(CandidateError, match=r"reserved.*HIDDEN"):
        build_defines(GEMV, {"HIDDEN": 8})
    shadow = "// @knob HIDDEN 8 {8}\n" + GEMV.seed_source()
    res = compile_only(GEMV, Candidate(source=shadow))
    assert not res.ok and "reserved" in res.error


def test_a_host_file_never_reaches_the_log_even_past_the_rules():
    """The rules would refuse this include; called directly, the compiler itself must not leak the file."""
    secret = Path("/etc/passwd").read_text().splitlines()[0].split(":")[0]
    out = compile_cuda(GEMV.prelude(), '#include "/etc/passwd"\n', options())
    assert not out.ok
    assert secret not in out.log and secret not in out.error
    if out.confinement.startswith("Landlock"):
        assert "cannot open source file" in out.log and "Permission denied" not in out.log


def test_the_log_does_not_tell_which_host_paths_exist():
    """Past the rules (called directly), a missing and an existing but unreadable path read the same."""
    def log(path):
        out = compile_cuda(GEMV.prelude(), f'#include "{path}"\n', options())
        return [line.replace(path.rsplit("/", 1)[1], "NAME") for line in out.log.splitlines()
                if line.startswith("candidate.cu")]

    assert log("/etc/hostname") == log("/etc/no-such-file-here")


def test_the_compiler_refuses_to_run_unconfined(monkeypatch):
    monkeypatch.delenv("MK_ALLOW_UNCONFINED_COMPILER", raising=False)
    out = compile_cuda(GEMV.prelude(), "int x;\n", options(), include_dirs=("/no/such/header/folder",))
    assert not out.ok and "could not be confined" in out.error and out.confinement.startswith("unconfined")
    monkeypatch.setenv("MK_ALLOW_UNCONFINED_COMPILER", "1")
    allowed = compile_cuda(GEMV.prelude(), "int x;\n", options(), include_dirs=("/no/such/header/folder",))
    assert "could not be confined" not in allowed.error


def test_the_compiler_sees_an_allow_listed_environment(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-secret-value-123")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-api03-secret")
    env = child_environment()
    assert set(env) <= {"PATH", "LANG", "HOME", "PYTHONDONTWRITEBYTECODE", "PYTHONPATH", "LD_LIBRARY_PATH",
                        "CUDA_PATH", "CUDA_HOME", "CUPY_CACHE_DIR"}
    assert "aws-secret-value-123" not in str(env) and "sk-ant" not in str(env)


def test_a_macro_bomb_is_stopped_by_the_limits():
    bomb = "\n".join(["#define A0 x"] + [f"#define A{i} A{i - 1} A{i - 1}" for i in range(1, 40)] + ["int v = A39;"])
    t0 = time.monotonic()
    out = compile_cuda(GEMV.prelude(), bomb, options(), CompileLimits(memory_mb=1024, seconds=8))
    assert not out.ok and ("limit" in out.error or "memory cap" in out.error or "CPU time" in out.error), out.error
    assert time.monotonic() - t0 < 20


def test_log_keeps_the_candidate_and_drops_what_came_from_elsewhere():
    inc = "/opt/cuda/include"
    log = "\n".join([
        "candidate.cu(12): error: identifier \"nope\" is undefined",
        "    return nope;",
        "           ^",
        f"{inc}/cuda_bf16.hpp(300): error: no suitable conversion",
        "    secret header excerpt line",
        "/etc/shadow(1): error: identifier \"root\" is undefined",
        "  root:$6$hash",
        "2 errors detected in the compilation of \"task_prelude.cu\".",
    ])
    text = strip_log(log, (inc,))
    assert "return nope;" in text and "cuda_bf16.hpp(300): error: no suitable conversion" in text
    assert "secret header excerpt" not in text and "root" not in text and "/opt/cuda" not in text
    assert "1 diagnostic(s) located outside" in text and "2 errors detected" in text


LANDLOCK_PROBE = """
import sys
sys.path.insert(0, {root!r})
from megakernel_agent.sandbox.confinement import restrict_filesystem
what = restrict_filesystem([{allowed!r}])
print(what)
if not what.startswith("Landlock"):
    sys.exit(0)
open({allowed!r} + "/ok.txt").read()
for action in (lambda: open("/etc/passwd").read(), lambda: open({allowed!r} + "/new.txt", "w")):
    try:
        action()
        print("LEAK")
    except PermissionError:
        print("denied")
"""


def test_landlock_allows_reading_the_listed_folders_only(tmp_path):
    (tmp_path / "ok.txt").write_text("fine")
    out = subprocess.run([sys.executable, "-c", LANDLOCK_PROBE.format(root=str(ROOT), allowed=str(tmp_path))],
                         capture_output=True, text=True, timeout=60, env={"PATH": os.environ["PATH"]})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split()
    if not out.stdout.startswith("Landlock"):
        pytest.skip(f"this kernel has no Landlock: {out.stdout.strip()}")
    assert lines[-2:] == ["denied", "denied"]


def test_the_first_error_is_an_error_line_not_a_warning_that_names_one():
    log = ('candidate.cu(4): warning #177-D: variable "error_count" was declared but never referenced\n'
           'candidate.cu(9): error: expected a ";"\n')
    assert first_error(log) == 'candidate.cu(9): error: expected a ";"'
    assert first_error("ptxas fatal   : Unresolved extern function 'f'\n").startswith("ptxas fatal")
    assert first_error('candidate.cu(2): warning: "error" in a message\n') == ""
