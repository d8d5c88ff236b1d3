"""Prompt text for LLM planners: a static prefix (cached) and a per-turn message."""

from __future__ import annotations

import json

from .base import PlannerView

RULES = """Rules (the sandbox enforces them; breaking one wastes a turn):
- You write device code only: one CUDA C++ source with the task's fixed `extern "C" __global__` entry point
  and parameter struct (below, prepended to your source). The host side, buffers, the single cooperative launch,
  the checks and the timer are not yours. Exactly one kernel launch per step; no extra launches of any kind.
- The kernel must declare MK_LAUNCH_CONTRACT(threads, blocks_per_sm, dynamic_smem, scratch_bytes, counter_words).
  The grid is SMs x blocks_per_sm; it must co-reside (the occupancy API is checked).
- Includes: CUDA system headers from the allow-list only (cuda_bf16.h, cuda_fp16.h, cooperative_groups.h,
  cuda_pipeline.h, cuda/barrier, mma.h, ...). No quoted includes.
- Knobs: `// @knob NAME DEFAULT {v1,v2,...} description` lines; values reach the compiler as -D.
  You may add, remove or change knob declarations.
- Correctness is checked fail-closed against an fp32 reference on fresh random inputs at several context
  lengths (including 1 and one not a multiple of any tile), every updated state tensor, a bit-identical re-run,
  continuation steps and a swapped-in state. A candidate is kept only if it is correct and faster beyond noise
  at every timed context.
- Answer by calling propose_kernel once: a hypothesis, a predicted change, and either anchored search/replace
  edits on the current best source (each search string must occur exactly once) or a complete new source,
  plus knob values if you want to change them."""


def system_prompt(view: PlannerView) -> str:
    hw = view.hardware
    hardware = (f"{hw.name}: {hw.sms} SMs, {hw.l2_mb:.0f} MB L2, measured copy bandwidth {hw.copy_tbs:.2f} TB/s, "
                f"compute capability {hw.capability}, CUDA {hw.cuda}" if hw else "unknown GPU")
    floors = ", ".join(f"ctx {c}: {b / 1e6:.0f} MB -> {b / (hw.copy_tbs * 1e12) * 1e6:.0f} µs"
                       for c, b in view.bytes_per_step.items()) if hw else ""
    return "\n\n".join([
        "You are a CUDA performance engineer optimizing a decode megakernel in an automated, measured loop.",
        f"Task: {view.task_name}. {view.task_description}",
        f"Dimensions: {json.dumps(view.dims)}",
        f"Hardware: {hardware}.",
        f"Roofline: bytes one step must move, and the floor at copy bandwidth: {floors}.",
        RULES,
        "Kernel ABI (generated, prepended to your source; do not redefine):\n" + view.abi,
    ])


def turn_prompt(view: PlannerView, history_size: int) -> str:
    lines = [f"Budget left: {view.budget_left_s:.0f} s.",
             f"Best version {view.best_id}: µs/token {view.best_us_per_ctx} (baseline {view.baseline_us_per_ctx}).",
             f"Best knob values: {json.dumps(view.best_knobs)}",
             "Recent attempts (newest last):"]
    for a in view.history[-history_size:]:
        perf = f" µs {a.us_per_ctx}" if a.us_per_ctx else ""
        res = f" regs {a.registers} local {a.local_bytes}B" if a.registers is not None else ""
        lines.append(f"- {a.id} [{a.outcome}] {a.hypothesis} knobs={a.knobs}{perf}{res} {a.message[:400]}")
    if not view.history:
        lines.append("- none yet")
    lines += ["", "Current best source:", "```cuda", view.best_source, "```",
              "Propose the next version with propose_kernel."]
    return "\n".join(lines)
