"""Live progress of a session (rich): budget bar, current step, best speedup so far; the final summary."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table


class SessionProgress:
    def __init__(self, console: Console, budget_s: float):
        self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), TimeRemainingColumn(),
                                 TextColumn("{task.fields[best]}"), console=console)
        self.job = self.progress.add_task("budget", total=budget_s, best="")

    def __enter__(self) -> SessionProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def update(self, step: str = "", best=None, budget=None) -> None:
        fields = {}
        if best is not None:
            sp = [t.speedup for t in best.result.timings if t.speedup]
            us = [f"{t.median_us:.0f}" for t in best.result.timings]
            fields["best"] = f"best {best.id}: {'/'.join(us)} µs" + (f" ({min(sp):.0f}x+)" if sp else "")
        self.progress.update(self.job, description=step[:70] or "session",
                             completed=budget.spent() if budget else None, **fields)


def print_summary(console: Console, summary, out: Path) -> None:
    t = Table(title=f"session summary ({summary.reason})")
    for col in ("ctx", "baseline µs", "seed µs", "best µs", "best vs seed", "best vs baseline"):
        t.add_column(col, justify="right")
    for ctx, best in sorted(summary.best_us.items()):
        seed, base = summary.seed_us.get(ctx), summary.baseline_us.get(ctx)
        t.add_row(str(ctx), f"{base:.0f}" if base else "-", f"{seed:.1f}" if seed else "-", f"{best:.1f}",
                  f"{seed / best:.3f}x" if seed else "-", f"{base / best:.1f}x" if base else "-")
    console.print(t)
    failed = ", ".join(f"{k} {v}" for k, v in sorted(summary.failed_by_class.items())) or "none"
    phases = ", ".join(f"{k} {v:.0f}s" for k, v in sorted(summary.seconds_by_phase.items()))
    console.print(f"candidates: {summary.tried} tried, {summary.kept} kept; not kept by class: {failed}")
    console.print(f"time by phase: {phases}; LLM cost ${summary.llm_cost_usd:.2f}")
    console.print(f"best kernel: {out / 'best.cu'} · trace: {out / 'trace.jsonl'} · report: {out / 'report.html'}")
