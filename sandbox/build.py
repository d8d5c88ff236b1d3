"""Compile a candidate for a task: CuPy/NVRTC in a GPU worker, or `nvcc -cubin` where there is no GPU."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from tasks.base import Task
from traces.results import BuildResult, Resources

from .candidate import Candidate, CandidateError, validate


def compile_options(task: Task, knobs: dict[str, int], arch: str) -> tuple[str, ...]:
    defines = {**task.defines(), **{k: str(v) for k, v in knobs.items()}}
    return ("-std=c++17", f"-arch={arch}", *(f"-D{k}={v}" for k, v in sorted(defines.items())))


def build_on_device(task: Task, cand: Candidate, arch: str, key: str, cache: dict):
    """(BuildResult, CompiledKernel | None). Never raises for a bad candidate: the failure is the result."""
    from tasks.cuda_runtime import compile_kernel

    t0 = time.perf_counter()
    try:
        knobs = validate(cand)
    except CandidateError as e:
        return BuildResult(ok=False, key=key, error=str(e), seconds=time.perf_counter() - t0), None
    if key in cache:
        kernel = cache[key]
        return _result(kernel, key, knobs, time.perf_counter() - t0, cached=True, log=""), kernel
    try:
        kernel = compile_kernel(task.prelude() + cand.source, task.spec.entry, compile_options(task, knobs, arch))
        res = _result(kernel, key, knobs, time.perf_counter() - t0, cached=False, log="")
    except Exception as e:  # noqa: BLE001 - compile errors, missing contract symbols, load failures
        log = e.get_message() if hasattr(e, "get_message") else f"{type(e).__name__}: {e}"
        return BuildResult(ok=False, key=key, knobs=knobs, error=_first_error(log), log=log[-20000:],
                           seconds=time.perf_counter() - t0), None
    cache[key] = kernel
    return res, kernel


def _result(kernel, key: str, knobs: dict, seconds: float, cached: bool, log: str) -> BuildResult:
    from tasks.cuda_runtime import driver

    c = kernel.contract
    fit = driver().occupancy(kernel.handle, c.threads, c.dynamic_smem) if c.threads <= kernel.max_threads else 0
    return BuildResult(
        ok=True, key=key, knobs=knobs, log=log, seconds=seconds, cached=cached,
        resources=Resources(
            registers=kernel.registers, local_bytes=kernel.local_bytes, static_smem=kernel.static_smem,
            dynamic_smem=c.dynamic_smem, max_threads=kernel.max_threads, threads=c.threads,
            blocks_per_sm=c.blocks_per_sm, blocks_fit_per_sm=fit, grid=driver().sm_count() * c.blocks_per_sm,
        ),
    )


def _first_error(log: str) -> str:
    for line in log.splitlines():
        if "error" in line.lower():
            return line.strip()[:400]
    return log.strip().splitlines()[-1][:400] if log.strip() else "compile failed"


PTXAS_RE = {
    "registers": re.compile(r"Used (\d+) registers"),
    "stack": re.compile(r"(\d+) bytes stack frame"),
    "spill_stores": re.compile(r"(\d+) bytes spill stores"),
    "spill_loads": re.compile(r"(\d+) bytes spill loads"),
    "smem": re.compile(r"(\d+) bytes smem"),
}


def compile_only(task: Task, cand: Candidate, arch: str = "sm_90a", nvcc: str | None = None) -> BuildResult:
    """`nvcc -cubin -Xptxas -v` without a GPU: syntax, registers, spills. Knob and include rules apply."""
    nvcc = nvcc or shutil.which("nvcc")
    key = cand.key(f"nvcc:{arch}")
    t0 = time.perf_counter()
    try:
        knobs = validate(cand)
    except CandidateError as e:
        return BuildResult(ok=False, key=key, error=str(e))
    if not nvcc:
        return BuildResult(ok=False, key=key, knobs=knobs, error="nvcc not found")
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "candidate.cu"
        src.write_text(task.prelude() + cand.source)
        cmd = [nvcc, "-cubin", "-Xptxas", "-v", "-o", str(Path(tmp) / "candidate.cubin"),
               *compile_options(task, knobs, arch), str(src)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    log = proc.stdout + proc.stderr
    if proc.returncode != 0:
        return BuildResult(ok=False, key=key, knobs=knobs, log=log[-20000:], error=_first_error(log),
                           seconds=time.perf_counter() - t0)
    nums = {k: int(m.group(1)) if (m := r.search(log)) else 0 for k, r in PTXAS_RE.items()}
    res = BuildResult(ok=True, key=key, knobs=knobs, log=log[-20000:], seconds=time.perf_counter() - t0)
    res.resources = Resources(
        registers=nums["registers"], local_bytes=nums["stack"] + nums["spill_stores"], static_smem=nums["smem"],
        dynamic_smem=0, max_threads=0, threads=0, blocks_per_sm=0, blocks_fit_per_sm=0, grid=0,
    )
    return res
