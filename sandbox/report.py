"""Render an EvalResult for people (rich tables) — used by `bench` and `compare`."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from megakernel_agent.traces.results import STAMP_COST, EvalResult, PhaseTimeline


def check_summary(res: EvalResult) -> str:
    if res.check is None:
        return "not run"
    if res.check.passed:
        return f"pass ({len(res.check.cases)} cases, seeds {res.check.seeds})"
    return f"FAIL: {res.check.first_failure}"


def print_eval(res: EvalResult, console: Console | None = None, title: str = "") -> None:
    console = console or Console()
    if res.device:
        d = res.device
        console.print(f"[bold]{d.name}[/] · {d.sms} SMs · copy {d.copy_tbs:.2f} TB/s · driver {d.driver} · "
                      f"CUDA {d.cuda} · torch {d.torch} · cupy {d.cupy}")
    b = res.build
    if b and b.resources:
        r = b.resources
        console.print(f"build {'(cached) ' if b.cached else ''}{b.seconds:.1f}s · {r.registers} regs · "
                      f"local {r.local_bytes} B · smem {r.static_smem}+{r.dynamic_smem} B · {r.threads} threads × "
                      f"{r.blocks_per_sm}/SM (fit {r.blocks_fit_per_sm}) = grid {r.grid} · knobs {res.knobs}")
    console.print(f"check: {check_summary(res)}")
    if res.launches:
        console.print(f"launches per step: {res.launches.kernels} ({', '.join(res.launches.names)})")
    if res.timings:
        t = Table(title=title or f"{res.task} ({res.size})")
        for col in ("ctx", "µs/token", "spread", "tok/s", "baseline µs", "speedup", "TB/s", "roofline", "host µs"):
            t.add_column(col, justify="right")
        for tm in res.timings:
            t.add_row(str(tm.ctx), f"{tm.median_us:.1f}", f"{tm.spread:.1%}", f"{tm.tok_s:,.0f}",
                      f"{tm.baseline_median_us:.1f}" if tm.baseline_median_us else "-",
                      f"{tm.speedup:.1f}x" if tm.speedup else "-", f"{tm.achieved_tbs:.2f}", f"{tm.roofline:.1%}",
                      f"{tm.host_us:.1f}")
        console.print(t)
    for timeline in res.phases:
        console.print(phase_table(timeline))
    if res.failure:
        f = res.failure
        console.print(f"[red]{f.cls.value} failure in {f.phase}[/]: {f.message}")
    console.print("phase seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in res.phase_seconds.items()))


def phase_table(tl: PhaseTimeline) -> Table:
    """One context's phase timeline: per phase its critical span, mean block work, barrier wait, bytes, TB/s."""
    t = Table(title=f"phase timeline at ctx {tl.ctx}: kernel {tl.kernel_us:.1f} µs",
              caption=f"medians of {tl.steps} {tl.steps_kind} steps, {tl.blocks} blocks, of a stamped build: "
                      f"{STAMP_COST}")
    t.add_column("phase")
    for col in ("span µs", "mean µs", "wait µs", "MB", "TB/s"):
        t.add_column(col, justify="right")
    for r in tl.rows:
        t.add_row(r.name, f"{r.span_us:.1f}", f"{r.mean_us:.1f}", f"{r.wait_us:.1f}", f"{r.bytes / 1e6:.2f}",
                  f"{r.tbs:.2f}")
    spans, waits, nbytes = (sum(getattr(r, k) for r in tl.rows) for k in ("span_us", "wait_us", "bytes"))
    t.add_row("total", f"{spans:.1f}", "", f"{waits:.1f}", f"{nbytes / 1e6:.2f}",
              f"{nbytes / (tl.kernel_us * 1e-6) / 1e12:.2f}" if tl.kernel_us > 0 else "-", style="bold")
    return t
