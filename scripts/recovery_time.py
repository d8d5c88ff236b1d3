"""What each attempt of a recorded session cost, and on which worker: the cost of recovering from a wrong one.

Per attempt: its outcome, the worker process that evaluated it (the same pid after a wrong answer means the
worker was kept, not respawned), the wall time from the previous decision to its own, and how much of that
its recorded phases (its evaluation, re-timings, confirmations) account for. A respawn would show as a new
pid and about 20 s of wall time outside the phases.

Usage: python3 scripts/recovery_time.py TRACE.jsonl
"""

from __future__ import annotations

import sys
from datetime import datetime
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from megakernel_agent.traces.loader import load  # noqa: E402


def when(event) -> float:
    return datetime.fromisoformat(event.at).timestamp()


def main(path: str) -> None:
    trace = load(Path(path))
    phases: dict[str, float] = {}
    pids: dict[str, int | None] = {}
    for e in trace.events:
        if e.type in ("measure", "evaluate"):
            vid = e.id.split("~")[0].split("@")[0]
            phases[vid] = phases.get(vid, 0.0) + sum(e.result.phase_seconds.values())
            if "~" not in e.id:
                pids[vid] = e.result.worker_pid
    t = Table(title=f"{path}: wall time per attempt, previous decision to its own")
    for col in ("id", "outcome", "worker pid", "wall s", "in its phases s", "outside s"):
        t.add_column(col, justify="right")
    previous = when(trace.measure)
    t.add_row(trace.measure.id, "measured", str(pids.get(trace.measure.id)), "-", "-", "-")
    for a in trace.attempts():
        if a.decision is None:
            continue
        wall = when(a.decision) - previous
        inside = phases.get(a.proposal.id, 0.0)
        t.add_row(a.proposal.id, a.outcome, str(pids.get(a.proposal.id)), f"{wall:.2f}", f"{inside:.2f}",
                  f"{wall - inside:.2f}")
        previous = when(a.decision)
    Console(width=120).print(t)


if __name__ == "__main__":
    main(sys.argv[1])
