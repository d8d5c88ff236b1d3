"""Re-execute the versions a trace recorded, on this GPU, and report recorded vs now."""

from __future__ import annotations

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from megakernel_agent.sandbox.candidate import Candidate
from megakernel_agent.sandbox.pool import Evaluator
from megakernel_agent.sandbox.stats import verdict
from megakernel_agent.traces.loader import Trace
from megakernel_agent.traces.results import EvalResult


def versions_of(trace: Trace, kept_only: bool) -> list[tuple[str, EvalResult | None]]:
    out = []
    if trace.measure:
        out.append((trace.measure.id, trace.measure.result))
    for a in trace.attempts():
        if not kept_only or a.outcome == "kept":
            out.append((a.proposal.id, a.evaluate.result if a.evaluate else None))
    return out


def reexecute(trace: Trace, ev: Evaluator, kept_only: bool, console: Console) -> list[dict]:
    rows = []
    recorded_gpu = trace.start.environment.device.name if trace.start.environment.device else "unknown"
    todo = versions_of(trace, kept_only)
    with Progress(console=console, transient=True) as bar:
        job = bar.add_task("re-executing", total=len(todo))
        for vid, recorded in todo:
            source, knobs = trace.version(vid.split("@")[0])
            now = ev.evaluate(Candidate(source=source, knobs=knobs))
            bar.advance(job)
            same_gpu = ev.device is not None and ev.device.name == recorded_gpu
            rec_fail = recorded.failure.cls.value if recorded and recorded.failure else "pass"
            now_fail = now.failure.cls.value if now.failure else "pass"
            ctxs = sorted({t.ctx for t in (recorded.timings if recorded else [])} | {t.ctx for t in now.timings})
            for ctx in ctxs or [None]:
                rt = next((t for t in recorded.timings if t.ctx == ctx), None) if recorded else None
                nt = next((t for t in now.timings if t.ctx == ctx), None)
                row = {"id": vid, "ctx": ctx, "recorded": rec_fail, "now": now_fail,
                       "recorded_us": rt.median_us if rt else None, "now_us": nt.median_us if nt else None,
                       "why": now.failure.message if now.failure else ""}
                if rt and nt:
                    word, (r, lo, hi) = verdict(rt.samples_us, nt.samples_us, min_gain=0.02)
                    row["drift"] = ("other GPU" if not same_gpu else
                                    "within noise" if word == "within noise" else f"drift: now {word} ({r:.3f}x)")
                rows.append(row)
    return rows


def print_reexecute(trace: Trace, rows: list[dict], console: Console, this_gpu: str | None) -> None:
    rec = trace.start.environment.device
    if rec and this_gpu and rec.name != this_gpu:
        console.print(f"[yellow]recorded on {rec.name}, re-executed on {this_gpu}: verdicts compare, timings do not[/]")
    t = Table(title="recorded vs now")
    for col in ("id", "ctx", "recorded", "now", "recorded µs", "now µs", "drift"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["id"], str(r["ctx"]), r["recorded"], r["now"],
                  f"{r['recorded_us']:.1f}" if r["recorded_us"] else "-", f"{r['now_us']:.1f}" if r["now_us"] else "-",
                  r.get("drift", "-"))
    console.print(t)
    for vid, why in dict.fromkeys((r["id"], r["why"]) for r in rows if r.get("why")):
        console.print(f"{vid} now fails: {why}", markup=False)
