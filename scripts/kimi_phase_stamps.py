"""Per-phase timeline of one Kimi step from in-kernel %globaltimer stamps (built with -DPHASE_STAMPS=1).

Each block stamps when it arrives at a grid barrier and when it leaves it. For phase i:
span = last arrival at barrier i - first release from barrier i-1 (the phase's critical path),
mean = the average block's own work time, wait = first release from barrier i - last arrival at it
(the synchronisation itself). Spans and waits add up to the kernel time; a block that leaves a
barrier late (it issues the next phase's prefetch between arriving and waiting) shows in the next
span and in the critical block's release column.
Inside each GEMV phase, thread 0 also stamps four events: input staged, first weight chunk landed,
a unit's sums reduced (the last one counts) and all units done. The second table gives their mean
offsets from the block's release and the same offsets for the phase's critical block (the last to
arrive), so the critical path of a phase can be read off event by event. The third table follows a
block's first chunks through the weight ring: when each landed, when every warp had read it, and when
the chunk that refills its slot had been issued (mean block and critical block, every context). In
the attention row the chunks are the block's cache tiles, and "read" and "issued" stand for the
scores and the softmax of that tile done. In the MoE row (gate/up, then down, no barrier between) the
down chunks are numbered on from the block's gate/up chunks; "staged" and "1st chunk" are the gate/up
run's, "computed" and "done" the down run's.
Medians over several steps. Usage: python scripts/kimi_phase_stamps.py [KERNEL.cu] [--ctx 2048 16384]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from sandbox.candidate import Candidate  # noqa: E402
from tasks.kimi_linear.megakernel import build_megakernel  # noqa: E402
from tasks.kimi_linear.task import KimiTask  # noqa: E402

MAX_STAMPS, MAX_STAMP_BLOCKS, STAMPED_CHUNKS = 128, 1024, 6   # as in the kernel
EVENTS = ["staged", "1st chunk", "computed", "done"]
CHUNK_EVENTS = ["landed", "read", "issued"]
N_EVENTS = len(EVENTS) + len(CHUNK_EVENTS) * STAMPED_CHUNKS
SHOWN_CHUNKS = 6
STAMP_WORDS = MAX_STAMPS * MAX_STAMP_BLOCKS
EVENT_WORDS = (MAX_STAMPS // 2) * N_EVENTS * MAX_STAMP_BLOCKS
# "g/u+down": one phase (down units start on their gate/up tiles); see the docstring for its events
KDA_PHASES = ["kda project", "kda delta", "kda o_proj", "router+windows", "g/u+down"]
MLA_PHASES = ["mla project", "absorb q", "attention", "merge+absorb v", "mla o_proj", "router", "g/u+down"]


def phase_names(pattern: tuple[str, ...]) -> list[str]:
    names = []
    for i, kind in enumerate(pattern):
        names += [f"L{i} {n}" for n in (KDA_PHASES if kind == "K" else MLA_PHASES)]
    return names


def step_spans(stamps: torch.Tensor, blocks: int, phases: int) -> list[tuple[float, float, float]]:
    """(span, mean block work, barrier wait) in µs per phase from one step's stamps."""
    t = stamps[: 2 * phases, :blocks].double() / 1000.0     # rows: start, arrive0, release0, ..., end
    rows = []
    for i in range(phases):
        begin, arrive = t[2 * i], t[2 * i + 1]
        span = (arrive.max() - begin.min()).item()
        mean = (arrive - begin).mean().item()
        wait = (t[2 * i + 2].min() - arrive.max()).item() if 2 * i + 2 < 2 * phases else 0.0
        rows.append((span, mean, wait))
    return rows


def step_events(stamps: torch.Tensor, events: torch.Tensor, blocks: int, phases: int,
                which: range) -> list[list[float]]:
    """Per phase, for the events in `which`: mean offsets (µs from each block's release), then the
    critical block's release offset (from the phase's first release), its event offsets and its
    arrival. NaN where absent."""
    t = stamps[: 2 * phases, :blocks].double() / 1000.0
    ev = events[:phases, :, :blocks].double() / 1000.0
    rows = []
    for i in range(phases):
        begin, arrive = t[2 * i], t[2 * i + 1]
        crit = int(arrive.argmax())
        row = []
        for e in which:
            have = ev[i, e] > 0
            row.append((ev[i, e][have] - begin[have]).mean().item() if have.any() else float("nan"))
        row.append((begin[crit] - begin.min()).item())
        for e in which:
            row.append((ev[i, e, crit] - begin[crit]).item() if ev[i, e, crit] > 0 else float("nan"))
        row.append((arrive[crit] - begin[crit]).item())
        rows.append(row)
    return rows


def nan_median(values: list[float]) -> float:
    """Median of the values that are not NaN (NaN if none are)."""
    have = [v for v in values if v == v]
    return statistics.median(have) if have else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("kernel", nargs="?", default=None)
    ap.add_argument("--ctx", type=int, nargs="+", default=[2048, 16384])
    ap.add_argument("--steps", type=int, default=7)
    args = ap.parse_args()
    dev = torch.device("cuda:0")
    task = KimiTask("full")
    source = (ROOT / (args.kernel or task.spec.seed_kernel)).read_text()
    knobs = {k: str(v) for k, v in Candidate(source=source).resolved_knobs().items()}
    ref = task.build_reference(dev, 0)
    model = task.build_candidate(ref, build_megakernel(source, task.cfg, {**knobs, "PHASE_STAMPS": "1"}))
    names = phase_names(task.cfg.pattern)
    blocks = torch.cuda.get_device_properties(dev).multi_processor_count * int(knobs.get("BLOCKS_PER_SM", 1))
    per_ctx: dict[int, list[list[tuple[float, float, float]]]] = {}
    per_ctx_events: dict[int, list[list[list[float]]]] = {}
    model.step(*task.make_inputs(0, args.ctx[0], dev))   # the binding allocates its scratch on first use
    tail = model._scratch[-8 * (STAMP_WORDS + EVENT_WORDS):].view(torch.int64)
    stamps, events = tail[:STAMP_WORDS].view(MAX_STAMPS, MAX_STAMP_BLOCKS), tail[STAMP_WORDS:]
    events = events.view(MAX_STAMPS // 2, N_EVENTS, MAX_STAMP_BLOCKS)
    for ctx in args.ctx:
        hidden, state = task.make_inputs(0, ctx, dev)
        runs, event_runs = [], []
        for i in range(args.steps + 2):
            events.zero_()
            hidden, state = model.step(hidden, task.rewind(state, ctx))
            torch.cuda.synchronize(dev)
            if i >= 2:
                runs.append(step_spans(stamps.cpu(), blocks, len(names)))
                event_runs.append(step_events(stamps.cpu(), events.cpu(), blocks, len(names), range(N_EVENTS)))
        per_ctx[ctx] = runs
        per_ctx_events[ctx] = event_runs
    t = Table(title=f"Per-phase timeline, µs (median of {args.steps} steps; {blocks} blocks)")
    t.add_column("phase")
    for ctx in args.ctx:
        for col in ("span", "mean", "barrier"):
            t.add_column(f"{col} @{ctx}", justify="right")
    totals = {ctx: [0.0, 0.0] for ctx in args.ctx}
    for i, name in enumerate(names):
        cells = []
        for ctx in args.ctx:
            med = [statistics.median(r[i][j] for r in per_ctx[ctx]) for j in range(3)]
            totals[ctx][0] += med[0]
            totals[ctx][1] += med[2]
            cells += [f"{v:.1f}" for v in med]
        t.add_row(name, *cells)
    t.add_row("total", *[c for ctx in args.ctx for c in (f"{totals[ctx][0]:.1f}", "", f"{totals[ctx][1]:.1f}")])
    console = Console(width=260)
    console.print(t)
    for ctx in args.ctx:
        e = Table(title=f"Events inside GEMV phases @{ctx}, µs from the block's release (median of {args.steps} steps)")
        e.add_column("phase")
        for name in EVENTS:
            e.add_column(f"mean {name}", justify="right")
        e.add_column("crit released", justify="right")
        for name in EVENTS + ["arrived"]:
            e.add_column(f"crit {name}", justify="right")
        for i, name in enumerate(names):
            vals = [nan_median([r[i][k] for r in per_ctx_events[ctx]]) for k in range(2 * N_EVENTS + 2)]
            if all(v != v for v in vals[: len(EVENTS)]):
                continue
            shown = vals[: len(EVENTS)] + vals[N_EVENTS : N_EVENTS + 1 + len(EVENTS)] + vals[-1:]
            e.add_row(name, *["-" if v != v else f"{v:.1f}" for v in shown])
        console.print(e)
    for ctx in args.ctx:
        print_chunks(names, per_ctx_events[ctx], ctx, console)


def print_chunks(names: list[str], event_runs: list[list[list[float]]], ctx: int, console: Console) -> None:
    """The ring's chunk events of each GEMV phase (the attention's cache tiles), mean block and critical
    block (µs from its release)."""
    c = Table(title=f"Weight-ring chunks @{ctx}, µs from the block's release (median of {len(event_runs)} steps)")
    c.add_column("phase")
    c.add_column("block")
    for k in range(SHOWN_CHUNKS):
        for name in CHUNK_EVENTS:
            c.add_column(f"c{k} {name}", justify="right")
    first = len(EVENTS)
    for i, name in enumerate(names):
        vals = [nan_median([r[i][k] for r in event_runs]) for k in range(2 * N_EVENTS + 2)]
        if vals[first] != vals[first]:
            continue
        for who, base in (("mean", 0), ("crit", N_EVENTS + 1)):
            cells = vals[base + first : base + first + len(CHUNK_EVENTS) * SHOWN_CHUNKS]
            c.add_row(name if who == "mean" else "", who, *["-" if v != v else f"{v:.1f}" for v in cells])
    console.print(c)


if __name__ == "__main__":
    main()
