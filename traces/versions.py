"""Each version's numbers as report tables, from a trace alone: timings per context with intervals, the reason
every refused attempt recorded, what the compiler gave each build, and the diff of each kept change against
its parent."""

from __future__ import annotations

from pydantic import BaseModel

from agent.compare import Version, diff_text
from sandbox.candidate import Candidate
from sandbox.stats import ratio_interval

from .headline import outcome_name
from .loader import Trace
from .results import BuildResult, EvalResult


class Table(BaseModel):
    title: str
    head: list[str]
    rows: list[list[str]]
    note: str = ""


def _ratio(r: float, lo: float, hi: float) -> str:
    return f"{r:.3f}x [{lo:.3f}, {hi:.3f}]"


def timing_table(trace: Trace) -> Table | None:
    """The starting measure and every timed attempt: µs per context, its ratio to the seed with a 95% bootstrap
    interval from the two versions' samples, and the decision's own ratio to the best of its time."""
    m = trace.measure
    if m is None or not m.result.timings:
        return None
    seed = {t.ctx: t.samples_us for t in m.result.timings}
    head = ["id", "outcome", "samples"] + [h for c in seed for h in (f"µs at {c}", f"vs seed at {c}")]
    rows = [[m.id, "measured", _samples(m.result)] + [h for c in seed for h in (f"{m.result.median_us(c):.1f}", "-")]]
    ref = m.id
    for a in trace.attempts():
        res = a.evaluate.result if a.evaluate else None
        if res and res.timings:
            by_ctx = {t.ctx: t for t in res.timings}
            cells = [h for c in seed for h in ((f"{by_ctx[c].median_us:.1f}", _ratio(*ratio_interval(
                seed[c], by_ctx[c].samples_us))) if c in by_ctx else ("-", "-"))]
            rows.append([a.proposal.id, outcome_name(a), _samples(res), *cells, _decision(a.decision, ref)])
        if a.outcome == "kept":
            ref = a.proposal.id
    rows[0].append("-")
    return Table(title="Timings per context", head=head + ["decision: vs the best of its time"], rows=rows,
                 note="µs/token: the median of each version's own evaluation. vs seed: median ratio seed/version "
                      "with a 95% bootstrap interval from the two versions' samples (timed apart, not interleaved). "
                      "The decision: its geomean ratio over the contexts, with the lowest and highest interval "
                      "bound of any context, against the best of its time (re-timed interleaved where it says so).")


def _samples(res: EvalResult) -> str:
    counts = [len(t.samples_us) for t in res.timings]
    return str(counts[0]) if len(set(counts)) == 1 else " / ".join(map(str, counts))


def _decision(d, ref: str) -> str:
    if d is None or d.ratio is None:
        return "-"
    how = ", confirmed interleaved" if d.reason.startswith("confirmed interleaved") else ""
    return f"{_ratio(d.ratio, d.ratio_low, d.ratio_high)} vs {ref}{how}"


def failure_table(trace: Trace) -> Table | None:
    rows = [[a.proposal.id, outcome_name(a), a.failure.failure.phase, a.failure.failure.message]
            for a in trace.attempts() if a.failure]
    return Table(title="Why attempts were refused", head=["id", "outcome", "phase", "reason"], rows=rows,
                 note="as recorded: the check's message, the compiler's or the occupancy check's error, the "
                      "decision's ratios per context") if rows else None


def resource_table(trace: Trace) -> Table | None:
    """Registers, local memory, spills, shared memory and launch shape of every build."""
    builds = [(trace.measure.id, "measured", trace.measure.result.build)] if trace.measure else []
    builds += [(a.proposal.id, outcome_name(a), a.build.result) for a in trace.attempts() if a.build]
    rows = [[vid, shown, *_resources(b)] for vid, shown, b in builds if b is not None]
    head = ["id", "outcome", "registers", "local B/thread", "spill B", "static smem B", "dynamic smem B", "threads",
            "blocks/SM (fit)", "grid"]
    return Table(title="Resources per build", head=head, rows=rows,
                 note="spill B: ptxas spill stores + loads; '?' where the trace's builds did not record it. "
                      "blocks/SM: asked for (co-resident by the occupancy API).") if rows else None


def _resources(b: BuildResult) -> list[str]:
    r = b.resources
    if r is None:
        return ["-"] * 8
    spills = str(b.spill_bytes) if "spill_bytes" in b.model_fields_set else "?"
    return [str(r.registers), str(r.local_bytes), spills, str(r.static_smem), str(r.dynamic_smem), str(r.threads),
            f"{r.blocks_per_sm} ({r.blocks_fit_per_sm})", str(r.grid)]


def kept_diffs(trace: Trace) -> list[tuple[str, str]]:
    """(title, unified diff with the knob changes) of every kept version against the parent it was proposed on."""
    out = []
    for a in trace.attempts():
        if a.outcome != "kept":
            continue
        p = a.proposal
        out.append((f"{p.id}{f' ({p.name})' if p.name else ''} against its parent {p.parent_id}",
                    diff_text(_version(trace, p.parent_id), _version(trace, p.id))))
    return out


def _version(trace: Trace, vid: str) -> Version:
    source, knobs = trace.version(vid)
    return Version(vid, Candidate(source=source, knobs=knobs))
