#!/usr/bin/env python3
"""megakernel-agent CLI: run | bench | replay | compare | export. Thin: parses arguments, calls the rooms."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

NO_GPU = "No NVIDIA GPU with a working CUDA driver is visible here; this command needs one."


def parse_knobs(items: list[str]) -> dict[str, int]:
    out = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep or not value.lstrip("-").isdigit():
            raise SystemExit(f"--knob expects NAME=INTEGER, got {item!r}")
        out[name] = int(value)
    return out


def cmd_bench(args) -> int:
    from rich.console import Console

    from sandbox.candidate import Candidate
    from sandbox.pool import Evaluator
    from sandbox.report import print_eval
    from tasks.registry import get_task
    from traces.results import FailureClass

    task = get_task(args.task, args.size)
    path = Path(args.kernel) if args.kernel else ROOT / task.spec.seed_kernel
    if not path.is_file():
        raise SystemExit(f"kernel file not found: {path}")
    cand = Candidate(source=path.read_text(), knobs=parse_knobs(args.knob))
    options = {"contexts": args.ctx or None, "samples": args.samples}
    with Evaluator(args.task, args.size) as ev:
        res = ev.evaluate(cand, **options)
    if res.failure and res.failure.cls == FailureClass.infra and "no CUDA GPU" in res.failure.message:
        print(NO_GPU, file=sys.stderr)
        return 2
    if args.json:
        print(res.model_dump_json(indent=2))
    else:
        print_eval(res, Console(), title=f"{path.name} on {args.task} ({args.size})")
    return 0 if res.ok else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="run_agent.py", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)

    b = sub.add_parser("bench", help="build, check and time one kernel (default: the task's seed) vs the baseline")
    b.add_argument("kernel", nargs="?", help="CUDA source (default: the task's seed kernel)")
    b.add_argument("--task", default="kimi_linear")
    b.add_argument("--size", default="full", help="task configuration: full | small")
    b.add_argument("--knob", action="append", metavar="NAME=VALUE", help="override a declared knob (repeatable)")
    b.add_argument("--ctx", type=int, action="append", help="context length to time (repeatable; default: task's)")
    b.add_argument("--samples", type=int, help="timing samples per context")
    b.add_argument("--json", action="store_true", help="print the full result as JSON")
    b.set_defaults(func=cmd_bench)

    for name, what in (("run", "optimization session"), ("replay", "trace replay"), ("compare", "kernel comparison"),
                       ("export", "KernelBench-Mega export")):
        p = sub.add_parser(name, help=f"{what} (not built yet)")
        p.add_argument("rest", nargs="*")
        p.set_defaults(func=lambda a, n=name: _not_built(n))

    args = ap.parse_args(argv)
    return args.func(args)


def _not_built(name: str) -> int:
    print(f"`{name}` is not built yet.", file=sys.stderr)
    return 3


if __name__ == "__main__":
    sys.exit(main())
