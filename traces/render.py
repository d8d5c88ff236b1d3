"""The timeline of a trace as a table: step, hypothesis, outcome, µs/token, speedup, best so far.

Every figure is a version's timing of record and every speedup divides the session's one baseline
(traces/timings.py), so the console, the report and the session's closing line show the same numbers.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from .loader import Attempt, Trace
from .timings import of_record, session_baseline

NOT_FASTER = "not faster beyond noise"


def primary_ctx(trace: Trace) -> int:
    m = trace.measure
    if m and m.result.timings:
        return max(t.ctx for t in m.result.timings)
    return max(trace.start.task_spec.get("context_lengths", [0]))


def shown_outcome(a: Attempt) -> str:
    """The outcome as a reader should take it: a correct version the rule did not keep is "slower" only when
    its ratio interval lies below 1 at every context, else it is not faster beyond noise (the recorded class
    is "slower" either way)."""
    if a.outcome != "slower":
        return a.outcome
    d = a.decision
    return "slower" if d is not None and d.ratio_high is not None and d.ratio_high < 1.0 else NOT_FASTER


def timeline(trace: Trace) -> list[dict]:
    """One row per attempt (after the starting measure as step 0): its µs/token at the primary context, its
    speedup over the session's baseline, and the best so far; `outcome` is the recorded class, `shown` the
    reader's (shown_outcome)."""
    ctx, records, base = primary_ctx(trace), of_record(trace), session_baseline(trace)
    m = trace.measure
    best_us = records[m.id].median(ctx) if m and m.id in records else None

    def row(step: int, vid: str, hypothesis: str, outcome: str, shown: str, best: float | None, gpu: str) -> dict:
        us = records[vid].median(ctx) if vid in records else None
        return {"step": step, "id": vid, "hypothesis": hypothesis, "outcome": outcome, "shown": shown, "us": us,
                "speedup": base.speedup(ctx, us) if base else None, "best_us": best, "gpu": gpu}

    rows = [row(0, m.id, "starting kernel", "measured", "measured", best_us, m.gpu)] if m else []
    for i, a in enumerate(trace.attempts(), 1):
        if a.decision is not None and a.decision.best_id in records:   # the best this decision left
            best_us = records[a.decision.best_id].median(ctx)
        rows.append(row(i, a.proposal.id, a.proposal.hypothesis, a.outcome, shown_outcome(a), best_us,
                        a.decision.gpu if a.decision else "") | {"at": a.proposal.at})
    return rows


def render(trace: Trace, console: Console | None = None, this_gpu: str | None = None) -> None:
    console = console or Console()
    s = trace.start
    dev = s.environment.device
    console.print(f"[bold]session {s.session_id}[/] · task {s.task} ({s.size}) · planner {s.planner} · "
                  f"budget {s.budget_s:.0f}s · recorded on {dev.name if dev else 'unknown GPU'} · commit "
                  f"{s.environment.project_commit[:10]}")
    if this_gpu and dev and this_gpu != dev.name:
        console.print(f"[yellow]recorded on {dev.name}; this machine has {this_gpu}: timings are not comparable[/]")
    lanes = s.environment.lanes
    if lanes or s.inflight > 1:
        console.print(f"{max(1, len(lanes))} GPU lane(s), up to {s.inflight} in flight: each row's µs are its own "
                      "GPU's (the GPU column); every decision compared versions on one GPU")
    for w in trace.warnings:
        console.print(f"[yellow]warning: {w}[/]")
    ctx = primary_ctx(trace)
    t = Table(title=f"timeline (µs/token at ctx {ctx})")
    columns = [("#", "right"), ("id", "left"), ("hypothesis", "left"), ("outcome", "left"), ("µs/tok", "right"),
               ("speedup", "right"), ("best µs", "right")] + ([("GPU", "left")] if len(lanes) > 1 else [])
    for col, just in columns:
        if col == "hypothesis":
            t.add_column(col, justify=just, overflow="ellipsis", no_wrap=True, max_width=28)
        else:
            t.add_column(col, justify=just, no_wrap=True, min_width={"id": 4, "outcome": 8}.get(col, len(col)))
    colors = {"kept": "green", "measured": "cyan", NOT_FASTER: "yellow", "slower": "yellow"}
    for r in timeline(trace):
        color = colors.get(r["shown"], "red")
        t.add_row(str(r["step"]), r["id"], r["hypothesis"][:90], f"[{color}]{r['shown']}[/]",
                  f"{r['us']:.1f}" if r["us"] else "-", f"{r['speedup']:.1f}x" if r["speedup"] else "-",
                  f"{r['best_us']:.1f}" if r["best_us"] else "-", *([r["gpu"][-12:] or "-"] if len(lanes) > 1 else []))
    console.print(t)
    end = next((e for e in reversed(trace.events) if e.type == "session_end"), None)
    if end:
        console.print(f"ended ({end.reason}); best = {end.best_id}; {end.summary.get('line', '')}")
    else:
        console.print("[yellow]no session_end: the session was interrupted (resume with `run --resume`)[/]")
