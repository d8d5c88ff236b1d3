"""Read a recorded evaluation the way an engineer would: why it failed, or how close it came.

A build failure shows the compiler's full (cleaned) log; a wrong result shows every compared tensor of
the failing case against its bound, the first layer that diverges and the routing branches tried; a
correct version shows its closest tensors and build facts. Works from the trace alone (no GPU).
"""

from __future__ import annotations

import re

from megakernel_agent.traces.results import CheckCase, EvalResult, TensorCheck


def layer_of(name: str) -> int:
    """L3.c_kv_row -> 3; the output comes after every layer."""
    m = re.match(r"L(\d+)\.", name)
    return int(m.group(1)) if m else 1 << 20


def failing_case(res: EvalResult) -> CheckCase | None:
    """The case that failed: in the check protocol, or a timed sample's checked step."""
    if res.check is not None:
        bad = next((c for c in res.check.cases if not c.passed), None)
        if bad is not None:
            return bad
    for t in res.timings:
        for s in t.sample_checks:
            if not s.passed and s.case is not None:
                return s.case
    return None


def tensor_table(tensors: list[TensorCheck]) -> list[str]:
    rows = [f"{'tensor':16s} {'class':10s} {'cos':>8s} {'rel_l2':>10s} {'bound':>8s} finite  verdict"]
    for t in tensors:
        rows.append(f"{t.name:16s} {t.tensor_class:10s} {t.cos:8.4f} {t.rel_l2:10.4g} {t.rel_l2_max:8.4g} "
                    f"{str(t.finite):6s}  {'pass' if t.passed else 'FAIL'}")
    return rows


def diagnose(vid: str, res: EvalResult) -> tuple[str, str]:
    """(text, one-line summary) for the recorded evaluation `res` of version `vid`."""
    f = res.failure
    if f is not None and f.cls.value == "build":
        log = res.build.log if res.build is not None else ""
        text = f"{vid}: build failed in {f.phase}: {f.message}\n" + (f"compiler log:\n{log}" if log else "")
        return text, f"{vid}: build failed: {f.message[:160]}"
    case = failing_case(res)
    if case is not None:
        lines = [f"{vid}: wrong in {f.phase if f else 'check'}: {f.message if f else ''}".rstrip(),
                 f"case: {case.kind} seed={case.seed} ctx={case.ctx} step={case.step}"]
        if case.message:
            lines.append(f"note: {case.message}")
        lines += tensor_table(case.tensors)
        failed = [t for t in case.tensors if not t.passed]
        if failed:
            first = min(failed, key=lambda t: layer_of(t.name))
            where = "the output" if layer_of(first.name) > 1000 else f"layer {layer_of(first.name)}"
            lines.append(f"first diverging: {where} ({first.name}); every tensor before it passed")
        broken = [k for k, ok in case.untouched.items() if not ok]
        if broken:
            lines.append(f"changed but must stay bit-identical: {broken}")
        if case.branches:
            lines.append("routing near-tie branches tried: " + "; ".join(case.branches))
        summary = f"{vid}: wrong ({case.kind} ctx {case.ctx}): " + (
            f"first diverging {failed and min(failed, key=lambda t: layer_of(t.name)).name}" if failed else
            case.message[:120])
        return "\n".join(lines), summary
    if f is not None:
        return f"{vid}: {f.cls.value} in {f.phase}: {f.message}", f"{vid}: {f.cls.value}: {f.message[:160]}"
    return _healthy(vid, res)


def _healthy(vid: str, res: EvalResult) -> tuple[str, str]:
    lines = [f"{vid}: correct."]
    if res.check is not None:
        tensors = [t for c in res.check.cases for t in c.tensors]
        closest = sorted(tensors, key=lambda t: -t.rel_l2 / t.rel_l2_max)[:5]
        lines.append(f"{len(res.check.cases)} check cases passed; closest to their bounds:")
        lines += tensor_table(closest)
    b = res.build
    if b is not None and b.resources is not None:
        r = b.resources
        lines.append(f"build: {r.registers} registers, {b.spill_bytes} B spilled, local {r.local_bytes} B, smem "
                     f"{r.static_smem}+{r.dynamic_smem} B, {r.blocks_per_sm}/SM of {r.threads} threads "
                     f"(fit {r.blocks_fit_per_sm})")
    for t in res.timings:
        lines.append(f"ctx {t.ctx}: {t.median_us:.1f} µs/token (spread {t.spread:.1%}), {len(t.sample_checks)} "
                     "timed samples verified")
    return "\n".join(lines), f"{vid}: correct"
