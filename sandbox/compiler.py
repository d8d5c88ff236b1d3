"""Compile CUDA source to a cubin in a separate, confined process (NVRTC), and clean its log.

The compiler reads hostile text, so it runs in its own process: an allow-listed environment, capped
address space and CPU time, a wall-clock timeout, no files written, and (where the kernel has
Landlock) read access only to the CUDA header folders. Its log reaches traces and planners only for
diagnostics located in the candidate, the task's prelude or a CUDA header, with header excerpts and
host paths removed. No GPU is needed: this runs wherever NVRTC does.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

from pydantic import BaseModel

from megakernel_agent import IMPORT_ROOT

CANDIDATE_FILE = "candidate.cu"
PRELUDE_FILE = "task_prelude.cu"
DIAGNOSTIC = re.compile(r"^(?P<file>[^\s(][^(]*)\((?P<line>\d+)\): (?P<rest>.*)$")
ABSOLUTE_PATH = re.compile(r"(?<![\w.])/(?:[\w.+-]+/)+([\w.+-]+)")
CANNOT_OPEN = re.compile(r'(cannot open source file "[^"]*").*$')   # the OS's reason would tell what exists
PASSED_ENV = ("LD_LIBRARY_PATH", "CUDA_PATH", "CUDA_HOME", "CUPY_CACHE_DIR")
CompilerHook = Callable[[subprocess.Popen, bool], None]


class CompileLimits(BaseModel):
    """What one compilation may use before it is killed."""

    memory_mb: int = 4096
    seconds: float = 150.0


class CompileOutput(BaseModel):
    ok: bool
    cubin_b64: str = ""
    log: str = ""
    error: str = ""
    seconds: float = 0.0
    confinement: str = ""
    compiler: str = ""

    @property
    def cubin(self) -> bytes:
        return base64.b64decode(self.cubin_b64)


@functools.cache
def cuda_include_dirs() -> tuple[str, ...]:
    """The folders CuPy itself hands NVRTC (its own headers and bundled CCCL) and the CUDA runtime headers
    (pip's nvidia packages or the toolkit, as cuda-pathfinder finds them)."""
    import cupy
    from cuda.pathfinder import find_nvidia_header_directory
    from cupy._core import core

    dirs = [core._get_header_dir_path(), *(o[2:] for o in core._get_cccl_include_options())]
    toolkit = cupy.cuda.get_cuda_path()
    dirs.append(find_nvidia_header_directory("cudart") or os.path.join(toolkit or "/nonexistent", "include"))
    return tuple(d for d in dirs if os.path.isdir(d))


def nvrtc_options(arch: str, defines: dict[str, str]) -> list[str]:
    """The options CuPy's RawModule would use, so the binary is the one export's solution.py builds."""
    return ["-std=c++17", f"-arch={arch}", *(f"-D{k}={v}" for k, v in sorted(defines.items())), "-ftz=true",
            "--device-as-default-execution-space"]


def program_text(prelude: str, candidate: str) -> str:
    """The prelude, then the candidate with its own file name and line numbers in every diagnostic."""
    return f'{prelude}\n#line 1 "{CANDIDATE_FILE}"\n{candidate}'


@functools.cache
def _scratch_home() -> str:
    """An empty home for the compiler process (libraries may create caches in it before it is confined)."""
    return tempfile.mkdtemp(prefix="mk-compiler-home-")


def child_environment() -> dict[str, str]:
    """Nothing from the caller's environment but what finding NVRTC and our module needs."""
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": _scratch_home(), "PYTHONDONTWRITEBYTECODE": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(IMPORT_ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    env.update({k: os.environ[k] for k in PASSED_ENV if k in os.environ})
    return env


def compile_cuda(prelude: str, candidate: str, options: list[str], limits: CompileLimits | None = None,
                 include_dirs: tuple[str, ...] | None = None, track: CompilerHook | None = None) -> CompileOutput:
    """Compile in a confined child process. A compile error, a limit hit or a dead compiler is a result.
    `track(process, done)` hears when the compiler process starts and ends (a caller that may have to stop it)."""
    limits = limits or CompileLimits()
    dirs = cuda_include_dirs() if include_dirs is None else include_dirs
    request = {"source": program_text(prelude, candidate), "name": PRELUDE_FILE, "options": options,
               "include_dirs": list(dirs), "memory_bytes": limits.memory_mb << 20,
               "cpu_seconds": max(1, int(limits.seconds)),
               "allow_unconfined": os.environ.get("MK_ALLOW_UNCONFINED_COMPILER") == "1"}
    t0 = time.perf_counter()
    # in the caller's process group (a worker's group dies with its session); the child ties its life to the
    # caller's (no preexec_fn: the caller may be threaded, e.g. building ahead)
    proc = subprocess.Popen([sys.executable, "-m", "megakernel_agent.sandbox.compile_child", str(os.getpid())],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=child_environment(), cwd="/")
    if track is not None:
        track(proc, False)
    try:
        out, err = proc.communicate(json.dumps(request).encode(), timeout=limits.seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return CompileOutput(ok=False, error=f"the compiler exceeded its {limits.seconds:.0f} s limit and was killed",
                             seconds=time.perf_counter() - t0)
    finally:
        if track is not None:
            track(proc, True)
    seconds = time.perf_counter() - t0
    try:
        answer = json.loads(out)
    except ValueError:
        return CompileOutput(ok=False, error=_death(proc.returncode, err.decode(errors="replace"), limits),
                             seconds=seconds)
    log = strip_log(answer.get("log", ""), dirs)
    return CompileOutput(ok=answer["ok"], cubin_b64=answer.get("cubin", ""), log=log,
                         error="" if answer["ok"] else first_error(log) or answer.get("error", "compile failed"),
                         seconds=seconds, confinement=answer["confinement"], compiler=f"NVRTC {answer['nvrtc']}")


def _death(code: int, stderr: str, limits: CompileLimits) -> str:
    """Why the compiler process ended without an answer (a limit, most likely), without its stderr's paths."""
    if code in (-signal.SIGXCPU, -signal.SIGKILL):
        return f"the compiler used more than its {limits.seconds:.0f} s of CPU time and was killed"
    if code == -signal.SIGABRT or any(m in stderr for m in ("MemoryError", "bad_alloc", "OUT_OF_MEMORY")):
        return f"the compiler ran out of its {limits.memory_mb} MB memory cap (exit {code})"
    last = ABSOLUTE_PATH.sub(r"\1", stderr.strip().splitlines()[-1]) if stderr.strip() else ""
    return f"the compiler process died (exit {code}){': ' + last[:300] if last else ''}"


def strip_log(log: str, include_dirs: tuple[str, ...]) -> str:
    """Keep diagnostics located in the candidate or prelude (with their source excerpts) and those in CUDA
    headers (message only); drop anything located elsewhere, and every host path (basenames stay)."""
    kept: list[str] = []
    dropped = 0
    mode = "keep"
    for line in log.splitlines():
        m = DIAGNOSTIC.match(line)
        if m:
            path = m.group("file")
            if path in (CANDIDATE_FILE, PRELUDE_FILE):
                mode = "keep"
            elif any(os.path.abspath(path).startswith(os.path.abspath(d) + os.sep) for d in include_dirs):
                mode = "message"
            else:
                mode = "drop"
            if mode == "drop":
                dropped += 1
                continue
            line = f"{os.path.basename(path)}({m.group('line')}): {m.group('rest')}"
        elif line.startswith((" ", "\t")):
            if mode == "keep":   # the candidate's own text, or the compiler's context ("detected during ...")
                kept.append(ABSOLUTE_PATH.sub(r"\1", line))
            continue
        kept.append(ABSOLUTE_PATH.sub(r"\1", CANNOT_OPEN.sub(r"\1", line)))
    if dropped:
        kept.append(f"({dropped} diagnostic(s) located outside the candidate and the CUDA headers omitted)")
    return "\n".join(kept)


ERROR_LINE = re.compile(r"\b(?:error|fatal)(?:\s*#\d+-D)?\s*:", re.IGNORECASE)   # "...: error:", "ptxas fatal :"


def first_error(log: str) -> str:
    """The compiler's first error line (a warning that merely mentions 'error', e.g. a name, is not one)."""
    return next((line.strip()[:400] for line in log.splitlines() if ERROR_LINE.search(line)), "")
