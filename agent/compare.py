"""Compare kernel versions: the same correctness protocol for each, then interleaved timing (A B C, B C A, ...)
so that drift cancels, and each version's speedup over the first with a bootstrap interval."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from megakernel_agent.sandbox.candidate import Candidate
from megakernel_agent.sandbox.pool import Evaluator
from megakernel_agent.sandbox.report import check_summary
from megakernel_agent.sandbox.stats import grouped_ratio_interval, verdict_of
from megakernel_agent.tasks.base import Task
from megakernel_agent.traces.diffs import diff_text
from megakernel_agent.traces.results import by_load

from .errors import BadInput
from .preflight import check_kernel, load_trace, parse_knob, read_kernel

MIN_ROUNDS = 2   # rounds of distinct loads a side: one load's interval cannot see the load's own bias


@dataclass
class Version:
    label: str
    candidate: Candidate
    check: str = ""
    ok: bool = False
    loaded: dict[int, list[tuple[str, float]]] = field(default_factory=dict)   # per context, (load, sample)

    @property
    def samples(self) -> dict[int, list[float]]:
        return {ctx: [x for _, x in pairs] for ctx, pairs in self.loaded.items()}

    @property
    def rounds(self) -> dict[int, list[list[float]]]:
        """Per context, the samples grouped by module load: one group per round, unless rounds shared a load
        (a build timed more often than the worker keeps loads of it)."""
        return {ctx: by_load(pairs) for ctx, pairs in self.loaded.items()}


def parse_version(spec: str, task: Task) -> Version:
    """`file.cu`, `file.cu:K=V,K2=V2` (a knob set of a file) or `trace.jsonl#ID`, of `task`; a file version is
    checked (knobs, source rules, a compile on this CPU) before any GPU work."""
    if "#" in spec:
        path, vid = spec.rsplit("#", 1)
        trace = load_trace(Path(path))
        if trace.start.task != task.spec.name:
            raise BadInput(f"{spec}: the trace is of task {trace.start.task}, not {task.spec.name}")
        source, knobs = trace.version(vid)
        return Version(spec, Candidate(source=source, knobs=knobs))
    path, _, knob_text = spec.partition(":")
    knobs = dict(parse_knob(item) for item in knob_text.split(",") if item)
    cand = Candidate(source=read_kernel(Path(path)), knobs=knobs)
    check_kernel(task, cand, spec, compile=True)
    return Version(spec, cand)


def interleave(ev, versions: list[Version], rounds: int, samples: int, contexts: list[int] | None = None,
               on_result=None, deadline: float | None = None) -> None:
    """Time the versions in turn, round after round, keeping each one's samples per context and round; each
    round starts one live version further on (A B C, B C A, ...), so no version always runs first after another
    or always takes the same turn among a worker's module loads. A version whose timing fails (its timed
    samples are verified too) drops out with the reason; no evaluation outlives `deadline` (time.monotonic())."""
    for r in range(rounds):
        live = [v for v in versions if v.ok]
        for v in live[r % len(live):] + live[: r % len(live)] if live else []:
            res = ev.evaluate(v.candidate, check=False, baseline=False, samples=samples, contexts=contexts,
                              deadline=deadline)
            if not res.ok:
                v.ok, v.check = False, f"timing failed: {res.failure.cls.value}: {res.failure.message}"
            for t in res.timings:
                v.loaded.setdefault(t.ctx, []).extend(res.loaded_samples(t.ctx, f"{v.label} round {r}"))
            if on_result is not None:
                on_result(v, res)


def speedups(versions: list[Version]) -> list[dict]:
    """Per version and context: median µs, samples, and vs the first version the ratio, interval (resampling
    loads, then samples: a round's samples share one module load) and verdict."""
    rows = []
    first = versions[0]
    for v in versions:
        for ctx, xs in sorted(v.samples.items()):
            row = {"label": v.label, "ctx": ctx, "median_us": sorted(xs)[len(xs) // 2], "n": len(xs)}
            if v is not first and ctx in first.rounds and v.ok and first.ok:
                a, b = first.rounds[ctx], v.rounds[ctx]
                r, lo, hi = grouped_ratio_interval(a, b)
                judged = min(len(a), len(b)) >= MIN_ROUNDS
                row |= {"ratio": r, "low": lo, "high": hi,
                        "verdict": verdict_of((r, lo, hi)) if judged else f"no verdict: < {MIN_ROUNDS} loads"}
            rows.append(row)
    return rows


def run_compare(versions: list[Version], ev: Evaluator, rounds: int, samples: int, console: Console,
                contexts: list[int] | None = None) -> list[dict]:
    for v in versions:
        res = ev.evaluate(v.candidate, time=False)
        v.ok, v.check = res.ok, check_summary(res) if res.check else f"{res.failure.cls.value}: {res.failure.message}"
    live = [v for v in versions if v.ok]
    with Progress(console=console, transient=True) as bar:
        job = bar.add_task("interleaved timing", total=rounds * len(live))
        interleave(ev, live, rounds, samples, contexts, on_result=lambda *_: bar.advance(job))
    return speedups(versions)


def print_compare(versions: list[Version], rows: list[dict], console: Console, show_diff: bool) -> None:
    for v in versions:
        console.print(f"[bold]{v.label}[/]: {v.check}")
    t = Table(title=f"interleaved timing, speedup vs {versions[0].label} "
                    "(95% interval, module loads then samples resampled)")
    for col in ("version", "ctx", "µs/token", "samples", "speedup", "interval", "verdict"):
        t.add_column(col, justify="right" if col not in ("version", "verdict") else "left")
    for r in rows:
        t.add_row(r["label"], str(r["ctx"]), f"{r['median_us']:.1f}", str(r["n"]),
                  f"{r['ratio']:.3f}x" if "ratio" in r else "-",
                  f"[{r['low']:.3f}, {r['high']:.3f}]" if "ratio" in r else "-", r.get("verdict", "reference"))
    console.print(t)
    if show_diff:
        for v in versions[1:]:
            console.print(f"[bold]diff {versions[0].label} -> {v.label}[/]")
            console.print(diff_text(versions[0].label, versions[0].candidate, v.label, v.candidate), markup=False,
                          highlight=False)
