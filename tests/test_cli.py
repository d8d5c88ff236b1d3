"""The CLI end to end in its own process where no GPU is needed: replay of every shipped trace, export, and
what a GPU command says and leaves behind without a GPU."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "traces/examples").glob("*/trace.jsonl"))


def cli(*args, cwd):
    return subprocess.run([sys.executable, str(ROOT / "run_agent.py"), *args], capture_output=True, text=True,
                          timeout=300, cwd=cwd)


@pytest.mark.parametrize("trace", EXAMPLES, ids=[p.parent.name for p in EXAMPLES])
def test_every_shipped_trace_replays_and_reports(trace, tmp_path):
    out = cli("replay", str(trace), "--report", str(tmp_path / "r.html"), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "timeline" in out.stdout and "ended (" in out.stdout and "best =" in out.stdout
    images = (tmp_path / "r.html").read_text().count("data:image/png;base64,")
    timelines = '"phases":[{' in trace.read_text()
    assert images == 3 + timelines   # progress, speedup, roofline; the phase waterfall where timelines exist


def test_examples_exist():
    assert EXAMPLES, "traces/examples/ should hold at least one recorded session"


def test_export_writes_a_solution(tmp_path):
    out = cli(
        "export",
        str(ROOT / "kernels/kimi_linear/seed.cu"),
        "-o",
        str(tmp_path / "solution.py"),
        "--knob",
        "KSPLIT_SHARED=6",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    text = (tmp_path / "solution.py").read_text()
    assert "class Model(MegakernelModel)" in text and "'KSPLIT_SHARED': '6'" in text


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks what is said and left without a GPU")
@pytest.mark.parametrize("command", [["bench"], ["run", "--budget", "1m"]])
def test_without_a_gpu_a_command_says_so_in_one_sentence_and_leaves_nothing(command, tmp_path):
    out = cli(*command, "--task", "w4a16_gemv", "--size", "small", cwd=tmp_path)
    assert out.returncode == 3
    assert out.stderr.strip() == "No NVIDIA GPU with a working CUDA driver is visible here; this command needs one."
    assert not list(tmp_path.iterdir())
