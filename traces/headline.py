"""The session's headline numbers, stated once for the replay and the report: the one baseline every speedup
divides by, the best version's time with its source named, and each attempt's outcome in words.

Each worker times the PyTorch baseline again and those timings drift (20 to 28 ms at one context in one
session), so a speedup over a version's own baseline mixes the kernel's gain with the baseline's drift.
"""

from __future__ import annotations

import statistics
from collections import Counter

from pydantic import BaseModel

from .loader import Attempt, Trace
from .schema import Evaluate


class Baseline(BaseModel):
    """The baseline's median µs per context, where it came from, and the range the workers' own timings spanned."""

    us: dict[int, float]
    source: str
    worker_range: dict[int, tuple[float, float]]


class Best(BaseModel):
    """The best version's µs per context: the median of its own evaluation, like every attempt in the timeline.
    `pooled_us` adds the samples of its confirmation re-timings (the figure the session's summary records)."""

    id: str
    us: dict[int, float]
    source: str
    pooled_us: dict[int, float] = {}
    pooled_samples: dict[int, int] = {}


def baseline(trace: Trace) -> Baseline | None:
    """The baseline the starting measure timed, once, at the session start; None when it timed none."""
    m = trace.measure
    us = {t.ctx: t.baseline_median_us for t in m.result.timings if t.baseline_median_us} if m else {}
    if not us:
        return None
    seen: dict[int, list[float]] = {}
    for e in trace.events:
        for t in getattr(getattr(e, "result", None), "timings", None) or []:
            if t.baseline_median_us:
                seen.setdefault(t.ctx, []).append(t.baseline_median_us)
    return Baseline(us=us, source=f"timed once at the session start, with the starting kernel {m.id}",
                    worker_range={c: (min(v), max(v)) for c, v in seen.items()})


def best(trace: Trace) -> Best | None:
    """The last kept version with timings (the starting kernel if none was kept); None before any measure."""
    kept = [a for a in trace.attempts() if a.outcome == "kept" and a.evaluate and a.evaluate.result.timings]
    if kept:
        a = kept[-1]
        pooled, n = _pooled(trace, a)
        return Best(id=a.proposal.id, us=a.evaluate.result.median_by_ctx(), source="median of its evaluation",
                    pooled_us=pooled, pooled_samples=n)
    m = trace.measure
    if m is None or not m.result.timings:
        return None
    return Best(id=m.id, us=m.result.median_by_ctx(), source="median of the starting measure")


def _pooled(trace: Trace, a: Attempt) -> tuple[dict[int, float], dict[int, int]]:
    """Per context: the median and count of the evaluation's samples with its confirmation re-timings' added;
    empty when the trace holds no confirmation re-timing of it."""
    prefix = f"{a.proposal.id}~confirm-candidate-"
    extra = [e.result for e in trace.events if isinstance(e, Evaluate) and e.id.startswith(prefix)]
    if not extra:
        return {}, {}
    samples = {t.ctx: list(t.samples_us) for t in a.evaluate.result.timings}
    for r in extra:
        for t in r.timings:
            samples.get(t.ctx, []).extend(t.samples_us)
    return {c: statistics.median(s) for c, s in samples.items()}, {c: len(s) for c, s in samples.items()}


def outcome_name(a: Attempt) -> str:
    """The recorded outcome, except that the class `slower` reads "slower" only when the decision's interval lies
    entirely below 1; otherwise the candidate was "not faster beyond noise"."""
    if a.outcome != "slower":
        return a.outcome
    d = a.decision
    return "slower" if d and d.ratio_high is not None and d.ratio_high < 1 else "not faster beyond noise"


def counts_line(trace: Trace) -> str:
    attempts = trace.attempts()
    by_name = Counter(outcome_name(a) for a in attempts if a.outcome != "kept")
    kept = len(attempts) - sum(by_name.values())
    return f"{len(attempts)} tried, {kept} kept" + "".join(f"; {k} {v}" for k, v in sorted(by_name.items()))


def best_line(trace: Trace) -> str:
    """The best against the starting kernel at every context, its source named; "" before any measure."""
    b, m = best(trace), trace.measure
    if b is None:
        return ""
    seed = m.result.median_by_ctx() if m else {}
    per_ctx = ", ".join(f"ctx {c}: {seed[c]:.1f} -> {u:.1f} µs ({seed[c] / u:.3f}x)" if c in seed else
                        f"ctx {c}: {u:.1f} µs" for c, u in sorted(b.us.items()))
    line = f"best {b.id} ({b.source}): {per_ctx}"
    if b.pooled_us:
        counts = sorted(set(b.pooled_samples.values()))
        n = f"{counts[0]} samples per context" if len(counts) == 1 else " / ".join(
            str(k) for _, k in sorted(b.pooled_samples.items())) + " samples"
        line += (f"; with its confirmation re-timings pooled ({n}): "
                 + " / ".join(f"{u:.1f}" for _, u in sorted(b.pooled_us.items())) + " µs")
    return line


def baseline_line(trace: Trace) -> str:
    """Which baseline every speedup divides by, and how far the workers' own baselines drifted."""
    base = baseline(trace)
    if base is None:
        return "none recorded (no speedups)"
    ms = " / ".join(f"{u / 1000:.2f}" for _, u in sorted(base.us.items()))
    drift = ", ".join(f"{lo / 1000:.1f}-{hi / 1000:.1f}" for _, (lo, hi) in sorted(base.worker_range.items()))
    ctxs = " / ".join(str(c) for c in sorted(base.us))
    return (f"PyTorch {ms} ms at ctx {ctxs}, {base.source}; every speedup divides by it (the workers' own "
            f"baseline timings, not used, spanned {drift} ms)")
