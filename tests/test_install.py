"""A non-editable install: the wheel carries the seed kernels, and the console script works from any folder."""

import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOT_SOURCE = (".git", ".venv", "runs", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", ".ruff_cache",
              "upstream", ".whl")


def run(*cmd, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return out


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh venv holding only the project's wheel; the test interpreter's packages (torch, pydantic, ...)
    reach it through a .pth file, so nothing is downloaded."""
    pytest.importorskip("setuptools", reason="builds the wheel with the installed backend (the dev extra)")
    tmp = tmp_path_factory.mktemp("install")
    src = tmp / "src"   # a copy: building writes build/ and *.egg-info beside the sources
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(*NOT_SOURCE))
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", tmp / "dist", src,
        cwd=tmp)
    (wheel,) = (tmp / "dist").glob("megakernel_agent-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {"megakernel_agent/kernels/kimi_linear/seed.cu", "megakernel_agent/kernels/w4a16_gemv/seed.cu"} <= set(names)
    # one installed top-level name: nothing generic such as `traces` or `agent` that other distributions use
    assert {n.split("/")[0] for n in names} == {"megakernel_agent", wheel.name.split("-py")[0] + ".dist-info"}
    env = tmp / "venv"
    venv.EnvBuilder(with_pip=False).create(env)
    (site,) = (env / "lib").glob("python*/site-packages")
    deps = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    (site / "test-interpreter-packages.pth").write_text("\n".join(deps) + "\n")
    run(sys.executable, "-m", "pip", "--python", env / "bin/python", "install", "--no-deps", "-q", wheel, cwd=tmp)
    return env


def test_every_module_of_the_installed_package_imports(installed, tmp_path):
    """pyproject.toml lists the packages by hand: a subpackage left out would fail here, not on a user's machine."""
    program = ("import importlib, pkgutil, megakernel_agent as m\n"
               "names = [i.name for i in pkgutil.walk_packages(m.__path__, 'megakernel_agent.')]\n"
               "[importlib.import_module(n) for n in names]\n"
               "print(len(names))")
    sources = {p.relative_to(ROOT).with_suffix("") for d in ("agent", "sandbox", "tasks", "traces", "kernels")
               for p in (ROOT / d).rglob("*.py") if p.name != "__init__.py"}
    assert int(run(installed / "bin/python", "-c", program, cwd=tmp_path).stdout) >= len(sources)


def test_the_installed_code_is_the_wheels(installed, tmp_path):
    out = run(installed / "bin/python", "-c", "import megakernel_agent.agent.cli as cli, megakernel_agent.kernels as "
              "k; print(cli.__file__, k.__file__)", cwd=tmp_path)
    assert all(Path(p).is_relative_to(installed) for p in out.stdout.split())


def test_the_console_script_answers_version_and_help_from_another_folder(installed, tmp_path):
    version = run(installed / "bin/megakernel-agent", "--version", cwd=tmp_path).stdout.split()
    (wheel_version,) = {p.name.split("-")[1] for p in (installed.parent / "dist").glob("*.whl")}
    assert version == ["megakernel-agent", wheel_version]
    usage = run(installed / "bin/megakernel-agent", "bench", "--help", cwd=tmp_path).stdout
    assert usage.startswith("usage: megakernel-agent bench") and "(default: kimi_linear)" in usage


def test_export_without_a_kernel_embeds_the_packaged_seed(installed, tmp_path):
    run(installed / "bin/megakernel-agent", "export", "-o", "sol.py", cwd=tmp_path)
    seed = (ROOT / "kernels/kimi_linear/seed.cu").read_text()
    assert f"KERNEL_SOURCE = {seed!r}" in (tmp_path / "sol.py").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sol.py"]
