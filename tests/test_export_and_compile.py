"""Export to a standalone solution.py, and the compile-only check of the shipped kernels (nvcc, no GPU)."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox.build import compile_only
from sandbox.candidate import Candidate
from tasks.kimi_linear.export import FORBIDDEN, export_solution
from tasks.registry import get_task

ROOT = Path(__file__).resolve().parent.parent
SEED = (ROOT / "kernels/kimi_linear/seed.cu").read_text()


def test_export_is_standalone_and_loads_weights_strictly(tmp_path):
    text = export_solution(SEED, Candidate(source=SEED).resolved_knobs(), "seed")
    assert not [f for f in FORBIDDEN if f in text]
    imported = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "relative import left in the exported file"
            imported.add(node.module.split(".")[0])
    assert imported <= {"__future__", "ctypes", "dataclasses", "functools", "torch", "cupy", "numpy"}
    (tmp_path / "solution.py").write_text(text)
    probe = f"""
import sys, torch
sys.path.insert(0, {str(tmp_path)!r})
import solution
assert not [m for m in sys.modules if m.split(".")[0] in ("tasks", "sandbox", "agent", "traces")]
sys.path.insert(0, {str(ROOT)!r})
from tasks.kimi_linear.config import SMALL
from tasks.kimi_linear.inputs import build_model
from tasks.kimi_linear.reference import ReferenceModel
ref = build_model(ReferenceModel, SMALL, seed=1, device="cpu")
m = solution.Model(SMALL)
m.load_state_dict(ref.state_dict(), strict=True)
print("ok", type(m).__mro__[1].__name__)
"""
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                         env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok MegakernelModel"


def test_export_refuses_forbidden_text():
    with pytest.raises(ValueError, match="forbidden"):
        export_solution(SEED + "\n// torch.compile\n", Candidate(source=SEED).resolved_knobs(), "bad")


@pytest.mark.skipif(subprocess.run(["which", "nvcc"], capture_output=True).returncode != 0, reason="needs nvcc")
@pytest.mark.parametrize("task,size", [("kimi_linear", "full"), ("kimi_linear", "small"), ("w4a16_gemv", "full")])
def test_shipped_kernels_compile_for_sm90a(task, size):
    t = get_task(task, size)
    res = compile_only(t, Candidate(source=t.seed_source()))
    assert res.ok, res.log[-3000:]
    assert 0 < res.resources.registers <= 255


@pytest.mark.skipif(subprocess.run(["which", "nvcc"], capture_output=True).returncode != 0, reason="needs nvcc")
def test_compile_only_reports_errors_and_refusals():
    t = get_task("w4a16_gemv", "small")
    broken = compile_only(t, Candidate(source=t.seed_source().replace("float ss = 0.0f;", "float ss = 0.0f")))
    assert not broken.ok and "error" in broken.error
    refused = compile_only(t, Candidate(source="#include <stdio.h>\n" + t.seed_source()))
    assert not refused.ok and "allow-list" in refused.error
