"""Prompt text for the LLM planner: a cached prefix (rules, task brief, the starting source's outline) and
the short messages that open the session and report each proposal's outcome."""

from __future__ import annotations

import json

from ..source_view import outline
from .base import PlannerView

RULES = """You are a CUDA performance engineer optimizing a decode megakernel in a measured loop. Work the way
this kernel was built: measure where the time goes (profile: per-phase critical span, block work, barrier wait,
bytes and TB/s), model the phase you will change (a phase is the maximum over its ~264 block chains, compute is
not free, registers are full), write the prediction down (note, and predicted_us in propose), make one change,
and read the outcome against the prediction. Diagnose failures before moving on; repair a version that almost
works instead of starting over; stack a change on a version that was not kept when it looked promising.

The sandbox enforces these rules (breaking one wastes budget):
- You write device code only: one CUDA C++ source with the task's fixed `extern "C" __global__` entry point and
  parameter struct (the ABI below, prepended to your source). The host side, buffers, the single cooperative
  launch, the checks and the timer are not yours. Exactly one kernel launch per step.
- The kernel declares MK_LAUNCH_CONTRACT(threads, blocks_per_sm, dynamic_smem, scratch_bytes, counter_words);
  the grid is SMs x blocks_per_sm and must co-reside.
- Includes: `#include <...>` of listed CUDA headers only (cuda_bf16.h, cuda_fp16.h, cooperative_groups.h,
  cuda_pipeline.h, cuda/barrier, mma.h, ...). No quoted or macro includes, no _Pragma, no ## token pasting,
  no #line; pragmas: unroll, nounroll, nv_diag_*.
- Knobs: `// @knob NAME DEFAULT {v1,v2,...} description` lines; values reach the compiler as -D. Knob names may
  not repeat the task's dimensions. Knob values you give are merged onto the parent's.
- Correctness is checked fail-closed against an fp32 reference on fresh random inputs (contexts 1, a
  non-multiple of any tile, the longest), every updated state tensor, a bit-identical re-run, continuation
  steps and a swapped-in state. Every timed sample is replayed untimed and must end bit-identical, and a step
  of it is checked against the reference: a kernel must do the same work whenever it runs.
- A version becomes the best only if it is correct and faster beyond noise at every timed context (a 95%
  bootstrap interval above 1, re-timed interleaved with the best). An exact duplicate is refused unrun.
- Tools that run on the GPU (profile, compare) and every proposal spend the session's wall-clock budget.
- `model` (CPU, about a second) replays the seed's schedule block by block from a profiled version's stamps:
  ask it what a knob move or a named what-if should do before you spend the GPU on it, and write its
  prediction next to yours. It models the seed's own source only, and it has missed (BENCHMARKS.md).
Use `read` for the lines you need rather than asking for the whole file; edits must quote the parent's text
exactly (each search string unique). Call `finish` when nothing left is worth the budget."""


def system_blocks(view: PlannerView, start_source: str) -> list[dict]:
    """The cached prefix after the tools: rules, then the task brief and the starting source's outline."""
    hw = view.hardware
    hardware = (f"{hw.name}: {hw.sms} SMs, {hw.l2_mb:.0f} MB L2, measured copy bandwidth {hw.copy_tbs:.2f} TB/s, "
                f"compute capability {hw.capability}, CUDA {hw.cuda}" if hw else "unknown GPU")
    floors = ", ".join(f"ctx {c}: {b / 1e6:.0f} MB -> {b / (hw.copy_tbs * 1e12) * 1e6:.0f} µs"
                       for c, b in view.bytes_per_step.items()) if hw else ""
    knobs = "\n".join(f"- {k.name} (default {k.default}, values {list(k.values)}): {k.doc}"
                      for k in view.declared_knobs)
    brief = "\n\n".join([
        f"Task: {view.task_name}. {view.task_description}",
        f"Dimensions: {json.dumps(view.dims)}",
        f"Timed contexts: {view.context_lengths}. Hardware: {hardware}.",
        f"Bytes one step must move and the floor at copy bandwidth: {floors}.",
        "Kernel ABI (generated, prepended to every source; do not redefine):\n" + view.abi,
        f"Knobs of the starting version:\n{knobs or '(none)'}",
        f"Outline of the starting version {view.best_id} (read any part with `read`):\n{outline(start_source)}",
    ])
    return [{"type": "text", "text": RULES}, {"type": "text", "text": brief, "cache_control": {"type": "ephemeral"}}]


def opening(view: PlannerView) -> str:
    """The first user message: where the session starts."""
    us = ", ".join(f"ctx {c}: {u:.1f} µs" for c, u in sorted(view.best_us_per_ctx.items()))
    base = ", ".join(f"ctx {c}: {u:.0f} µs" for c, u in sorted(view.baseline_us_per_ctx.items()))
    versions = "\n".join(v.line() for v in view.archive) or "(none)"
    return (f"The session starts with {view.best_id} measured at {us} (PyTorch baseline {base}); budget "
            f"{view.budget_left_s:.0f} s.\nVersions so far:\n{versions}\n"
            "Study what you need, note your prediction, then propose.")
