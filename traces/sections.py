"""The report's tables from a trace: the timeline, every version per context with its verdict's intervals,
why each failure failed, and what each build asked of the GPU. A section is data (title, caption, rows);
traces/report.py writes it as HTML or Markdown."""

from __future__ import annotations

from dataclasses import dataclass

from .loader import Trace
from .render import NOT_FASTER, primary_ctx, shown_outcome, timeline
from .results import BuildResult
from .timings import judgements, of_record, session_baseline


@dataclass
class Table:
    title: str
    caption: str
    head: list[str]
    rows: list[list[str]]


@dataclass
class Blocks:
    """Preformatted texts under headings (diffs)."""

    title: str
    caption: str
    items: list[tuple[str, str]]


def _f(x: float | None, fmt: str) -> str:
    return format(x, fmt) if x is not None else "-"


def timeline_table(trace: Trace) -> Table:
    ctx, base = primary_ctx(trace), session_baseline(trace)
    several = len(trace.start.environment.lanes) > 1
    rows = [[str(r["step"]), r["id"], r["hypothesis"], r["shown"], _f(r["us"], ".1f"),
             _f(r["speedup"], ".1f") + ("x" if r["speedup"] else ""), _f(r["best_us"], ".1f"),
             *([r["gpu"] or "-"] if several else [])] for r in timeline(trace)]
    caption = (f"µs/token at ctx {ctx}: each version's timing of record (a confirmed version's pools its "
               f"re-timings); speedup over the baseline timed with {base.timed_with if base else 'no version'}; "
               f"best µs: the best's figure after this row's decision."
               + (f" The session evaluated on {len(trace.start.environment.lanes)} GPUs: each row's µs are its own "
                  "GPU's, and each decision compared versions on one GPU (the best is timed there first)."
                  if several else ""))
    return Table("Timeline", caption, ["step", "id", "hypothesis", "outcome", "µs/token", "speedup", "best µs",
                                       *(["GPU"] if several else [])], rows)


def per_context(trace: Trace) -> Table:
    """Every timed version: µs/token per context and, where the rule compared it, best/version with a 95%
    interval per context next to the decision's recorded geomean [lowest, highest]."""
    records, judged = of_record(trace), judgements(trace)
    ctxs = sorted({c for t in records.values() for c in t.samples})
    shown = {a.proposal.id: (shown_outcome(a), a.decision) for a in trace.attempts()}
    rows = []
    for vid, t in records.items():
        outcome, d = shown.get(vid, ("measured", None))
        j = judged.get(vid)
        cells = []
        for c in ctxs:
            us = t.median(c)
            r = j.ratios.get(c) if j else None
            cells.append(_f(us, ".1f") + (f" · {r[0]:.3f}x [{r[1]:.3f}, {r[2]:.3f}]" if r else ""))
        samples = str(len(next(iter(t.samples.values()))))
        recorded = f"{d.ratio:.3f}x [{d.ratio_low:.3f}, {d.ratio_high:.3f}]" if d and d.ratio is not None else "-"
        rows.append([vid, outcome, j.against if j else "-", samples + (f" ({t.retimings + 1} timings)" if t.retimings
                     else ""), *cells, recorded])
    rule = next((a.decision.rule for a in trace.attempts() if a.decision is not None), "")
    caption = ("µs/token is the median of the samples; the ratio is the best of the time (judged against) over this "
               "version, with its 95% bootstrap interval, recomputed from the samples the decision used (a "
               f"confirmation adds both sides' interleaved re-timings; where the rule drew by module load, each "
               f"load's samples are resampled as a whole). '{NOT_FASTER}': some interval reaches 1; "
               f"'slower': every interval lies below 1. The rule: {rule or 'none recorded'}.")
    head = ["id", "outcome", "judged against", "samples", *(f"ctx {c}: µs · ratio [95%]" for c in ctxs),
            "decision: geomean [lowest, highest]"]
    return Table("Per context", caption, head, rows)


def failures(trace: Trace) -> Table:
    """Why each attempt failed, in the words recorded (a check's cos/rel-L2, a launch that cannot co-reside),
    and the planner's own errors; a correct version not kept is in the per-context table instead."""
    rows = [[a.proposal.id, a.outcome, a.failure.failure.phase, a.failure.failure.message]
            for a in trace.attempts() if a.failure is not None and shown_outcome(a) not in (NOT_FASTER, "slower")]
    rows += [[e.id, "planner error", "-", e.message] for e in trace.events if e.type == "planner_error"]
    return Table("Failures", "The failure each attempt recorded, word for word.", ["id", "outcome", "phase", "why"],
                 rows)


def _spills(b: BuildResult) -> str:
    """Spill bytes, or "-" where the trace predates their recording (the field's default is not a measurement)."""
    return str(b.spill_bytes) if "spill_bytes" in b.model_fields_set else "-"


def resources(trace: Trace) -> Table:
    """Registers, spills, shared memory and occupancy of every version that built."""
    builds = [(trace.measure.id, trace.measure.result.build)] if trace.measure else []
    builds += [(a.proposal.id, a.build.result) for a in trace.attempts() if a.build is not None]
    outcome = {a.proposal.id: shown_outcome(a) for a in trace.attempts()}
    rows = [[vid, outcome.get(vid, "measured"), str(r.registers), _spills(b), str(r.local_bytes),
             str(r.static_smem), str(r.dynamic_smem), str(r.threads), f"{r.blocks_per_sm} ({r.blocks_fit_per_sm})",
             str(r.grid)] for vid, b in builds if b is not None and (r := b.resources) is not None]
    head = ["id", "outcome", "registers", "spills (B)", "local (B/thread)", "static smem (B)", "dynamic smem (B)",
            "threads", "blocks/SM (fit)", "grid"]
    return Table("Resources", "From each build: ptxas's registers and spill stores + loads, shared memory per block, "
                 "and blocks per SM asked for (and that fit, by the occupancy API).", head, rows)
