"""What the CLI checks before it asks for a GPU; each refusal is a BadInput whose message is one line."""

from __future__ import annotations

import re
from pathlib import Path

from megakernel_agent.sandbox.build import compile_only
from megakernel_agent.sandbox.candidate import Candidate, CandidateError, validate
from megakernel_agent.sandbox.source_rules import logical_lines
from megakernel_agent.tasks.base import Task
from megakernel_agent.tasks.registry import get_task
from megakernel_agent.traces.loader import Trace, TraceError, load
from megakernel_agent.traces.results import BuildResult
from megakernel_agent.traces.schema import SessionStart

from .errors import BadInput

CONTRACT_RE = re.compile(r"\bMK_LAUNCH_CONTRACT\s*\(")


def task_for(name: str, size: str) -> Task:
    try:
        return get_task(name, size)
    except ValueError as e:
        raise BadInput(str(e)) from e


def parse_knob(text: str) -> tuple[str, int]:
    """'NAME=INTEGER' -> (NAME, INTEGER)."""
    name, sep, value = text.partition("=")
    if not (sep and name.isidentifier() and value.lstrip("-").isdigit()):
        raise BadInput(f"a knob setting is NAME=INTEGER, got {text!r}")
    return name, int(value)


def read_kernel(path: Path) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError as e:
        raise BadInput(f"kernel file not found: {path}") from e
    except UnicodeDecodeError as e:
        raise BadInput(f"kernel file {path} is not UTF-8 text") from e
    except OSError as e:
        raise BadInput(f"cannot read kernel file {path}: {e.strerror}") from e


def kernel_candidate(task: Task, path: Path | None, knobs: dict[str, int]) -> tuple[Candidate, str]:
    """(candidate, label) of the kernel at `path` (default: the task's seed) with `knobs`, checked; a file is
    also compiled where NVRTC loads, the seed is not (it ships compiling)."""
    if path is None:
        cand, label = Candidate(source=task.seed_source(), knobs=knobs), Path(task.spec.seed_kernel).name
    else:
        cand, label = Candidate(source=read_kernel(path), knobs=knobs), str(path)
    check_kernel(task, cand, label, compile=path is not None)
    return cand, label


def check_kernel(task: Task, cand: Candidate, label: str, compile: bool) -> dict[str, int]:
    """Knobs, source rules, the task's entry and launch contract, and with `compile` a compile on this CPU;
    returns the resolved knob values."""
    try:
        knobs = validate(cand)
    except CandidateError as e:
        raise BadInput(f"{label}: {e}") from e
    check_contract(task, cand.source, label)
    built = compile_check(task, cand) if compile else None
    if built is not None and not built.ok:
        raise BadInput(f"{label} does not compile: {built.error}")
    return knobs


def check_contract(task: Task, source: str, label: str) -> None:
    """The source defines the task's extern "C" __global__ entry and declares MK_LAUNCH_CONTRACT (outside comments)."""
    code = "\n".join(line.text for line in logical_lines(source))
    entry = re.compile(rf'extern\s+"C"\s+__global__\b[^;{{}}]*\b{re.escape(task.spec.entry)}\s*\(')
    if not entry.search(code):
        raise BadInput(f'{label} does not define the {task.spec.name} entry: extern "C" __global__ void '
                       f"{task.spec.entry}(...)")
    if not CONTRACT_RE.search(code):
        raise BadInput(f"{label} does not declare its launch: MK_LAUNCH_CONTRACT(threads, blocks_per_sm, "
                       "dynamic_smem, scratch_bytes, counter_words)")


def nvrtc_loads() -> bool:
    """Whether NVRTC can be loaded here (CuPy and the NVRTC library are installed)."""
    try:
        from cupy_backends.cuda.libs import nvrtc

        nvrtc.getVersion()
    except (ImportError, OSError, RuntimeError):
        return False
    return True


def compile_check(task: Task, cand: Candidate) -> BuildResult | None:
    """The sandbox's confined compile on this CPU; None where NVRTC cannot be loaded (the GPU worker compiles)."""
    return compile_only(task, cand) if nvrtc_loads() else None


def load_trace(path: Path) -> Trace:
    """A trace that reads back whole and begins with its session_start."""
    try:
        trace = load(Path(path))
    except FileNotFoundError as e:
        raise BadInput(f"trace not found: {path}") from e
    except OSError as e:
        raise BadInput(f"cannot read trace {path}: {e.strerror}") from e
    except TraceError as e:
        raise BadInput(str(e).splitlines()[0]) from e
    if not trace.events or not isinstance(trace.events[0], SessionStart):
        raise BadInput(f"{path} is not a trace: it does not begin with a session_start event")
    return trace


def output_file(text: str, suffixes: tuple[str, ...] = ()) -> Path:
    """A file to write: its folder exists and, when `suffixes` are given, its name ends in one of them."""
    path = Path(text)
    if suffixes and path.suffix not in suffixes:
        raise BadInput(f"{text}: the name must end in {' or '.join(suffixes)}")
    if not path.parent.is_dir():
        raise BadInput(f"{text}: folder {path.parent} does not exist")
    return path
