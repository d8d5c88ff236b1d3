"""How a session's throughput scales with lanes, on the CPU: real evaluators and worker processes, fake GPUs.

Each candidate's check sleeps a fixed time in its (fake) worker, so a lane can evaluate 1/SLEEP candidates
per second and N lanes at most N times that; what the session, the lanes and the trace cost on top shows as
the gap. Local lanes (one worker per "GPU", sandbox.lanes) and, with Ray installed, a local Ray cluster whose
GPUs are a custom resource (sandbox.cluster).

Usage: python3 scripts/lanes_scaling.py [--lanes 1 2 4] [--sleep 0.5] [--budget 15] [--ray]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from datetime import datetime
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from megakernel_agent.agent.planners.base import PlannedVersion, Planner, PlannerView  # noqa: E402
from megakernel_agent.agent.session import Session  # noqa: E402
from megakernel_agent.sandbox.lanes import local_evaluators  # noqa: E402
from megakernel_agent.sandbox.protocol import PhaseTimeouts  # noqa: E402
from megakernel_agent.tasks.registry import get_task  # noqa: E402
from megakernel_agent.traces.loader import load  # noqa: E402

TIMEOUTS = PhaseTimeouts(startup=60, build=30, check=60, time=30)


class Endless(Planner):
    """A new candidate every time (each one sleeps in its worker's check)."""

    name = "endless"

    def __init__(self):
        self.n = 0

    def propose(self, view: PlannerView) -> PlannedVersion:
        self.n += 1
        return PlannedVersion(source=f"SLEEP {self.n}", knobs={}, hypothesis=f"candidate {self.n}")


def rate(trace_path: Path) -> tuple[int, float]:
    trace = load(trace_path)
    done = [a for a in trace.attempts() if a.decision is not None]
    start = datetime.fromisoformat(trace.measure.at).timestamp()
    span = max(datetime.fromisoformat(a.decision.at).timestamp() for a in done) - start
    return len(done), span


def session(evaluators, out: Path, budget: float, lanes: int) -> tuple[int, float]:
    Session(get_task("kimi_linear", "small"), Endless(), evaluators, budget, out, start_source="seed",
            inflight=lanes).run()
    return rate(out / "trace.jsonl")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lanes", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--sleep", type=float, default=0.5, help="seconds each candidate's check takes")
    ap.add_argument("--budget", type=float, default=15.0, help="seconds per session")
    ap.add_argument("--ray", action="store_true", help="also on a local Ray cluster with fake GPUs")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="lanes-scaling-"))
    env = {"FAKE_WORKER_SLEEP_S": str(args.sleep), "FAKE_WORKER_SPANS": str(work / "spans")}
    rows = []
    for n in args.lanes:
        evs = local_evaluators("fake", "x", [str(i) for i in range(n)] if n > 1 else [], work / f"local{n}" / "sandbox",
                               worker_module="tests.fake_worker", timeouts=TIMEOUTS, extra_env=env)
        rows.append(("local", n, *session(evs, work / f"local{n}", args.budget, n)))
    if args.ray:
        import ray

        from megakernel_agent.sandbox.cluster import ray_evaluators
        ray.init(num_cpus=2, resources={"fake_gpu": max(args.lanes)}, include_dashboard=False, log_to_driver=False)
        try:
            for n in args.lanes:
                evs = ray_evaluators("fake", "x", n, resource="fake_gpu", worker_module="tests.fake_worker",
                                     timeouts=TIMEOUTS, extra_env=env)
                rows.append(("ray", n, *session(evs, work / f"ray{n}", args.budget, n)))
        finally:
            ray.shutdown()
    t = Table(title=f"candidates per minute by lanes (each check sleeps {args.sleep} s; one lane's ceiling "
                    f"{60 / args.sleep:.0f}/min)")
    for col in ("lanes on", "lanes", "candidates", "span s", "per minute", "vs 1 lane", "of the ceiling"):
        t.add_column(col, justify="right")
    first: dict[str, float] = {}
    for where, n, count, span in rows:
        per_min = 60 * count / span
        first.setdefault(where, per_min)
        t.add_row(where, str(n), str(count), f"{span:.1f}", f"{per_min:.0f}", f"{per_min / first[where]:.2f}x",
                  f"{per_min / (n * 60 / args.sleep):.0%}")
    Console(width=120).print(t)


if __name__ == "__main__":
    main()
