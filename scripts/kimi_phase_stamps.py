"""Per-phase timeline of one Kimi step from in-kernel %globaltimer stamps, and what happens inside each phase.

The timeline (span, mean block work, barrier wait, bytes, TB/s per phase; sandbox/phases.py says how
each is read from the stamps) is the one `run_agent.py bench --phases` prints: a -DPHASE_STAMPS=1 build,
barrier stamps only, which leave the step's time as it is. The event tables come from a second build,
-DPHASE_STAMPS=2, whose events slow the step (~7% on an H100): read the order of events from them, the
lengths from the timeline; the events build's own timeline is printed last, for the comparison.
A block that leaves a barrier late (it issues the next phase's prefetch between arriving and waiting)
shows in the next span and in the critical block's release column.
Inside each GEMV phase, thread 0 also stamps four events: input staged, first weight chunk landed, a
unit's sums reduced (the last one counts) and all units done. The second table gives their mean
offsets from the block's release and the same offsets for the phase's critical block (the last to
arrive), so the critical path of a phase can be read off event by event. The third table follows a
block's first chunks through the weight ring: when each landed, when every warp had read it, and when
the chunk that refills its slot had been issued (mean block and critical block, every context). In
the attention row the chunks are the block's cache tiles, and "read" and "issued" stand for the
scores and the softmax of that tile done. In the MoE row (gate/up, then down, no barrier between) the
down chunks are numbered on from the block's gate/up chunks; "staged" and "1st chunk" are the gate/up
run's, "computed" and "done" the down run's.
Medians over several steps. With --raw DIR, one more step's stamps of every block (events build) are
saved per context (DIR/stamps_<ctx>.npz: ns rows as the kernel wrote them, EVENT_NAMES, the phase names)
for a look at single blocks, which the medians above cannot give.
Usage: python scripts/kimi_phase_stamps.py [KERNEL.cu] [--ctx 2048 16384] [--raw DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from megakernel_agent.sandbox.candidate import Candidate  # noqa: E402
from megakernel_agent.sandbox.phases import (  # noqa: E402
    CHUNK_EVENTS,
    EVENT_NAMES,
    EVENTS,
    EVENTS_BUILD,
    MAX_STAMP_BLOCKS,
    STAMPED_BUILD,
    stamp_area,
)
from megakernel_agent.sandbox.profile import PROFILE_STEPS, profile_phases  # noqa: E402
from megakernel_agent.sandbox.report import phase_table  # noqa: E402
from megakernel_agent.tasks.kimi_linear.megakernel import build_megakernel  # noqa: E402
from megakernel_agent.tasks.kimi_linear.task import KimiTask  # noqa: E402
from megakernel_agent.traces.results import PhaseTimeline  # noqa: E402

SHOWN_CHUNKS = 6
CHUNK_KEYS = [f"c{k} {e}" for k in range(SHOWN_CHUNKS) for e in CHUNK_EVENTS]


def cell(values: dict[str, float], key: str) -> str:
    return f"{values[key]:.1f}" if key in values else "-"


def event_table(tl: PhaseTimeline) -> Table:
    """The four events of each GEMV phase, mean block and critical block (µs from the block's release)."""
    t = Table(title=f"Events inside GEMV phases @{tl.ctx}, µs from the block's release (median of {tl.steps} steps)")
    t.add_column("phase")
    for name in EVENTS:
        t.add_column(f"mean {name}", justify="right")
    for name in ("released", *EVENTS, "arrived"):
        t.add_column(f"crit {name}", justify="right")
    for r in tl.rows:
        if any(name in r.events for name in EVENTS):
            t.add_row(r.name, *[cell(r.events, n) for n in EVENTS],
                      *[cell(r.critical, n) for n in ("released", *EVENTS, "arrived")])
    return t


def chunk_table(tl: PhaseTimeline) -> Table:
    """The ring's chunk events of each GEMV phase (the attention's cache tiles), mean block and critical
    block (µs from its release)."""
    t = Table(title=f"Weight-ring chunks @{tl.ctx}, µs from the block's release (median of {tl.steps} steps)")
    t.add_column("phase")
    t.add_column("block")
    for key in CHUNK_KEYS:
        t.add_column(key, justify="right")
    for r in tl.rows:
        if CHUNK_KEYS[0] in r.events:
            t.add_row(r.name, "mean", *[cell(r.events, k) for k in CHUNK_KEYS])
            t.add_row("", "crit", *[cell(r.critical, k) for k in CHUNK_KEYS])
    return t


def save_raw(task: KimiTask, model, ctx: int, grid: int, dev: torch.device, path: Path) -> None:
    """One step's stamps of every block, as written (after profile_phases has warmed the model up)."""
    blocks = min(grid, MAX_STAMP_BLOCKS)
    hidden, state = task.make_inputs(0, ctx, dev)
    model.step(hidden, state)
    stamps, events = stamp_area(task.scratch(model))
    stamps.zero_()
    events.zero_()
    model.step(task.make_token(1, dev), task.rewind(state, ctx))
    torch.cuda.synchronize(dev)
    np.savez_compressed(path, stamps=stamps[:, :blocks].cpu().numpy(), events=events[:, :, :blocks].cpu().numpy(),
                        event_names=np.array(EVENT_NAMES), phase_names=np.array(task.phase_names()))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("kernel", nargs="?", default=None)
    ap.add_argument("--ctx", type=int, nargs="+", default=[2048, 16384])
    ap.add_argument("--steps", type=int, default=PROFILE_STEPS)
    ap.add_argument("--raw", type=Path, default=None, help="also save one step's per-block stamps here")
    args = ap.parse_args()
    dev = torch.device("cuda:0")
    task = KimiTask("full")
    source = (ROOT / (args.kernel or task.spec.seed_kernel)).read_text()
    knobs = {k: str(v) for k, v in Candidate(source=source).resolved_knobs().items()}
    reference = task.build_reference(dev, 0)
    grid = torch.cuda.get_device_properties(dev).multi_processor_count * int(knobs.get("BLOCKS_PER_SM", 1))
    models = {name: task.build_candidate(reference, build_megakernel(source, task.cfg, {**knobs, **switches}))
              for name, switches in (("spans", STAMPED_BUILD), ("events", EVENTS_BUILD))}
    timelines = {name: [profile_phases(task, m, ctx, grid, dev, args.steps) for ctx in args.ctx]
                 for name, m in models.items()}
    if args.raw:
        args.raw.mkdir(parents=True, exist_ok=True)
        for ctx in args.ctx:
            save_raw(task, models["events"], ctx, grid, dev, args.raw / f"stamps_{ctx}.npz")
    console = Console(width=260)
    for table, name in ((phase_table, "spans"), (event_table, "events"), (chunk_table, "events")):
        for tl in timelines[name]:
            console.print(table(tl))
    console.print("The events build's own timeline (its events slow the step):")
    for tl in timelines["events"]:
        console.print(phase_table(tl))


if __name__ == "__main__":
    main()
