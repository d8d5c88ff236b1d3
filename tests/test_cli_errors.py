"""Bad input to the CLI: one line on stderr, exit code 2, no traceback, and nothing asked of a GPU."""

import shutil
import signal
from importlib import metadata
from pathlib import Path

import pytest

import megakernel_agent.agent.cli as run_agent
from megakernel_agent.agent import preflight
from megakernel_agent.agent.cli import main
from megakernel_agent.agent.exit_codes import ExitCode, session_exit
from megakernel_agent.agent.interrupts import reason_for
from megakernel_agent.sandbox.candidate import Candidate
from megakernel_agent.sandbox.pool import WorkerStartError
from megakernel_agent.tasks.registry import get_task

ROOT = Path(__file__).resolve().parent.parent
KIMI_SEED = ROOT / "kernels/kimi_linear/seed.cu"
GEMV_SEED = ROOT / "kernels/w4a16_gemv/seed.cu"
TRACE = ROOT / "traces/examples/kimi-tuner-h200/trace.jsonl"
needs_nvrtc = pytest.mark.skipif(not preflight.nvrtc_loads(), reason="needs NVRTC (the cuda extra)")


@pytest.fixture(autouse=True)
def files(tmp_path, monkeypatch):
    """Bad and good inputs in a scratch folder, which is also the working directory."""
    monkeypatch.chdir(tmp_path)
    lines = TRACE.read_text().splitlines(keepends=True)
    (tmp_path / "corrupt.jsonl").write_text("".join(lines[:3]) + '{"type": "proposal", "id": \n' + "".join(lines[3:]))
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "typo.cu").write_text(GEMV_SEED.read_text().replace("float ss = 0.0f;", "float ss = 0.0f"))
    (tmp_path / "garbage.cu").write_text("this is not CUDA\n")
    (tmp_path / "no_contract.cu").write_text(KIMI_SEED.read_text().replace("MK_LAUNCH_CONTRACT(", "NO_CONTRACT("))
    (tmp_path / "commented_contract.cu").write_text(KIMI_SEED.read_text().replace("MK_LAUNCH_CONTRACT(",
                                                                                  "// MK_LAUNCH_CONTRACT("))
    (tmp_path / "held").mkdir()
    (tmp_path / "held" / "trace.jsonl").write_text("")
    return tmp_path


def refused(capsys, *argv: str) -> str:
    """Run the CLI in process; it must refuse with exit 2 and one line. Returns that line."""
    code = main(list(argv))
    out = capsys.readouterr()
    assert code == ExitCode.USAGE, out
    assert len(out.err.strip().splitlines()) == 1 and "Traceback" not in out.err, out.err
    return out.err


@pytest.mark.parametrize("argv, says", [
    (["run", "--kernel", "nope.cu"], "kernel file not found: nope.cu"),
    (["run", "--budget", "garbage"], "argument --budget: cannot read duration 'garbage'"),
    (["run", "--budget", "10x"], "cannot read duration '10x'"),
    (["run", "--budget", "1e9h"], "cannot read duration '1e9h'"),
    (["run", "--budget", "0"], "must be more than zero"),
    (["run", "--out", "held"], "already holds another run"),
    (["run", "--resume", str(TRACE), "--kernel", "typo.cu"], "--resume continues the recorded one"),
    (["run", "--planner", "replay"], "the replay planner needs --replay-trace"),
    (["run", "--timeouts", "check=soon"], "'soon' is not a number of seconds"),
    (["run", "--build-ahead", "-1"], "expected a whole number (0 or more), got '-1'"),
    (["run", "--gpus", "0"], "expected a positive integer or 'all', got '0'"),
    (["run", "--inflight", "0"], "expected a positive integer, got '0'"),
    (["run", "--cluster", "ray://nowhere"], "expected auto, local or ray://HOST:PORT, got 'ray://nowhere'"),
    (["run", "--task", "w4a16_gemv", "--gpu-resource", "fake_gpu"], "--gpu-resource only goes with --cluster"),
    (["bench", "--task", "nope"], "unknown task 'nope'"),
    (["bench", "--size", "huge"], "unknown size 'huge'"),
    (["bench", "--knob", "NOPE=1"], "unknown knob(s) ['NOPE']; declared: ["),
    (["bench", "--knob", "KSPLIT_SHARED"], "a knob setting is NAME=INTEGER"),
    (["bench", "--ctx", "-3"], "expected a positive integer"),
    (["replay", "corrupt.jsonl"], "corrupt.jsonl:4: corrupt event"),
    (["replay", "empty.jsonl"], "empty.jsonl is not a trace"),
    (["replay", str(KIMI_SEED)], "seed.cu:1: corrupt event"),
    (["replay", "missing.jsonl"], "trace not found: missing.jsonl"),
    (["replay", str(TRACE), "--report", "nowhere/r.html"], "folder nowhere does not exist"),
    (["replay", str(TRACE), "--report", "r.txt"], "the name must end in .html or .md"),
    (["replay", str(TRACE), "--kept-only"], "--kept-only only goes with --reexecute"),
    (["replay", str(TRACE), "--resume", "--reexecute"], "--report and --reexecute do not go with it"),
    (["export", "-o", "nowhere/sol.py"], "folder nowhere does not exist"),
    (["export", "garbage.cu"], "garbage.cu does not define the kimi_linear entry"),
    (["export", str(GEMV_SEED)], 'the kimi_linear entry: extern "C" __global__ void kimi_decode_step'),
    (["export", "no_contract.cu"], "no_contract.cu does not declare its launch: MK_LAUNCH_CONTRACT"),
    (["export", "commented_contract.cu"], "commented_contract.cu does not declare its launch"),
    (["export", str(KIMI_SEED), "--knob", "KSPLIT_SHARED=7"], "KSPLIT_SHARED=7 is not one of"),
    (["compare", f"{GEMV_SEED}:NOPE=3", "--task", "w4a16_gemv"], "declared: ['BLOCKS_PER_SM'"),
    (["compare", f"{TRACE}#nope"], "no version with id 'nope'"),
    (["compare", f"{TRACE}#seed", "--task", "w4a16_gemv"], "the trace is of task kimi_linear, not w4a16_gemv"),
    (["compare"], "the following arguments are required: VERSION"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, says):
    assert says in refused(capsys, *argv)


def test_the_default_run_folder_is_under_the_working_directory(capsys, monkeypatch, files):
    monkeypatch.setattr("megakernel_agent.agent.session.now_tag", lambda: "T")
    (files / "runs/T-w4a16_gemv-small").mkdir(parents=True)
    (files / "runs/T-w4a16_gemv-small/trace.jsonl").write_text("")
    line = refused(capsys, "run", "--task", "w4a16_gemv", "--size", "small")
    assert "runs/T-w4a16_gemv-small already holds another run" in line


def test_ctrl_c_outside_a_session_is_one_line_and_exit_130(capsys, monkeypatch):
    def interrupted(_args):
        raise KeyboardInterrupt

    monkeypatch.setattr(run_agent, "cmd_export", interrupted)
    assert main(["export"]) == ExitCode.INTERRUPTED
    assert capsys.readouterr().err == "interrupted\n"


def test_a_worker_that_did_not_start_says_why_and_exits_3(capsys, monkeypatch):
    def no_worker(_args):
        raise WorkerStartError("worker exited during start-up:\nloading weights\nImportError: libcuda.so.1")

    monkeypatch.setattr(run_agent, "cmd_bench", no_worker)
    assert main(["bench"]) == ExitCode.NO_GPU
    err = capsys.readouterr().err
    assert err.startswith("the GPU worker did not start: worker exited") and "ImportError: libcuda.so.1" in err


@needs_nvrtc
@pytest.mark.parametrize("command", [["bench", "typo.cu"], ["run", "--kernel", "typo.cu"], ["compare", "typo.cu"]])
def test_a_kernel_that_does_not_compile_is_refused_with_the_compilers_first_error(capsys, command):
    line = refused(capsys, *command, "--task", "w4a16_gemv", "--size", "small")
    assert 'typo.cu does not compile: candidate.cu(35): error: expected a ";"' in line


def test_without_nvrtc_the_compile_check_is_left_to_the_gpu_worker(monkeypatch, files):
    monkeypatch.setattr(preflight, "nvrtc_loads", lambda: False)
    task = get_task("w4a16_gemv", "small")
    assert preflight.check_kernel(task, Candidate(source=(files / "typo.cu").read_text()), "typo.cu", compile=True)


def test_export_without_a_kernel_writes_the_seed(capsys, files):
    assert main(["export", "-o", "sol.py"]) == ExitCode.OK
    assert f"KERNEL_SOURCE = {KIMI_SEED.read_text()!r}" in (files / "sol.py").read_text()
    assert "wrote sol.py (seed.cu" in capsys.readouterr().out


def test_help_names_the_program_and_shows_defaults(capsys):
    with pytest.raises(SystemExit) as done:
        main(["run", "--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0
    assert out.startswith("usage: megakernel-agent run") and "(default: 30m)" in out and "(default: None)" not in out


def test_version_comes_from_the_package_or_else_from_pyproject(capsys, monkeypatch):
    tomllib = pytest.importorskip("tomllib")
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]

    def not_installed(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(run_agent.metadata, "version", not_installed)
    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out.strip() == f"megakernel-agent {declared}"


@pytest.mark.parametrize("reason, code", [
    (reason_for(signal.SIGINT), ExitCode.INTERRUPTED), (reason_for(signal.SIGTERM), ExitCode.TERMINATED),
    ("budget", ExitCode.OK), ("planner finished: nothing left", ExitCode.OK),
    ("stopped: [Errno 28] No space left on device", ExitCode.FAILED),
    ("planner failed 5 time(s): 500", ExitCode.FAILED),
])
def test_a_session_exits_by_how_it_ended(reason, code):
    assert session_exit(reason) == code


def test_exit_codes_are_distinct():
    assert len({int(c) for c in ExitCode}) == len(ExitCode) and ExitCode.USAGE == 2 and ExitCode.NO_GPU == 3


def test_a_run_folder_that_never_started_is_removed_but_not_a_neighbour(files):
    from megakernel_agent.agent.run_folder import missing_folders, remove_folders

    made = missing_folders(Path("runs") / "t-kimi_linear-full")
    assert made == [files / "runs/t-kimi_linear-full", files / "runs"]
    (made[0] / "sandbox").mkdir(parents=True)
    (made[0] / "sandbox" / "worker-1.log").write_text("no GPU")
    (files / "runs" / "another-run").mkdir()
    remove_folders(made)
    assert [p.name for p in (files / "runs").iterdir()] == ["another-run"]


def test_a_worker_that_did_not_start_in_time_leaves_the_log_its_message_names(capsys, monkeypatch):
    from megakernel_agent.sandbox.pool import Evaluator

    def slow_start(self, startup_timeout=None):
        (self.work_dir / "worker-1.log").write_text("loading weights\n")
        raise WorkerStartError(f"worker did not start within 1 s (log: {self.work_dir / 'worker-1.log'})")

    monkeypatch.setattr(Evaluator, "start", slow_start)
    assert main(["bench", "--task", "w4a16_gemv", "--size", "small"]) == ExitCode.NO_GPU
    err = capsys.readouterr().err
    kept = Path(err.split("(the worker's logs are kept in ")[1].split(")")[0])
    assert (kept / "worker-1.log").read_text() == "loading weights\n" and str(kept) in err.splitlines()[0]
    shutil.rmtree(kept)
