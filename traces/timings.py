"""Each version's timing of record, the session's one baseline, and each verdict's per-context ratios, from a
trace alone.

A version's figure pools its first timing with its interleaved confirmation re-timings
(`<id>~confirm-candidate-<n>`), each sample with the module load it ran from: the samples the session decided
on, and for a kept version the samples it judged later candidates against and put in its closing line.
Speedups divide one baseline, the one timed with the starting kernel: every worker times the PyTorch baseline
again and those timings drift, so dividing each version by its own worker's would mix the baseline's drift into
the kernel's progress.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field

from megakernel_agent.sandbox.stats import rule_interval

from .loader import Trace
from .results import EvalResult, by_load

CONFIRM = re.compile(r"(?P<vid>[^~]+)~confirm-(?P<side>best|candidate)-\d+")
BEST_ON = re.compile(r"(?P<vid>[^~]+)~best-on-.+")   # the best timed on a GPU it had not been timed on


@dataclass
class Timing:
    """A version's samples per context, each with the module load it ran from (its first evaluation's, then each
    re-timing's), its first evaluation (whose roofline fraction scales to the pooled median), and how many
    re-timings it pools."""

    loaded: dict[int, list[tuple[str, float]]]
    first: EvalResult
    retimings: int = 0

    @property
    def samples(self) -> dict[int, list[float]]:
        return {ctx: [x for _, x in pairs] for ctx, pairs in self.loaded.items()}

    @property
    def groups(self) -> dict[int, list[list[float]]]:
        """The samples per context grouped by load, as the keep rule draws them."""
        return {ctx: by_load(pairs) for ctx, pairs in self.loaded.items()}

    def median(self, ctx: int) -> float | None:
        return statistics.median(self.samples[ctx]) if self.samples.get(ctx) else None

    def roofline(self, ctx: int) -> float | None:
        """Fraction of the memory roofline at the pooled median (the first timing's, scaled by time)."""
        t = next((t for t in self.first.timings if t.ctx == ctx), None)
        return t.roofline * t.median_us / self.median(ctx) if t else None

    @property
    def source(self) -> str:
        n = len(next(iter(self.samples.values()), []))
        if not self.retimings:
            return f"median of {n} samples, one timing"
        return f"median of {n} samples: first timing + {self.retimings} interleaved confirmation re-timings"


@dataclass
class Baseline:
    """The PyTorch baseline every speedup divides: timed by the worker of `timed_with`; `drift` is the range of
    every worker's own timing per context (shown, never divided by)."""

    us: dict[int, float]
    timed_with: str
    drift: dict[int, tuple[float, float]] = field(default_factory=dict)

    def speedup(self, ctx: int, us: float | None) -> float | None:
        return self.us[ctx] / us if us and ctx in self.us else None


@dataclass
class Judgement:
    """A decision's comparison recomputed per context: the best then (`against`) / this version, with a 95%
    bootstrap interval, on the samples the decision used, drawn as its rule drew them (sandbox.stats.rule_interval:
    by load, or pooled in traces before the forty-eighth session)."""

    against: str
    ratios: dict[int, tuple[float, float, float]]


Loaded = dict[int, list[tuple[str, float]]]


def _loaded(label: str, result: EvalResult) -> Loaded:
    """`result`'s samples per context with their loads (`label`, its event's id, where none was recorded)."""
    return {t.ctx: result.loaded_samples(t.ctx, label) for t in result.timings}


def _retimings(trace: Trace) -> dict[tuple[str, str], list[tuple[str, EvalResult]]]:
    """Confirmation re-timings (event id, result) by (candidate id, side); a failed one never reached the
    decision."""
    out: dict[tuple[str, str], list[tuple[str, EvalResult]]] = {}
    for e in trace.events:
        m = CONFIRM.fullmatch(e.id) if e.type == "evaluate" else None
        if m and e.result.ok:
            out.setdefault((m["vid"], m["side"]), []).append((e.id, e.result))
    return out


def _with(first: Loaded, extra: list[tuple[str, EvalResult]]) -> Loaded:
    """`first`'s samples followed by each re-timing's, per context."""
    return {ctx: pairs + [p for label, r in extra for p in r.loaded_samples(ctx, label)]
            for ctx, pairs in first.items()}


def of_record(trace: Trace) -> dict[str, Timing]:
    """The starting kernel's and every timed attempt's timing of record, by id."""
    out = {}
    if trace.measure and trace.measure.result.timings:
        out[trace.measure.id] = Timing(_loaded(trace.measure.id, trace.measure.result), trace.measure.result)
    retimed = _retimings(trace)
    for a in trace.attempts():
        if a.evaluate and a.evaluate.result.timings:
            extra = retimed.get((a.proposal.id, "candidate"), [])
            out[a.proposal.id] = Timing(_with(_loaded(a.evaluate.id, a.evaluate.result), extra), a.evaluate.result,
                                        len(extra))
    return out


def judgements(trace: Trace) -> dict[str, Judgement]:
    """For each attempt the rule compared (its decision has a ratio): the comparison per context, against the
    samples the session held for its best then on the decision's GPU (a resumed session re-measures the best and
    judges against that; a GPU the best was not timed on gets it timed there first, `<id>~best-on-<lane>`)."""
    records, retimed = of_record(trace), _retimings(trace)
    best_on = {m["vid"]: _loaded(e.id, e.result) for e in trace.events
               if e.type == "evaluate" and e.result.ok and (m := BEST_ON.fullmatch(e.id))}
    best, references = "", {}   # the best, and its samples per GPU
    out = {}
    for e in trace.events:
        if e.type == "measure" and e.result.timings:
            best, references = e.id.split("@")[0], {e.gpu: _loaded(e.id, e.result)}
        elif e.type == "decision" and e.id in records:
            if e.id in best_on:
                references[e.gpu] = best_on[e.id]
            reference = references.get(e.gpu)
            if e.ratio is not None and reference:
                ref = _with(reference, retimed.get((e.id, "best"), []))
                out[e.id] = Judgement(best, {ctx: rule_interval(by_load(ref[ctx]), gs, e.by_load)
                                             for ctx, gs in records[e.id].groups.items() if ref.get(ctx)})
            if e.kept:
                best, references = e.id, {e.gpu: records[e.id].loaded}
    return out


def session_baseline(trace: Trace) -> Baseline | None:
    """The baseline timed with the starting kernel (else the first evaluation that timed one), and the drift."""
    results = [(e.id, e.result) for e in trace.events if e.type in ("measure", "evaluate")]
    timed = [(vid, {t.ctx: t.baseline_median_us for t in r.timings if t.baseline_median_us}) for vid, r in results]
    timed = [(vid, us) for vid, us in timed if us]
    if not timed:
        return None
    vid, us = timed[0]
    drift = {ctx: (min(u[ctx] for _, u in timed if ctx in u), max(u[ctx] for _, u in timed if ctx in u)) for ctx in us}
    return Baseline(us, vid, drift)


def best_id(trace: Trace) -> str:
    """The best that the last decision left (decisions are recorded in the order made, which with several in
    flight is not the order proposed), else the starting kernel ("" before it was measured)."""
    decisions = [e for e in trace.events if e.type == "decision"]
    return decisions[-1].best_id if decisions else trace.measure.id if trace.measure else ""
