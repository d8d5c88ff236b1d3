"""Candidates per minute of recorded sessions (issue 27's benchmark): one row per trace.

The span runs from the starting kernel's measure to the last decision, so start-up is not counted; a
candidate is an attempt that reached a lane (duplicates refused before any GPU are not). Phase seconds are
medians over the candidates' own evaluations (re-timings and confirmations not included).

Usage: python3 scripts/session_rate.py TRACE.jsonl...
"""

from __future__ import annotations

import statistics
import sys
from datetime import datetime
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from megakernel_agent.traces.loader import load  # noqa: E402


def when(event) -> float:
    return datetime.fromisoformat(event.at).timestamp()


def row(path: Path) -> list[str]:
    trace = load(path)
    tried = [a for a in trace.attempts() if a.decision is not None and a.evaluate is not None]
    if trace.measure is None or not tried:
        return [path.name, "-", "-", "0", "-", "-", "-", "-", "-", "-", "-"]
    span = max(when(a.decision) for a in tried) - when(trace.measure)
    phases = {p: statistics.median(a.evaluate.result.phase_seconds.get(p, 0.0) for a in tried)
              for p in ("build", "check", "time")}
    busy = sum(sum(a.evaluate.result.phase_seconds.values()) for a in tried)
    gpus = {a.decision.gpu for a in tried}
    return [path.name, str(trace.start.inflight), str(len(gpus)), str(len(tried)), f"{span:.1f}",
            f"{span / len(tried):.2f}", f"{600 * len(tried) / span:.0f}",
            *(f"{phases[p]:.2f}" for p in ("build", "check", "time")), f"{busy / span:.2f}",
            str(sum(a.decision.kept for a in tried))]


def main(paths: list[str]) -> None:
    t = Table(title="candidates per 10 minutes (span: the seed's measure to the last decision)")
    for col in ("trace", "inflight", "GPUs", "candidates", "span s", "s each", "per 10 min", "build s", "check s",
                "time s", "evaluating / span", "kept"):
        t.add_column(col, justify="right")
    for p in paths:
        t.add_row(*row(Path(p)))
    Console(width=160).print(t)


if __name__ == "__main__":
    main(sys.argv[1:])
