"""Phase stamps of a timed chain: a stamped Kimi build's steps run back to back, as the sandbox times them, beside
the isolated profile that `bench --phases` prints.

Why: the profile (sandbox/profile.py) runs each stamped step alone (a synchronize, the stamp rows zeroed and the
cache rewound before it, every step at one context), while the timed figure is a chain of steps back to back,
each at the next context, the state carried (sandbox/timing.py). Changes have moved the isolated timeline and not
the chain (BENCHMARKS.md, forty-fifth session: the MLA projection 3.4 µs shorter, the stamped kernel 2.8 µs, the
timed chain unchanged). Here the same -DPHASE_STAMPS=1 build also runs a chain of --steps steps after a warm-up
chain; after each step the stream copies its stamp rows out (no synchronize in the chain). Per kernel it prints:
  - both timelines (medians per phase), isolated and chained;
  - the stamped kernel (first block's start to last block's end) per chained step, and the boundary from a step's
    last block to the next step's first block; the boundary holds the copy, so it is also shown less the copies'
    cost to the chain;
  - the chain's µs/token by CUDA events with the copies and without them (what the copies themselves cost).
With --rounds N it then times chains of each kernel's plain build (no stamps, what the sandbox times) and its
stamped build, interleaved over N rounds, and sets each against the first kernel's same build: a difference
between kernels that the stamped builds show and the plain builds do not is the stamps' own doing. With
--fresh-loads every build there is compiled as the sandbox compiles (a cubin) and each round runs a fresh load
of it: where a module's code lies biases a load steadily (BENCHMARKS.md, forty-seventh session), and one load
per build turns that into a difference between builds.
Usage: python scripts/kimi_chain_stamps.py [KERNEL.cu ...] [--ctx 2048] [--steps 20] [--warmup 5] [--rounds 0]
                                           [--fresh-loads]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from megakernel_agent.sandbox.build import Placements, compile_candidate  # noqa: E402
from megakernel_agent.sandbox.candidate import Candidate  # noqa: E402
from megakernel_agent.sandbox.phases import (  # noqa: E402
    MAX_STAMP_BLOCKS,
    N_EVENTS,
    STAMPED_BUILD,
    PhaseStampError,
    check_stamps,
    phase_timeline,
    stamp_area,
    step_phases,
)
from megakernel_agent.sandbox.profile import PROFILE_STEPS, profile_phases  # noqa: E402
from megakernel_agent.sandbox.report import phase_table  # noqa: E402
from megakernel_agent.sandbox.timing import _chain, _run  # noqa: E402
from megakernel_agent.tasks.cuda_runtime import load_kernel  # noqa: E402
from megakernel_agent.tasks.kimi_linear.megakernel import build_megakernel  # noqa: E402
from megakernel_agent.tasks.kimi_linear.task import KimiTask  # noqa: E402
from megakernel_agent.traces.results import PhaseTimeline  # noqa: E402


@dataclass(frozen=True)
class Chain:
    """A chain's stamped steps: its timeline (medians per phase), each step's stamped kernel and the boundary
    from each step's end to the next step's start, µs."""

    timeline: PhaseTimeline
    kernels_us: list[float]
    boundaries_us: list[float]


def chained_timeline(rows: torch.Tensor, ctx: int, names: list[str], nbytes: list[int]) -> Chain:
    """The timeline of a chain from its steps' stamp rows ([steps][2 * phases][blocks], ns as the kernel wrote
    them: row 0 a block's start, then each barrier's arrival and release, the last row its end)."""
    steps, nrows, blocks = rows.shape
    phases = len(names)
    if nrows != 2 * phases or steps < 2:
        raise ValueError(f"{steps} steps of {nrows} stamp rows for {phases} phases: need 2 rows a phase, 2+ steps")
    no_events = torch.zeros((phases, N_EVENTS, blocks), dtype=torch.int64)
    runs = []
    for s in range(steps):
        check_stamps(rows[s], blocks, phases)
        runs.append(step_phases(rows[s], no_events, blocks, phases))
    starts, ends = rows[:, 0].min(dim=1).values, rows[:, -1].max(dim=1).values
    stale = (rows[1:, 0] <= ends[:-1, None]).any(dim=1).nonzero().flatten()
    if len(stale):   # rows are never zeroed in the chain: a block that did not stamp leaves the last step's
        raise PhaseStampError(f"step {int(stale[0]) + 1} has start stamps from before step {int(stale[0])}'s "
                              f"end: a block did not stamp it (stale rows)")
    return Chain(timeline=phase_timeline(ctx, names, nbytes, blocks, runs, chained=True),
                 kernels_us=((ends - starts).double() / 1000.0).tolist(),
                 boundaries_us=((starts[1:] - ends[:-1]).double() / 1000.0).tolist())


def run_chain(task: KimiTask, model, ctx: int, steps: int, warmup: int, seed: int,
              copy_rows: tuple[int, int] | None = None) -> tuple[float, torch.Tensor | None]:
    """(µs per step by CUDA events, the steps' stamp rows or None) of a chain as the sandbox times one: a
    throwaway warm-up chain, then `steps` steps from a fresh state at `ctx`, a fresh token each, back to back.
    With copy_rows (blocks, phases) each step's stamp rows are copied out on the stream after it."""
    stream = torch.cuda.current_stream()
    _run(model, *_chain(task, seed + steps, ctx, warmup, stream.device))
    tokens, state = _chain(task, seed, ctx, steps, stream.device)
    model.poison(state)   # as time_candidate: the cache is adopted (copied) before the timed window
    live = saved = None
    if copy_rows is not None:
        blocks, phases = copy_rows
        stamps, _ = stamp_area(task.scratch(model))
        live = stamps[: 2 * phases, :blocks]
        saved = torch.empty((steps, 2 * phases, blocks), dtype=torch.int64, device=stamps.device)
        live.zero_()   # a block that does not stamp step 0 shows (later steps: the stale-row check)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record(stream)
    for i, token in enumerate(tokens):
        _, state = model.step(token, state)
        if saved is not None:
            saved[i].copy_(live, non_blocking=True)
    end.record(stream)
    end.synchronize()
    return start.elapsed_time(end) * 1000.0 / steps, None if saved is None else saved.cpu()


def summary_table(results: dict[str, tuple[PhaseTimeline, Chain, float, float]]) -> Table:
    """Per kernel: the isolated and chained stamped kernels, the boundary, and the chain's event time."""
    t = Table(title="isolated profile vs chained steps, µs (medians). A boundary holds the stamp rows' copy: "
                    "less the copy, it is the boundary minus what the copies add to the chain")
    for col in ("kernel", "isolated kernel", "chained kernel", "boundary", "boundary less the copy",
                "chain µs/token (copies)", "chain µs/token (no copies)"):
        t.add_column(col, justify="right")
    for name, (iso, chain, with_copies, no_copies) in results.items():
        k, b = statistics.median(chain.kernels_us), statistics.median(chain.boundaries_us)
        t.add_row(name, f"{iso.kernel_us:.1f}", f"{k:.1f}", f"{b:.2f}", f"{b - (with_copies - no_copies):.2f}",
                  f"{with_copies:.1f}", f"{no_copies:.1f}")
    return t


def build_rounds(task: KimiTask, models: dict[str, dict[str, object]], args,
                 loads: dict[str, dict[str, Placements]] | None = None) -> dict[str, dict[str, list[float]]]:
    """µs/token of chains without stamp-row copies, per kernel and build, over `args.rounds` interleaved rounds:
    each round runs every kernel's every build on the round's own inputs, the kernels' order rotated; with
    `loads`, each build's model runs the build's next load in each round."""
    paths = list(models)
    times = {path: {build: [] for build in models[path]} for path in paths}
    for r in range(args.rounds):
        for path in paths[r % len(paths):] + paths[: r % len(paths)]:
            builds = list(models[path].items())
            for build, model in builds if r % 2 == 0 else builds[::-1]:
                if loads is not None:
                    model.attach(loads[path][build].next())
                us, _ = run_chain(task, model, args.ctx, args.steps, args.warmup, args.seed + 1000 * r)
                times[path][build].append(us)
    return times


def build_table(times: dict[str, dict[str, list[float]]]) -> Table:
    """Per kernel and build: the chain's µs/token (median, min-max) and the median of its per-round difference from
    the first kernel's same build; a stamped build is a faithful proxy only where its difference is the plain one's."""
    first = next(iter(times))
    t = Table(title="plain vs stamped builds, chained µs/token over interleaved rounds (no stamp-row copies)")
    for col in ("kernel", "build", "median", "min-max", "vs first kernel (median of rounds)"):
        t.add_column(col, justify="right")
    for path, builds in times.items():
        for build, us in builds.items():
            diff = statistics.median(a - b for a, b in zip(us, times[first][build], strict=True))
            t.add_row(path, build, f"{statistics.median(us):.1f}", f"{min(us):.1f}-{max(us):.1f}",
                      "" if path == first else f"{diff:+.2f}")
    return t


def sandbox_cubin(task: KimiTask, source: str, instruments: dict[str, str] | None = None) -> bytes:
    """The cubin of `source` (with `instruments`) for this GPU, compiled as the sandbox compiles a candidate."""
    major, minor = torch.cuda.get_device_capability()
    _, out = compile_candidate(task, Candidate(source=source), f"sm_{major}{minor}", instruments=instruments)
    if not out.ok:
        raise SystemExit(f"compile failed{' with ' + str(instruments) if instruments else ''}: {out.error}")
    return out.cubin


def fresh_loads(task: KimiTask, paths: list[str], rounds: int) -> dict[str, dict[str, Placements]]:
    """Per kernel, its plain and stamped builds compiled as the sandbox compiles them, a new load per round."""
    loads = {}
    for path in paths:
        loads[path] = {}
        for build, instruments in (("stamped", STAMPED_BUILD), ("plain", None)):
            cubin = sandbox_cubin(task, (ROOT / path).read_text(), instruments)

            def load(cubin=cubin):
                return load_kernel(cubin, task.spec.entry, task.spec.declarations)

            loads[path][build] = Placements(load, load(), count=rounds)
    return loads


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("kernels", nargs="*", default=[])
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=0,
                    help="then time plain and stamped builds of every kernel over this many interleaved rounds")
    ap.add_argument("--fresh-loads", action="store_true",
                    help="in the rounds, a fresh load of each build's cubin every round")
    args = ap.parse_args()
    dev = torch.device("cuda:0")
    task = KimiTask("full")
    reference = task.build_reference(dev, 0)
    console = Console(width=200)
    results, models = {}, {}
    for path in args.kernels or [task.spec.seed_kernel]:
        source = (ROOT / path).read_text()
        knobs = {k: str(v) for k, v in Candidate(source=source).resolved_knobs().items()}
        grid = torch.cuda.get_device_properties(dev).multi_processor_count * int(knobs.get("BLOCKS_PER_SM", 1))
        model = task.build_candidate(reference, build_megakernel(source, task.cfg, {**knobs, **STAMPED_BUILD}))
        models[path] = {"stamped": model}
        if args.rounds:
            models[path]["plain"] = task.build_candidate(reference, build_megakernel(source, task.cfg, knobs))
        isolated = profile_phases(task, model, args.ctx, grid, dev, PROFILE_STEPS)
        names, nbytes = [r.name for r in isolated.rows], [r.bytes for r in isolated.rows]   # the kernel's own phases
        chain_args = (task, model, args.ctx, args.steps, args.warmup, args.seed)
        no_copies, _ = run_chain(*chain_args)
        with_copies, rows = run_chain(*chain_args, copy_rows=(min(grid, MAX_STAMP_BLOCKS), len(names)))
        chain = chained_timeline(rows, args.ctx, names, nbytes)
        results[path] = (isolated, chain, with_copies, no_copies)
        console.print(f"[bold]{path}[/bold]: isolated steps (bench --phases), then the chain's")
        console.print(phase_table(isolated))
        console.print(phase_table(chain.timeline))
        console.print("chained kernels µs: " + " ".join(f"{k:.1f}" for k in chain.kernels_us))
        console.print("boundaries µs: " + " ".join(f"{b:.2f}" for b in chain.boundaries_us))
    console.print(summary_table(results))
    if args.rounds:
        loads = fresh_loads(task, args.kernels or [task.spec.seed_kernel], args.rounds) if args.fresh_loads else None
        console.print(build_table(build_rounds(task, models, args, loads)))


if __name__ == "__main__":
    main()
