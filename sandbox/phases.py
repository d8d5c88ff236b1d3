"""Phase timeline: where a step's time goes, from the %globaltimer stamps of a -DPHASE_STAMPS=1 build.

The contract (the constants below; every Kimi seed since 2d0f2c2 keeps it): a kernel built with
-DPHASE_STAMPS=1 writes, at the very end of its scratch buffer, u64 nanosecond stamps of blocks below
MAX_STAMP_BLOCKS:
  stamps [MAX_STAMPS][MAX_STAMP_BLOCKS]: row 0 the block's start; for grid barrier i, row 2i+1 its arrival
      and row 2i+2 its release; after the last barrier, its end. So n phases (Task.phase_names) take 2n rows.
  events [MAX_STAMPS/2][N_EVENTS][MAX_STAMP_BLOCKS]: per phase, the events thread 0 stamps inside it
      (EVENT_NAMES: input staged, first weight chunk landed, sums computed, units done, then per ring
      chunk landed / read by every warp / its refill issued); only with -DPHASE_STAMPS=2 (since 2026-12-05).
A reader zeroes both before a step: a row or event left 0 was not stamped.
The barrier stamps leave the step's time as it is; the events do not (the Kimi seed's step is ~7% slower
with them on an H100), so spans and waits come from STAMPED_BUILD, the order of events inside a phase from
EVENTS_BUILD.
Per phase: span = last arrival - first release into it (its critical path), mean = the average block's
arrival - release, wait = first release from its barrier - last arrival at it. Spans and waits add up
to the kernel time.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch

from megakernel_agent.traces.results import PhaseRow, PhaseTimeline

STAMPED_BUILD = {"PHASE_STAMPS": "1"}   # the instrument switch: barrier stamps
EVENTS_BUILD = {"PHASE_STAMPS": "2"}    # ... and events inside phases (they slow the step)
MAX_STAMPS, MAX_STAMP_BLOCKS = 128, 1024
EVENTS = ("staged", "1st chunk", "computed", "done")
CHUNK_EVENTS = ("landed", "read", "issued")
STAMPED_CHUNKS = 6
EVENT_NAMES = EVENTS + tuple(f"c{k} {e}" for k in range(STAMPED_CHUNKS) for e in CHUNK_EVENTS)
N_EVENTS = len(EVENT_NAMES)
STAMP_WORDS = MAX_STAMPS * MAX_STAMP_BLOCKS
EVENT_WORDS = MAX_STAMPS // 2 * N_EVENTS * MAX_STAMP_BLOCKS
CRITICAL_KEYS = ("released", *EVENT_NAMES, "arrived")


class PhaseStampError(ValueError):
    """The stamps do not fit the phases the task names, or there is no stamp area to read."""


@dataclass(frozen=True)
class StepPhase:
    """One phase of one step, µs: span, mean block work, wait; events of the mean and of the critical block."""

    span: float
    mean: float
    wait: float
    events: dict[str, float]
    critical: dict[str, float]


def stamp_area(scratch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(stamps, events): int64 views of the end of a stamped build's scratch buffer (bytes)."""
    start = scratch.numel() - 8 * (STAMP_WORDS + EVENT_WORDS)
    if start < 0 or (scratch.storage_offset() + start) % 8:
        raise PhaseStampError(f"the kernel's scratch ({scratch.numel()} bytes) does not end in a stamp area of "
                              f"{8 * (STAMP_WORDS + EVENT_WORDS)} bytes: was it built with -DPHASE_STAMPS=1?")
    tail = scratch[start:].view(torch.int64)
    return tail[:STAMP_WORDS].view(MAX_STAMPS, MAX_STAMP_BLOCKS), tail[STAMP_WORDS:].view(
        MAX_STAMPS // 2, N_EVENTS, MAX_STAMP_BLOCKS)


def marked_phases(stamps: torch.Tensor, blocks: int) -> int:
    """How many phases a step marked: its leading stamp rows that every block wrote (rows zeroed before)."""
    filled = 0
    while filled < len(stamps) and bool((stamps[filled, :blocks] > 0).all()):
        filled += 1
    return filled // 2


def check_stamps(stamps: torch.Tensor, blocks: int, phases: int) -> None:
    """PhaseStampError unless each of `blocks` stamped exactly the 2 * `phases` rows of `phases` phases (rows
    zeroed before the step; the row after them, when given, must stay 0)."""
    if not 0 < phases <= MAX_STAMPS // 2 or not 0 < blocks <= MAX_STAMP_BLOCKS:
        raise PhaseStampError(f"{phases} phases of {blocks} blocks do not fit the stamp area "
                              f"({MAX_STAMPS // 2} phases of {MAX_STAMP_BLOCKS} blocks)")
    t = stamps[:, :blocks]
    missing = t[: 2 * phases] <= 0
    if missing[0].any():
        raise PhaseStampError(f"blocks {missing[0].nonzero().flatten().tolist()[:8]} have no start stamp: not "
                              f"all {blocks} blocks ran")
    rows = missing.any(dim=1).nonzero()
    if len(rows):
        raise PhaseStampError(f"stamp row {int(rows[0])} of {2 * phases} is missing: the kernel marks fewer "
                              f"phases than the task's {phases}")
    if 2 * phases < len(t) and (t[2 * phases] > 0).any():
        raise PhaseStampError(f"the kernel marks more phases than the task's {phases}")


def step_phases(stamps: torch.Tensor, events: torch.Tensor, blocks: int, phases: int) -> list[StepPhase]:
    """The phases of one step from its stamps (ns; events of 0 or less are absent)."""
    base = stamps[0, :blocks].min()   # ns since the epoch lose precision as doubles: subtract first
    t = (stamps[: 2 * phases, :blocks] - base).double() / 1000.0
    have = events[:phases, :, :blocks] > 0
    ev = (events[:phases, :, :blocks] - base).double() / 1000.0
    out = []
    for i in range(phases):
        begin, arrive = t[2 * i], t[2 * i + 1]
        crit = int(arrive.argmax())
        mean_events, critical = {}, {"released": (begin[crit] - begin.min()).item()}
        for e, name in enumerate(EVENT_NAMES):
            stamped = have[i, e]
            if stamped.any():
                mean_events[name] = (ev[i, e][stamped] - begin[stamped]).mean().item()
            if stamped[crit]:
                critical[name] = (ev[i, e, crit] - begin[crit]).item()
        critical["arrived"] = (arrive[crit] - begin[crit]).item()
        wait = (t[2 * i + 2].min() - arrive.max()).item() if i + 1 < phases else 0.0
        out.append(StepPhase(span=(arrive.max() - begin.min()).item(), mean=(arrive - begin).mean().item(),
                             wait=wait, events=mean_events, critical=critical))
    return out


def phase_timeline(ctx: int, names: list[str], nbytes: list[int], blocks: int,
                   steps: list[list[StepPhase]], chained: bool = False) -> PhaseTimeline:
    """Each phase's medians over the steps, with its bytes and the TB/s they make over its span; `chained`: the
    steps ran back to back (else each alone)."""
    if not steps or len(nbytes) != len(names) or any(len(s) != len(names) for s in steps):
        raise ValueError(f"{len(steps)} steps of {[len(s) for s in steps]} phases for {len(names)} names and "
                         f"{len(nbytes)} byte counts")
    rows = []
    for i, name in enumerate(names):
        runs = [s[i] for s in steps]
        span = statistics.median(r.span for r in runs)
        rows.append(PhaseRow(
            name=name, span_us=span, mean_us=statistics.median(r.mean for r in runs),
            wait_us=statistics.median(r.wait for r in runs), bytes=nbytes[i],
            tbs=nbytes[i] / (span * 1e-6) / 1e12 if span > 0 else 0.0,
            events=_medians([r.events for r in runs], EVENT_NAMES),
            critical=_medians([r.critical for r in runs], CRITICAL_KEYS)))
    return PhaseTimeline(ctx=ctx, steps=len(steps), blocks=blocks, rows=rows,
                         kernel_us=sum(r.span_us + r.wait_us for r in rows), chained=chained)


def _medians(values: list[dict[str, float]], keys: tuple[str, ...]) -> dict[str, float]:
    """Per key (in `keys`' order), the median over the dicts that have it."""
    return {k: statistics.median(d[k] for d in values if k in d) for k in keys if any(k in d for d in values)}
