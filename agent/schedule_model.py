"""`model`: the seed's discrete-event schedule model (tasks/kimi_linear/step_model.py) against a stamped phase
timeline, its predicted effect of knob moves, and of the architecture steps of issue 28, before any GPU time."""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from megakernel_agent.tasks.kimi_linear.config import KimiConfig
from megakernel_agent.tasks.kimi_linear.step_model import (
    STAMPED_KNOBS,
    WHAT_IFS,
    MachineModel,
    StepEstimate,
    machine_from,
    simulate,
)
from megakernel_agent.traces.loader import load as load_trace
from megakernel_agent.traces.results import EvalResult, PhaseTimeline
from megakernel_agent.traces.schema import Evaluate

from .errors import BadInput

ROOT = Path(__file__).resolve().parent.parent
# The seed's own barrier stamps on the H200 (`bench --phases --json`, e10b25d), at 2K unless --ctx says 16384.
DEFAULT_TIMELINE = ROOT / "traces/examples/kimi-accum/phases-h200.json"
DEFAULT_CTX = 2048


def machine_with(settings: list[tuple[str, str]]) -> MachineModel:
    """The default machine with FIELD=VALUE settings, validated (a bad field or value is BadInput)."""
    try:
        return machine_from(dict(settings))
    except ValueError as e:
        raise BadInput(f"--set {e}") from None


def stamped_timeline(ref: str, ctx: int | None) -> PhaseTimeline:
    """A phase timeline at `ctx` (its only one when not given): of evaluation ID in TRACE#ID, or of the result
    `bench --phases --json` wrote to a file."""
    path, sep, eid = ref.rpartition("#")
    if not sep:
        path = ref
    if not Path(path).is_file():
        raise BadInput(f"--timeline: no file at {path}")
    if sep:
        found = [e for e in load_trace(Path(path)).events if isinstance(e, Evaluate) and e.id == eid]
        timelines, what = [t for e in found for t in e.result.phases], f"{path} has no evaluation {eid!r}"
    else:
        try:
            timelines, what = EvalResult.model_validate_json(Path(path).read_text()).phases, f"{path}"
        except ValidationError:
            raise BadInput(f"--timeline {ref!r}: expected TRACE#EVALUATION_ID or the JSON of `bench --phases "
                           "--json`") from None
    if not timelines:
        raise BadInput(f"--timeline: {what} with a phase timeline")
    if ctx is None:
        if len(timelines) > 1:
            raise BadInput(f"--timeline: it profiled ctx {[t.ctx for t in timelines]}; pick one with --ctx")
        return timelines[0]
    for t in timelines:
        if t.ctx == ctx:
            return t
    raise BadInput(f"--timeline: it profiled ctx {[t.ctx for t in timelines]}, not {ctx}")


def print_estimate(est: StepEstimate, timeline: PhaseTimeline, console: Console) -> None:
    """Per phase: the model's span and mean block against the stamps'; phases taken from the stamps say so."""
    stamped = {r.name: r for r in timeline.rows}
    t = Table(title=f"Schedule model vs stamps (ctx {timeline.ctx}, grid {est.grid}), µs")
    for col in ("phase", "model span", "stamped span", "model mean", "stamped mean", "critical block"):
        t.add_column(col, justify="left" if col == "phase" else "right")
    for p in est.phases:
        row = stamped.get(p.name)
        t.add_row(p.name, f"{p.span_us:.2f}" if p.simulated else "(stamped)",
                  f"{row.span_us:.2f}" if row else "-", f"{p.mean_us:.2f}" if p.simulated else "",
                  f"{row.mean_us:.2f}" if row else "-", str(p.critical_block) if p.simulated else "")
    t.add_row("kernel (spans + waits)", f"{est.kernel_us:.1f}", f"{timeline.kernel_us:.1f}", "", "", "")
    console.print(t)


def print_moves(rows: list[tuple[str, float]], base_us: float, console: Console, title: str) -> None:
    t = Table(title=f"{title} (model; base {base_us:.1f} µs)")
    t.add_column("change")
    t.add_column("Δ kernel µs", justify="right")
    for label, us in rows:
        t.add_row(label, f"{us - base_us:+.1f}")
    console.print(t)


def knob_moves(cfg: KimiConfig, knobs: dict[str, int], declared: dict[str, list[int]], machine: MachineModel,
               fixed: dict[str, float]) -> list[tuple[str, float]]:
    """Every one-knob move from `knobs` over the declared values, modelled. The launch-shape knobs and the
    attention's split are left out (they change the phases the model takes from the stamps)."""
    rows = []
    for name, values in declared.items():
        if name in STAMPED_KNOBS:
            continue
        for v in values:
            if v != knobs[name]:
                est = simulate(cfg, {**knobs, name: v}, machine, fixed)
                rows.append((f"{name} {knobs[name]} → {v}", est.kernel_us))
    return rows


def what_ifs(cfg: KimiConfig, knobs: dict[str, int], machine: MachineModel,
             fixed: dict[str, float]) -> list[tuple[str, float]]:
    return [(w.label, simulate(cfg, knobs, w.applied_to(machine), fixed).kernel_us)
            for w in WHAT_IFS]
