"""Export to a standalone solution.py (the shipped kernels' compile-only checks are in test_compiler.py)."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from megakernel_agent.sandbox.candidate import Candidate
from megakernel_agent.tasks.kimi_linear.export import FORBIDDEN, export_solution

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
assert not [m for m in sys.modules if m.split(".")[0] in ("megakernel_agent", "tasks", "sandbox", "agent", "traces")]
sys.path.insert(0, {str(ROOT)!r})
from megakernel_agent.tasks.kimi_linear.config import SMALL
from megakernel_agent.tasks.kimi_linear.inputs import build_model
from megakernel_agent.tasks.kimi_linear.reference import ReferenceModel
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
