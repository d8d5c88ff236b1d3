"""Build a candidate for a task: the confined compiler makes the cubin, a GPU worker loads it.

`build_for_device` compiles (or takes the build made ahead, sandbox.build_ahead) and loads, inside a GPU
worker; `compile_only` compiles without a GPU and reads the build facts (registers, spills, stack, shared
memory) from ptxas's report.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import time
from pathlib import Path

from pydantic import BaseModel

from megakernel_agent.tasks.base import Task
from megakernel_agent.traces.results import BuildResult, DeviceInfo, Resources

from .candidate import Candidate, CandidateError, validate
from .compiler import CompileLimits, CompileOutput, CompilerHook, compile_cuda, nvrtc_options

INSTRUMENT_DEFINES = frozenset({"PHASE_STAMPS", "SKIP_MOE", "SKIP_ATTN"})
PTXAS_RE = {
    "registers": re.compile(r"Used (\d+) registers"),
    "stack": re.compile(r"(\d+) bytes stack frame"),
    "spill_stores": re.compile(r"(\d+) bytes spill stores"),
    "spill_loads": re.compile(r"(\d+) bytes spill loads"),
    "smem": re.compile(r"(\d+) bytes smem"),
}
GMEM_RE = re.compile(r"^ptxas info\s*:\s*(\d+) bytes gmem", re.M)   # ptxas' own line, not candidate text
DEFAULT_ARCH = "sm_90"
PLACEMENTS = 16   # loads of one build that its evaluations take in turn (Placements)
GLOBALS_LIMIT = 16 << 20   # bytes of a build's own device globals, which each of its loads allocates again


def build_defines(task: Task, knobs: dict[str, int], instruments: dict[str, str] | None = None) -> dict[str, str]:
    """Task dimensions, knob values and instrument switches as -D; a knob may not shadow either of the others."""
    dims = task.defines()
    clash = sorted(set(knobs) & (set(dims) | INSTRUMENT_DEFINES))
    if clash:
        raise CandidateError(f"knob name(s) {clash} are reserved (task dimensions and instrument switches: "
                             f"{sorted(set(dims) | INSTRUMENT_DEFINES)})")
    return {**{k: str(v) for k, v in knobs.items()}, **(instruments or {}), **dims}


class BuiltAhead(BaseModel):
    """A build made ahead of its evaluation (sandbox.build_ahead), stored as <key>.json for the worker."""

    knobs: dict[str, int]
    output: CompileOutput


def build_key(task: Task, cand: Candidate, info: DeviceInfo) -> str:
    """The key of `cand`'s binary for the GPU `info` describes (CandidateError for malformed knobs)."""
    arch = "sm_" + info.capability.replace(".", "")
    return cand.key(f"{arch}|{task.defines()}|{info.cupy}|{info.cuda}")


def built_ahead(folder: Path | None, key: str) -> BuiltAhead | None:
    """The build stored under `key` in `folder`, if one was made ahead."""
    if folder is None or not (folder / f"{key}.json").is_file():
        return None
    return BuiltAhead.model_validate_json((folder / f"{key}.json").read_text())


def compile_candidate(task: Task, cand: Candidate, arch: str, limits: CompileLimits | None = None,
                      instruments: dict[str, str] | None = None, track: CompilerHook | None = None
                      ) -> tuple[dict[str, int], CompileOutput]:
    """(resolved knobs, compiler output); CandidateError for a source or knob that breaks a rule."""
    knobs = validate(cand)
    options = [*nvrtc_options(arch, build_defines(task, knobs, instruments)), "--ptxas-options=-v"]
    out = compile_cuda(task.prelude(), cand.source, options, limits, track=track)
    globals_bytes = max((int(n) for n in GMEM_RE.findall(out.log)), default=0)
    if out.ok and globals_bytes > GLOBALS_LIMIT:   # a worker holds up to PLACEMENTS loads of a build
        out = out.model_copy(update={"ok": False, "cubin_b64": "", "error": (
            f"the kernel's own device globals take {globals_bytes} bytes (ptxas); at most {GLOBALS_LIMIT} are "
            f"allowed, since every load of a build allocates them again")})
    return knobs, out


def instrumented_key(key: str, instruments: dict[str, str] | None) -> str:
    """The build key of `key`'s candidate built with instrument switches (`key` itself without any)."""
    if not instruments:
        return key
    return hashlib.sha256(json.dumps({"key": key, "instruments": instruments}, sort_keys=True).encode()).hexdigest()


def failed_build(key: str, knobs: dict[str, int], out: CompileOutput, seconds: float, ahead: bool = False
                 ) -> BuildResult:
    """The result of a compile that failed (in a worker, or ahead of it on the CPU)."""
    return BuildResult(ok=False, key=key, knobs=knobs, error=out.error, log=out.log[-20000:], compiler=out.compiler,
                       confinement=out.confinement, seconds=seconds, compile_seconds=out.seconds, built_ahead=ahead)


class Placements:
    """A build's loads, taken in turn: each call of `next` gives the next of up to `count` loads of the same
    cubin (loaded when first needed, then kept), so a build timed again and again runs from several code
    placements rather than one. Where a module's code lies moved the Kimi step by up to 1.3 % at 16K, steadily
    for that load (BENCHMARKS.md, forty-seventh session): one load per build made that a bias between versions
    that interleaving cannot cancel. `last` is the index of the load `next` gave, which the evaluation records
    (EvalResult.placement), so that samples of one load are judged as one group however they were taken.

    A later load that fails with `transient` (out of device memory: the same bytes loaded once already) ends
    the turns at the loads held (`lost` says why) rather than failing the evaluation that asked; its samples
    then share a load with earlier ones, and their placement ids say so."""

    def __init__(self, load, first, count: int = PLACEMENTS, transient: type[Exception] | tuple = ()):
        self._load, self._loads, self._count, self._turn, self._transient = load, [first], count, 0, transient
        self.last = 0
        self.lost: str | None = None

    def next(self):
        i = self._turn % self._count
        if i == len(self._loads):
            try:
                self._loads.append(self._load())
            except self._transient as e:
                self.lost = f"load {i + 1} of the build failed ({e}); it keeps its {i} load(s)"
                sys.stderr.write(self.lost + "\n")
                self._count, i = i, 0
        self._turn += 1
        self.last = i
        return self._loads[i]


def build_for_device(task: Task, cand: Candidate, arch: str, key: str, cache: dict,
                     limits: CompileLimits | None = None, instruments: dict[str, str] | None = None,
                     ahead: Path | None = None):
    """(BuildResult, CompiledKernel | None). Never raises for a bad candidate: the failure is the result.
    With `instruments` (e.g. PHASE_STAMPS=1) the build and its key are the instrumented ones. A build made
    ahead (in the folder `ahead`, under the same key) is loaded instead of compiled again. A build already in
    `cache` comes back as its next placement (Placements)."""
    from megakernel_agent.tasks.cuda_runtime import CudaOutOfMemory, KernelContractError, driver, load_kernel

    t0 = time.perf_counter()
    key = instrumented_key(key, instruments)
    if key in cache:
        placements, facts = cache[key]
        kernel = placements.next()
        return facts.model_copy(update={"cached": True, "seconds": time.perf_counter() - t0,
                                        "load": placements.last}), kernel
    made = built_ahead(ahead, key) if not instruments else None
    try:
        if made is not None:
            validate(cand)   # the source rules hold for a build made ahead as for one made here
        knobs, out = (made.knobs, made.output) if made else compile_candidate(task, cand, arch, limits, instruments)
    except CandidateError as e:
        return BuildResult(ok=False, key=key, error=str(e), seconds=time.perf_counter() - t0), None
    if not out.ok:
        return failed_build(key, knobs, out, time.perf_counter() - t0, made is not None), None
    cubin = out.cubin

    def load():
        return load_kernel(cubin, task.spec.entry, task.spec.declarations)

    try:
        kernel = load()
    except KernelContractError as e:   # a launch value or declaration the host cannot read: the kernel's fault
        return BuildResult(ok=False, key=key, knobs=knobs, error=str(e), seconds=time.perf_counter() - t0), None
    c = kernel.contract
    fit = driver().occupancy(kernel.handle, c.threads, c.dynamic_smem) if c.threads <= kernel.max_threads else 0
    facts = ptxas_facts(out.log, task.spec.entry)
    res = BuildResult(
        ok=True, key=key, knobs=knobs, log=out.log[-20000:], seconds=time.perf_counter() - t0, compiler=out.compiler,
        confinement=out.confinement, spill_bytes=facts["spill_stores"] + facts["spill_loads"],
        built_ahead=made is not None, compile_seconds=out.seconds,
        resources=Resources(
            registers=kernel.registers, local_bytes=kernel.local_bytes, static_smem=kernel.static_smem,
            dynamic_smem=c.dynamic_smem, max_threads=kernel.max_threads, threads=c.threads,
            blocks_per_sm=c.blocks_per_sm, blocks_fit_per_sm=fit, grid=driver().sm_count() * c.blocks_per_sm,
        ),
    )
    placements = Placements(load, kernel, transient=CudaOutOfMemory)
    cache[key] = (placements, res)
    return res, placements.next()


def ptxas_facts(log: str, entry: str) -> dict[str, int]:
    """Registers, stack, spills and shared memory of `entry` as ptxas reported them (0 where absent)."""
    start = log.find(f"Function properties for {entry}\n")
    block = log[start:].split("Compile time", 1)[0] if start >= 0 else ""
    return {k: int(m.group(1)) if (m := r.search(block)) else 0 for k, r in PTXAS_RE.items()}


def compile_only(task: Task, cand: Candidate, arch: str = DEFAULT_ARCH, limits: CompileLimits | None = None
                 ) -> BuildResult:
    """The confined compile without a GPU: syntax, registers, spills. Knob and source rules apply."""
    key = cand.key(f"compile-only:{arch}")
    t0 = time.perf_counter()
    try:
        knobs, out = compile_candidate(task, cand, arch, limits)
    except CandidateError as e:
        return BuildResult(ok=False, key=key, error=str(e))
    res = BuildResult(ok=out.ok, key=key, knobs=knobs, log=out.log[-20000:], error=out.error,
                      seconds=time.perf_counter() - t0, compiler=out.compiler, confinement=out.confinement)
    if out.ok:
        nums = ptxas_facts(out.log, task.spec.entry)
        res.spill_bytes = nums["spill_stores"] + nums["spill_loads"]
        res.resources = Resources(
            registers=nums["registers"], local_bytes=nums["stack"] + nums["spill_stores"], static_smem=nums["smem"],
            dynamic_smem=0, max_threads=0, threads=0, blocks_per_sm=0, blocks_fit_per_sm=0, grid=0,
        )
    return res
