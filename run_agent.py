#!/usr/bin/env python3
"""megakernel-agent CLI: run | bench | replay | compare | export. Thin: parses arguments, calls the rooms."""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

NO_GPU = "No NVIDIA GPU with a working CUDA driver is visible here; this command needs one."


def parse_price(text: str):
    from agent.planners.prices import parse_price as parse

    return parse(text)


def parse_timeouts(text: str | None):
    """'check=30,time=60' -> PhaseTimeouts with those phases changed (seconds)."""
    from sandbox.protocol import PhaseTimeouts

    if not text:
        return PhaseTimeouts()
    values = {}
    for item in text.split(","):
        name, sep, value = item.partition("=")
        if not sep or name not in PhaseTimeouts.model_fields:
            raise SystemExit(f"--timeouts expects PHASE=SECONDS,... with phases {sorted(PhaseTimeouts.model_fields)}")
        try:
            values[name] = float(value)
        except ValueError as e:
            raise SystemExit(f"--timeouts: {value!r} is not a number of seconds") from e
    return PhaseTimeouts(**values)


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
    options = {"contexts": args.ctx or None, "samples": args.samples,
               "profile": (args.ctx or task.spec.context_lengths) if args.phases else []}
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


def cmd_run(args) -> int:
    from rich.console import Console

    from agent.budget import parse_duration
    from agent.planners import make_planner
    from agent.progress import SessionProgress, print_summary
    from agent.run_folder import check_out_dir
    from agent.scripted_model import ScriptedModel
    from agent.session import Session, StartError, now_tag
    from sandbox.pool import Evaluator, NoGpuError, WorkerStartError
    from tasks.registry import get_task
    from traces.loader import load
    from traces.report import write_report

    console = Console()
    resume = load(Path(args.resume)) if args.resume else None
    task_name = resume.start.task if resume else args.task
    size = resume.start.size if resume else args.size
    task = get_task(task_name, size)
    source = Path(args.kernel).read_text() if args.kernel else None
    out = Path(args.out) if args.out else (Path(args.resume).parent if resume else
                                           ROOT / "runs" / f"{now_tag()}-{task_name}-{size}")
    budget = parse_duration(args.budget)
    scripted = ScriptedModel.from_file(Path(args.scripted_model)) if args.scripted_model else None
    try:
        check_out_dir(out, Path(args.resume) if resume else None, out / "sandbox")
        planner = make_planner("anthropic" if scripted else args.planner, seed=args.seed,
                               model=scripted.header.model if scripted else args.model, max_cost=args.max_cost,
                               trace=args.replay_trace, price=parse_price(args.price) if args.price else None,
                               base_url=scripted.url if scripted else None,
                               api_key="scripted-model" if scripted else None)
    except (ValueError, StartError) as e:
        raise SystemExit(str(e)) from e
    evaluator = Evaluator(task_name, size, work_dir=out / "sandbox", timeouts=parse_timeouts(args.timeouts))
    try:
        evaluator.start()
    except NoGpuError:
        print(NO_GPU, file=sys.stderr)
        return 2
    except WorkerStartError as e:
        print(f"the GPU worker did not start: {e}", file=sys.stderr)
        return 2
    with contextlib.ExitStack() as stack:
        if scripted is not None:
            stack.enter_context(scripted)
        progress = stack.enter_context(SessionProgress(console, budget))
        session = Session(task, planner, evaluator, budget, out, start_source=source,
                          start_knobs=parse_knobs(args.knob), resume=resume, on_progress=progress.update)
        try:
            summary = session.run()
        except StartError as e:
            console.print(f"[red]{e}[/]")
            return 1
    try:
        trace = load(session.trace_path)
        for suffix in (".html", ".md"):
            write_report(trace, out / f"report{suffix}")
    except OSError as e:
        print(f"report not written: {e}", file=sys.stderr)
        return 1
    print_summary(console, summary, out)
    return 0


def cmd_replay(args) -> int:
    from rich.console import Console

    from traces.loader import load
    from traces.render import render
    from traces.report import write_report

    console = Console()
    if args.resume:
        args.trace, args.resume = None, args.trace
        return cmd_run(args)
    trace = load(Path(args.trace))
    render(trace, console)
    if args.report:
        console.print(f"report written: {write_report(trace, Path(args.report))}")
    if args.reexecute:
        from agent.reexecute import print_reexecute, reexecute
        from sandbox.pool import Evaluator

        with Evaluator(trace.start.task, trace.start.size) as ev:
            try:
                ev.start()
            except Exception as e:  # noqa: BLE001
                print(NO_GPU if "no CUDA GPU" in str(e) else str(e), file=sys.stderr)
                return 2
            rows = reexecute(trace, ev, args.kept_only, console)
            print_reexecute(trace, rows, console, ev.device.name if ev.device else None)
    return 0


def cmd_compare(args) -> int:
    from rich.console import Console

    from agent.compare import parse_version, print_compare, run_compare
    from sandbox.pool import Evaluator

    console = Console()
    try:
        versions = [parse_version(v) for v in args.versions]
    except Exception as e:  # noqa: BLE001
        raise SystemExit(str(e)) from e
    with Evaluator(args.task, args.size) as ev:
        try:
            ev.start()
        except Exception as e:  # noqa: BLE001
            print(NO_GPU if "no CUDA GPU" in str(e) else str(e), file=sys.stderr)
            return 2
        rows = run_compare(versions, ev, args.rounds, args.samples, console, args.ctx or None)
    print_compare(versions, rows, console, args.diff)
    return 0


def cmd_export(args) -> int:
    from sandbox.candidate import Candidate, validate
    from tasks.kimi_linear.export import export_solution

    path = Path(args.kernel)
    if not path.is_file():
        raise SystemExit(f"kernel file not found: {path}")
    cand = Candidate(source=path.read_text(), knobs=parse_knobs(args.knob))
    try:
        knobs = validate(cand)
        text = export_solution(cand.source, knobs, f"{path.name} {knobs}")
    except ValueError as e:  # CandidateError or forbidden text: say what is wrong, no traceback
        raise SystemExit(f"cannot export {path}: {e}") from e
    Path(args.output).write_text(text)
    print(f"wrote {args.output} ({path.name}, knobs {knobs})")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="run_agent.py", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)

    r = sub.add_parser("run", help="time-boxed optimization session (the main job)")
    r.add_argument("--task", default="kimi_linear")
    r.add_argument("--size", default="full", help="task configuration: full | small")
    r.add_argument("--kernel", help="starting kernel (default: the task's seed)")
    r.add_argument("--knob", action="append", metavar="NAME=VALUE", help="starting knob value (repeatable)")
    r.add_argument("--planner", choices=["tuner", "anthropic", "replay"],
                   help="default: anthropic if ANTHROPIC_API_KEY is set, else tuner")
    r.add_argument("--budget", default="30m", help="wall-clock budget, e.g. 10m, 90s, 1h")
    r.add_argument("--out", help="output folder (default: runs/<time>-<task>-<size>)")
    r.add_argument("--resume", metavar="TRACE", help="continue the session recorded in TRACE")
    r.add_argument("--seed", type=int, default=0, help="tuner seed")
    r.add_argument("--model", help="Anthropic model id (default: $ANTHROPIC_MODEL or claude-sonnet-4-5)")
    r.add_argument("--max-cost", type=float, default=5.0, help="USD cap on LLM spend for the session")
    r.add_argument("--replay-trace", help="trace whose proposals the replay planner re-proposes")
    r.add_argument("--scripted-model", metavar="SCRIPT.jsonl",
                   help="play a recorded model (agent/scripted_model.py) to the anthropic planner on a local server")
    r.add_argument("--price", metavar="IN,OUT[,CACHE_WRITE,CACHE_READ]",
                   help="USD per million tokens for a model the price table does not know")
    r.add_argument("--timeouts", metavar="PHASE=S,...", help="per-phase limits, e.g. check=60,time=120 "
                   "(phases: startup, build, check, time)")
    r.set_defaults(func=cmd_run)

    b = sub.add_parser("bench", help="build, check and time one kernel (default: the task's seed) vs the baseline")
    b.add_argument("kernel", nargs="?", help="CUDA source (default: the task's seed kernel)")
    b.add_argument("--task", default="kimi_linear")
    b.add_argument("--size", default="full", help="task configuration: full | small")
    b.add_argument("--knob", action="append", metavar="NAME=VALUE", help="override a declared knob (repeatable)")
    b.add_argument("--ctx", type=int, action="append", help="context length to time (repeatable; default: task's)")
    b.add_argument("--samples", type=int, help="timing samples per context")
    b.add_argument("--phases", action="store_true",
                   help="also profile the timed contexts with a -DPHASE_STAMPS=1 build: the phase timeline")
    b.add_argument("--json", action="store_true", help="print the full result as JSON")
    b.set_defaults(func=cmd_bench)

    p = sub.add_parser("replay", help="render a trace; optionally re-execute it, report on it, or resume it")
    p.add_argument("trace")
    p.add_argument("--reexecute", action="store_true", help="rebuild and re-evaluate the recorded versions here")
    p.add_argument("--kept-only", action="store_true", help="with --reexecute: only the seed and kept versions")
    p.add_argument("--report", metavar="OUT", help="write a report: OUT.html (self-contained) or OUT.md")
    p.add_argument("--resume", action="store_true", help="continue the session (same as run --resume TRACE)")
    p.add_argument("--budget", default="30m")
    p.set_defaults(func=cmd_replay, planner=None, seed=0, model=None, max_cost=5.0, replay_trace=None, kernel=None,
                   knob=None, out=None, task=None, size=None, scripted_model=None, price=None, timeouts=None)

    c = sub.add_parser("compare", help="check and time versions interleaved: FILE.cu, FILE.cu:K=V,..., TRACE#ID")
    c.add_argument("versions", nargs="+")
    c.add_argument("--task", default="kimi_linear")
    c.add_argument("--size", default="full")
    c.add_argument("--rounds", type=int, default=5, help="interleaved rounds (A B A B ...)")
    c.add_argument("--samples", type=int, default=3, help="timing samples per version per round")
    c.add_argument("--ctx", type=int, action="append", help="context length (repeatable; default: task's)")
    c.add_argument("--diff", action="store_true", help="show each version's source diff against the first")
    c.set_defaults(func=cmd_compare)

    e = sub.add_parser("export", help="write a standalone KernelBench-Mega solution.py for a Kimi kernel")
    e.add_argument("kernel")
    e.add_argument("-o", "--output", default="solution.py")
    e.add_argument("--knob", action="append", metavar="NAME=VALUE")
    e.set_defaults(func=cmd_export)

    args = ap.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
