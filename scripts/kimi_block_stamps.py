"""Per-block view of one phase of a Kimi step, from the raw stamps `kimi_phase_stamps.py --raw DIR` saves.

The medians of `bench --phases` say when the mean block and the critical block saw each event; they cannot say
which blocks are late or why. This prints, for one phase, the latest blocks (event by event, µs from the
phase's first release) and the same events averaged over the groups of blocks that share a workload. In the
MoE phase (gate/up, then down, no barrier between) the groups are the blocks with a shared-expert unit first,
the other blocks with a second gate/up unit, the blocks with one gate/up and one down unit, and those with a
gate/up unit only; their bounds come from the seed's default knobs unless given.
Usage: python scripts/kimi_block_stamps.py DIR/stamps_2048.npz ["L1 g/u+down"] [--groups 0,36,60,243]
"""

from __future__ import annotations

import argparse

import numpy as np


def shown_events(names: list[str], issued: bool = False) -> list[str]:
    """The saved event names in reading order: chunk events between a run's start and its end, without the
    "issued" stamps (a refill's time, not the block's progress) unless asked for (a patch may stamp another
    moment of the chunk there)."""
    kept = [n for n in names if issued or not n.endswith(" issued")]
    return sorted(kept, key=lambda n: n in ("computed", "done"))


def phase_events(path: str, phase: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """(release, arrival, events [event][block], event names): µs from the phase's first release; an event a
    block did not stamp is NaN."""
    raw = np.load(path)
    names, event_names = list(raw["phase_names"]), list(raw["event_names"])
    if phase not in names:
        raise SystemExit(f"no phase {phase!r}; phases: {', '.join(names)}")
    i = names.index(phase)
    stamps, events = raw["stamps"].astype(np.int64), raw["events"].astype(np.int64)
    t0 = stamps[2 * i].min()
    release, arrival = (stamps[2 * i] - t0) / 1e3, (stamps[2 * i + 1] - t0) / 1e3
    ev = np.where(events[i] > 0, (events[i] - t0) / 1e3, np.nan)
    return release, arrival, ev, event_names


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("npz")
    ap.add_argument("phase", nargs="?", default="L1 g/u+down")
    ap.add_argument("--groups", default="0,36,60,243", help="first block of each group of blocks")
    ap.add_argument("--latest", type=int, default=15, help="how many of the latest blocks to list")
    ap.add_argument("--issued", action="store_true", help="show the chunks' \"issued\" stamps too")
    args = ap.parse_args()
    release, arrival, ev, names = phase_events(args.npz, args.phase)
    shown = shown_events(names, args.issued)
    col = {e: names.index(e) for e in shown}
    print(f"{args.phase}: span {arrival.max():.1f} µs; µs from the phase's first release, latest blocks first")
    print("block  rel " + "".join(f"{e:>10s}" for e in shown) + "   arrived")
    for b in np.argsort(arrival)[::-1][: args.latest]:
        print(f"{b:5d} {release[b]:4.1f} " + "".join(f"{ev[col[e], b]:10.1f}" for e in shown) + f"{arrival[b]:10.1f}")
    bounds = [int(x) for x in args.groups.split(",")] + [len(arrival)]
    print("\ngroup means")
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        if lo >= hi:
            continue
        sel = slice(lo, hi)
        means = [np.nanmean(ev[col[e], sel]) if np.isfinite(ev[col[e], sel]).any() else np.nan for e in shown]
        print(f"{lo:3d}-{hi - 1:<3d}    " + "".join(f"{m:10.1f}" for m in means) + f"{arrival[sel].mean():10.1f}")


if __name__ == "__main__":
    main()
