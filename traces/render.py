"""The timeline of a trace as a table: step, hypothesis, outcome, µs/token, speedup, kept, best so far."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from .loader import Trace
from .results import EvalResult


def primary_ctx(trace: Trace) -> int:
    m = trace.measure
    if m and m.result.timings:
        return max(t.ctx for t in m.result.timings)
    return max(trace.start.task_spec.get("context_lengths", [0]))


def _us(res: EvalResult | None, ctx: int) -> float | None:
    return res.median_us(ctx) if res else None


def timeline(trace: Trace) -> list[dict]:
    """One row per attempt (plus the starting measure), with the running best."""
    ctx = primary_ctx(trace)
    rows = []
    m = trace.measure
    base_us = None
    best_us = None
    if m:
        t = next((t for t in m.result.timings if t.ctx == ctx), None)
        base_us = t.baseline_median_us if t else None
        best_us = _us(m.result, ctx)
        rows.append({"step": 0, "id": m.id, "hypothesis": "starting kernel", "outcome": "measured",
                     "us": best_us, "speedup": base_us / best_us if base_us and best_us else None, "best_us": best_us})
    for i, a in enumerate(trace.attempts(), 1):
        us = _us(a.evaluate.result if a.evaluate else None, ctx)
        if a.outcome == "kept" and us is not None:
            best_us = us
        rows.append({"step": i, "id": a.proposal.id, "hypothesis": a.proposal.hypothesis, "outcome": a.outcome,
                     "us": us, "speedup": base_us / us if base_us and us else None, "best_us": best_us,
                     "at": a.proposal.at})
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
    for w in trace.warnings:
        console.print(f"[yellow]warning: {w}[/]")
    ctx = primary_ctx(trace)
    t = Table(title=f"timeline (µs/token at ctx {ctx})")
    for col, just in (("#", "right"), ("id", "left"), ("hypothesis", "left"), ("outcome", "left"),
                      ("µs/tok", "right"), ("speedup", "right"), ("best µs", "right")):
        if col == "hypothesis":
            t.add_column(col, justify=just, overflow="ellipsis", no_wrap=True, max_width=28)
        else:
            t.add_column(col, justify=just, no_wrap=True, min_width={"id": 4, "outcome": 8}.get(col, len(col)))
    colors = {"kept": "green", "measured": "cyan", "reverted": "yellow", "slower": "yellow"}
    for r in timeline(trace):
        color = colors.get(r["outcome"], "red")
        t.add_row(str(r["step"]), r["id"], r["hypothesis"][:90], f"[{color}]{r['outcome']}[/]",
                  f"{r['us']:.1f}" if r["us"] else "-", f"{r['speedup']:.1f}x" if r["speedup"] else "-",
                  f"{r['best_us']:.1f}" if r["best_us"] else "-")
    console.print(t)
    end = next((e for e in reversed(trace.events) if e.type == "session_end"), None)
    if end:
        console.print(f"ended ({end.reason}); best = {end.best_id}; {end.summary.get('line', '')}")
    else:
        console.print("[yellow]no session_end: the session was interrupted (resume with `run --resume`)[/]")
