#!/usr/bin/env python3
"""megakernel-agent CLI: run | bench | replay | compare | model | export. Thin: parses arguments, calls the rooms."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import sys
import tempfile
from importlib import metadata
from pathlib import Path

from megakernel_agent.agent.errors import BadInput
from megakernel_agent.agent.exit_codes import ExitCode, session_exit

ROOT = Path(__file__).resolve().parent.parent   # the checkout (or site-packages/megakernel_agent)

PROG = "megakernel-agent"
DEFAULT_TASK = "kimi_linear"
NO_GPU = "No NVIDIA GPU with a working CUDA driver is visible here; this command needs one."
REPORT_SUFFIXES = (".html", ".md")


def package_version() -> str:
    """The installed distribution's version; run from a checkout, pyproject.toml's."""
    try:
        return metadata.version("megakernel-agent")
    except metadata.PackageNotFoundError:
        pass
    try:
        found = re.search(r'^version\s*=\s*"([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.MULTILINE)
    except OSError:
        found = None
    return found.group(1) if found else "unknown"


def arg_type(convert):
    """An argparse type from a converter that raises ValueError, keeping its message (argparse's own is generic)."""

    def typed(text: str):
        try:
            return convert(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from e

    typed.__name__ = convert.__name__
    return typed


def positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"expected a positive integer, got {text!r}")
    return int(text)


def machine_setting(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name or not value:
        raise ValueError(f"expected FIELD=VALUE, got {text!r}")
    return name.strip(), value.strip()


def default_builders() -> int:
    """Compiles at once unless the user says: half the cores, at most 4 (each takes a core and up to 4 GB)."""
    return max(1, min(4, (os.cpu_count() or 2) // 2))


def gpu_count(text: str) -> str:
    if text != "all" and (not text.isdigit() or int(text) < 1):
        raise ValueError(f"expected a positive integer or 'all', got {text!r}")
    return text


def cluster_address(text: str) -> str:
    if text not in ("auto", "local") and not re.fullmatch(r"ray://[\w.\-\[\]:]+:\d+", text):
        raise ValueError(f"expected auto, local or ray://HOST:PORT, got {text!r}")
    return text


def count(text: str) -> int:
    if not text.isdigit():
        raise ValueError(f"expected a whole number (0 or more), got {text!r}")
    return int(text)


def budget_seconds(text: str) -> float:
    from megakernel_agent.agent.budget import parse_duration

    return parse_duration(text)


def knob_setting(text: str) -> tuple[str, int]:
    from megakernel_agent.agent.preflight import parse_knob

    return parse_knob(text)


def price(text: str):
    from megakernel_agent.agent.planners.prices import parse_price

    return parse_price(text)


def phase_timeouts(text: str):
    """'check=30,time=60' -> PhaseTimeouts with those phases changed (seconds)."""
    from megakernel_agent.sandbox.protocol import PhaseTimeouts

    values = {}
    for item in text.split(","):
        name, sep, value = item.partition("=")
        if not sep or name not in PhaseTimeouts.model_fields:
            raise ValueError(f"expected PHASE=SECONDS,... with phases {sorted(PhaseTimeouts.model_fields)}")
        try:
            values[name] = float(value)
        except ValueError as e:
            raise ValueError(f"{value!r} is not a number of seconds") from e
    return PhaseTimeouts(**values)


def report_file(text: str) -> Path:
    from megakernel_agent.agent.preflight import output_file

    return output_file(text, REPORT_SUFFIXES)


def solution_file(text: str) -> Path:
    from megakernel_agent.agent.preflight import output_file

    return output_file(text)


def kernel_arg(args, task):
    """(candidate, label) of the command's KERNEL (default: the task's seed) with its --knob settings, checked."""
    from megakernel_agent.agent.preflight import kernel_candidate

    return kernel_candidate(task, Path(args.kernel) if args.kernel else None, dict(args.knob or []))


@contextlib.contextmanager
def scratch_folder(prefix: str):
    """A temporary folder for a one-off evaluator, removed afterwards unless its worker did not start: that
    error names the worker's log inside it, so the folder stays and the message says where."""
    from megakernel_agent.sandbox.pool import WorkerStartError

    work, keep = Path(tempfile.mkdtemp(prefix=prefix)), False
    try:
        yield work
    except WorkerStartError as e:
        keep = True
        raise WorkerStartError(f"{e}\n(the worker's logs are kept in {work})") from None
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)


def cmd_bench(args) -> int:
    from rich.console import Console

    from megakernel_agent.agent.preflight import task_for
    from megakernel_agent.sandbox.pool import Evaluator
    from megakernel_agent.sandbox.report import print_eval

    task = task_for(args.task, args.size)
    cand, label = kernel_arg(args, task)
    options = {"contexts": args.ctx or None, "samples": args.samples,
               "profile": (args.ctx or task.spec.context_lengths) if args.phases else []}
    with scratch_folder("megakernel-bench-") as work, Evaluator(args.task, args.size, work_dir=work) as ev:
        ev.start()
        res = ev.evaluate(cand, **options)
    if args.json:
        print(res.model_dump_json(indent=2))
    else:
        print_eval(res, Console(), title=f"{label} on {args.task} ({args.size})")
    return ExitCode.OK if res.ok else ExitCode.FAILED


def run_evaluators(args, task, work_dir: Path) -> list:
    """The session's evaluators: one per GPU asked for, on this host (pinned by CUDA_VISIBLE_DEVICES) or as actors
    on a Ray cluster. Bad counts, a missing Ray or an unreachable cluster are bad input."""
    options = dict(timeouts=args.timeouts, build_ahead=args.build_ahead)
    if args.cluster:
        from megakernel_agent.sandbox.cluster import ClusterError, cluster_gpus, connect, ray_evaluators

        try:
            connect(args.cluster)
            lanes = cluster_gpus(args.gpu_resource) if args.gpus == "all" else int(args.gpus)
            return ray_evaluators(task.spec.name, task.spec.size, lanes, resource=args.gpu_resource, **options)
        except ClusterError as e:
            raise BadInput(str(e)) from e
    if args.gpu_resource != "GPU":
        raise BadInput("--gpu-resource only goes with --cluster")
    from megakernel_agent.sandbox.lanes import GpuCountError, local_evaluators, pick_gpus

    try:
        gpus = pick_gpus(args.gpus)
    except GpuCountError as e:
        raise BadInput(str(e)) from e
    return local_evaluators(task.spec.name, task.spec.size, gpus, work_dir, **options)


def cmd_run(args) -> int:
    from rich.console import Console

    from megakernel_agent.agent.planners import make_planner
    from megakernel_agent.agent.preflight import load_trace, task_for
    from megakernel_agent.agent.progress import SessionProgress, print_summary
    from megakernel_agent.agent.run_folder import check_out_dir, missing_folders, remove_folders
    from megakernel_agent.agent.scripted_model import ScriptedModel
    from megakernel_agent.agent.session import Session, StartError, now_tag
    from megakernel_agent.sandbox.pool import NoGpuError
    from megakernel_agent.traces.loader import load
    from megakernel_agent.traces.report import write_report

    resume = load_trace(Path(args.resume)) if args.resume else None
    if resume and (args.kernel or args.knob):
        raise BadInput("--kernel and --knob start a new session; --resume continues the recorded one as it was")
    name, size = (resume.start.task, resume.start.size) if resume else (args.task, args.size)
    task = task_for(name, size)
    source = None if resume else kernel_arg(args, task)[0].source
    out = Path(args.out) if args.out else (resume.path.parent if resume else
                                           Path("runs") / f"{now_tag()}-{task.spec.name}-{task.spec.size}")
    try:
        check_out_dir(out, resume.path if resume else None, out / "sandbox")
        scripted = ScriptedModel.from_file(Path(args.scripted_model)) if args.scripted_model else None
        planner = make_planner("anthropic" if scripted else args.planner, seed=args.seed,
                               model=scripted.header.model if scripted else args.model, max_cost=args.max_cost,
                               trace=args.replay_trace, price=args.price, base_url=scripted.url if scripted else None,
                               api_key="scripted-model" if scripted else None)
    except (ValueError, OSError, StartError) as e:
        raise BadInput(str(e).splitlines()[0]) from e
    made = missing_folders(out)
    evaluators = run_evaluators(args, task, out / "sandbox")
    try:
        evaluators[0].start()   # the others start with the session, side by side
    except NoGpuError:
        for ev in evaluators:
            ev.close()
        remove_folders(made)
        raise
    console = Console()
    with contextlib.ExitStack() as stack:
        if args.cluster:
            from megakernel_agent.sandbox.cluster import disconnect

            stack.callback(disconnect)
        for ev in evaluators:
            stack.callback(ev.close)
        if scripted is not None:
            stack.enter_context(scripted)
        progress = stack.enter_context(SessionProgress(console, args.budget))
        session = Session(task, planner, evaluators, args.budget, out, start_source=source,
                          start_knobs=dict(args.knob or []), resume=resume, on_progress=progress.update,
                          inflight=args.inflight)
        try:
            summary = session.run()
        except StartError as e:
            print(f"the session did not start: {e}", file=sys.stderr)
            return ExitCode.FAILED
    try:
        trace = load(session.trace_path)
        for suffix in REPORT_SUFFIXES:
            write_report(trace, out / f"report{suffix}")
    except OSError as e:
        print(f"report not written: {e}", file=sys.stderr)
        return ExitCode.FAILED
    print_summary(console, summary, out)
    return session_exit(summary.reason)


def check_replay_flags(args) -> None:
    """Flags that would be silently ignored are usage errors."""
    if args.kept_only and not args.reexecute:
        raise BadInput("--kept-only only goes with --reexecute")
    if args.resume and (args.report or args.reexecute):
        raise BadInput("--resume continues the session; --report and --reexecute do not go with it")


def cmd_replay(args) -> int:
    from rich.console import Console

    from megakernel_agent.agent.preflight import load_trace, task_for
    from megakernel_agent.traces.render import render
    from megakernel_agent.traces.report import write_report

    check_replay_flags(args)
    if args.resume:
        args.trace, args.resume = None, args.trace
        return cmd_run(args)
    console = Console()
    trace = load_trace(Path(args.trace))
    render(trace, console)
    if args.report:
        try:
            console.print(f"report written: {write_report(trace, args.report)}")
        except OSError as e:
            print(f"report not written: {e}", file=sys.stderr)
            return ExitCode.FAILED
    if args.reexecute:
        from megakernel_agent.agent.reexecute import print_reexecute, reexecute
        from megakernel_agent.sandbox.pool import Evaluator

        task_for(trace.start.task, trace.start.size)  # a task this copy does not have is refused here
        with scratch_folder("megakernel-replay-") as work, \
                Evaluator(trace.start.task, trace.start.size, work_dir=work) as ev:
            ev.start()
            rows = reexecute(trace, ev, args.kept_only, console)
            print_reexecute(trace, rows, console, ev.device.name if ev.device else None)
    return ExitCode.OK


def cmd_compare(args) -> int:
    from rich.console import Console

    from megakernel_agent.agent.compare import parse_version, print_compare, run_compare
    from megakernel_agent.agent.preflight import task_for
    from megakernel_agent.sandbox.pool import Evaluator

    task = task_for(args.task, args.size)
    versions = [parse_version(v, task) for v in args.versions]
    console = Console()
    with scratch_folder("megakernel-compare-") as work, Evaluator(args.task, args.size, work_dir=work) as ev:
        ev.start()
        rows = run_compare(versions, ev, args.rounds, args.samples, console, args.ctx or None)
    print_compare(versions, rows, console, args.diff)
    return ExitCode.OK


def cmd_model(args) -> int:
    from rich.console import Console

    from megakernel_agent.agent import schedule_model as sm
    from megakernel_agent.agent.preflight import task_for
    from megakernel_agent.sandbox.candidate import parse_knobs
    from megakernel_agent.tasks.kimi_linear.step_model import STAMPED_KNOBS, simulate, stamped_spans

    task = task_for(DEFAULT_TASK, "full")
    seed, _ = kernel_arg(argparse.Namespace(kernel=args.kernel, knob=args.knob), task)
    knobs = seed.resolved_knobs()
    timeline = (sm.stamped_timeline(args.timeline, args.ctx) if args.timeline
                else sm.stamped_timeline(str(sm.DEFAULT_TIMELINE), args.ctx or sm.DEFAULT_CTX))
    machine, fixed, cfg = sm.machine_with(args.set or []), stamped_spans(timeline), task.cfg
    console = Console()
    stamped_moves = sorted(k for k, _ in args.knob or [] if k in STAMPED_KNOBS)
    if stamped_moves:
        console.print(f"note: {', '.join(stamped_moves)} change phases the model takes from the timeline's stamps; "
                      "they are right only if the timeline was profiled with the same values")
    base = simulate(cfg, knobs, machine, fixed)
    sm.print_estimate(base, timeline, console)
    if args.moves:
        declared = {k.name: k.values for k in parse_knobs(seed.source)}
        sm.print_moves(sm.knob_moves(cfg, knobs, declared, machine, fixed), base.kernel_us, console, "One-knob moves")
    if args.what_ifs:
        sm.print_moves(sm.what_ifs(cfg, knobs, machine, fixed), base.kernel_us, console, "What-ifs (issue 28)")
    return ExitCode.OK


def cmd_export(args) -> int:
    from megakernel_agent.agent.preflight import task_for
    from megakernel_agent.tasks.kimi_linear.export import export_solution

    task = task_for(DEFAULT_TASK, "full")
    cand, label = kernel_arg(args, task)
    knobs = cand.resolved_knobs()
    try:
        text = export_solution(cand.source, knobs, f"{Path(label).name} {knobs}")
    except ValueError as e:  # upstream-forbidden text
        raise BadInput(f"cannot export {label}: {e}") from e
    try:
        args.output.write_text(text)
    except OSError as e:
        raise BadInput(f"cannot write {args.output}: {e.strerror}") from e
    print(f"wrote {args.output} ({label}, knobs {knobs})")
    return ExitCode.OK


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows an option's default where it has one (not for flags and options that default to nothing)."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


class Parser(argparse.ArgumentParser):
    """argparse with defaults in --help, and usage errors as one line (BadInput) instead of usage text."""

    def __init__(self, **kwargs):
        super().__init__(formatter_class=HelpFormatter, **kwargs)

    def error(self, message: str):
        raise BadInput(f"{message} (see {self.prog} --help)")


def add_lane_options(parser: argparse.ArgumentParser) -> None:
    """Where a session evaluates, and how many proposals it keeps in flight (run, and replay --resume)."""
    parser.add_argument("--gpus", default="1", type=arg_type(gpu_count), metavar="N|all",
                        help="GPUs to evaluate on, one warm worker each (this host's, or the cluster's with --cluster)")
    parser.add_argument("--inflight", type=arg_type(positive_int), metavar="K",
                        help="proposals evaluated at once (default: one per GPU); more than the GPUs lets the "
                             "planner propose while they evaluate")
    parser.add_argument("--cluster", type=arg_type(cluster_address), metavar="auto|local|ray://HOST:PORT",
                        help="evaluate on a Ray cluster, one actor per GPU (needs pip install '.[cluster]')")
    parser.add_argument("--gpu-resource", default="GPU", metavar="NAME",
                        help="with --cluster: the Ray resource one lane holds (a custom one stands for a GPU)")


def build_parser() -> Parser:
    ap = Parser(prog=PROG, description=__doc__)
    ap.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    sub = ap.add_subparsers(dest="cmd", required=True)
    knob = {"action": "append", "type": arg_type(knob_setting), "metavar": "NAME=VALUE"}
    ctx = {"type": arg_type(positive_int), "action": "append", "help": "context length (repeatable; default: task's)"}

    r = sub.add_parser("run", help="time-boxed optimization session (the main job)")
    r.add_argument("--task", default=DEFAULT_TASK, help="task name")
    r.add_argument("--size", default="full", help="task configuration: full | small")
    r.add_argument("--kernel", help="starting kernel (default: the task's seed)")
    r.add_argument("--knob", **knob, help="starting knob value (repeatable)")
    r.add_argument("--planner", choices=["tuner", "anthropic", "replay"],
                   help="default: anthropic if ANTHROPIC_API_KEY is set, else tuner")
    r.add_argument("--budget", default="30m", type=arg_type(budget_seconds),
                   help="wall-clock budget, e.g. 10m, 90s, 1h30m")
    r.add_argument("--out", help="output folder (default: ./runs/<time>-<task>-<size>)")
    r.add_argument("--resume", metavar="TRACE", help="continue the session recorded in TRACE")
    r.add_argument("--seed", type=int, default=0, help="tuner seed")
    r.add_argument("--model", help="Anthropic model id (default: $ANTHROPIC_MODEL or claude-sonnet-4-5)")
    r.add_argument("--max-cost", type=float, default=5.0, help="USD cap on LLM spend for the session")
    r.add_argument("--replay-trace", help="trace whose proposals the replay planner re-proposes")
    r.add_argument("--scripted-model", metavar="SCRIPT.jsonl",
                   help="play a recorded model (agent/scripted_model.py) to the anthropic planner on a local server")
    r.add_argument("--price", metavar="IN,OUT[,CACHE_WRITE,CACHE_READ]", type=arg_type(price),
                   help="USD per million tokens for a model the price table does not know")
    r.add_argument("--timeouts", metavar="PHASE=S,...", type=arg_type(phase_timeouts),
                   help="per-phase limits, e.g. check=60,time=120 (phases: startup, build, check, time)")
    r.add_argument("--build-ahead", metavar="N", type=arg_type(count), default=default_builders(),
                   help="candidates compiled at once on the CPU while the GPU evaluates (0: the GPU worker compiles)")
    add_lane_options(r)
    r.set_defaults(func=cmd_run)

    b = sub.add_parser("bench", help="build, check and time one kernel (default: the task's seed) vs the baseline")
    b.add_argument("kernel", nargs="?", help="CUDA source (default: the task's seed kernel)")
    b.add_argument("--task", default=DEFAULT_TASK, help="task name")
    b.add_argument("--size", default="full", help="task configuration: full | small")
    b.add_argument("--knob", **knob, help="override a declared knob (repeatable)")
    b.add_argument("--ctx", **ctx)
    b.add_argument("--samples", type=arg_type(positive_int), help="timing samples per context (default: task's)")
    b.add_argument("--phases", action="store_true",
                   help="also profile the timed contexts with a -DPHASE_STAMPS=1 build: the phase timeline")
    b.add_argument("--json", action="store_true", help="print the full result as JSON")
    b.set_defaults(func=cmd_bench)

    p = sub.add_parser("replay", help="render a trace; optionally re-execute it, report on it, or resume it")
    p.add_argument("trace")
    p.add_argument("--reexecute", action="store_true", help="rebuild and re-evaluate the recorded versions here")
    p.add_argument("--kept-only", action="store_true", help="with --reexecute: only the seed and kept versions")
    p.add_argument("--report", metavar="OUT", type=arg_type(report_file),
                   help="write a report: OUT.html (self-contained) or OUT.md")
    p.add_argument("--resume", action="store_true", help="continue the session (same as run --resume TRACE)")
    p.add_argument("--budget", default="30m", type=arg_type(budget_seconds), help="with --resume: wall-clock budget")
    add_lane_options(p)
    p.set_defaults(func=cmd_replay, planner=None, seed=0, model=None, max_cost=5.0, replay_trace=None, kernel=None,
                   knob=None, out=None, task=None, size=None, scripted_model=None, price=None, timeouts=None,
                   build_ahead=default_builders())

    c = sub.add_parser("compare", help="check and time versions interleaved: FILE.cu, FILE.cu:K=V,..., TRACE#ID")
    c.add_argument("versions", nargs="+", metavar="VERSION")
    c.add_argument("--task", default=DEFAULT_TASK, help="task name")
    c.add_argument("--size", default="full", help="task configuration: full | small")
    c.add_argument("--rounds", type=arg_type(positive_int), default=5,
                   help="interleaved rounds, each starting one version further on")
    c.add_argument("--samples", type=arg_type(positive_int), default=3, help="timing samples per version per round")
    c.add_argument("--ctx", **ctx)
    c.add_argument("--diff", action="store_true", help="show each version's source diff against the first")
    c.set_defaults(func=cmd_compare)

    m = sub.add_parser("model", help="the seed's discrete-event schedule model vs its stamps; knob moves and "
                                     "what-ifs predicted on the CPU")
    m.add_argument("kernel", nargs="?", help="a Kimi kernel source whose declared knobs to model (default: the seed); "
                                             "the model knows the seed's schedule, so only the knobs it reads count "
                                             "(the K splits, PREFETCH, the GEMV loop's knobs, ACC_COUNT, and the "
                                             "patches' AWAIT_EARLY, DEFER_SECOND and ROUTE_EARLY)")
    m.add_argument("--knob", **knob, help="knob value to model (repeatable)")
    m.add_argument("--set", action="append", type=arg_type(machine_setting), metavar="FIELD=VALUE",
                   help="a machine-model figure, e.g. dram_order=fifo or compute_scale=0.73 (repeatable)")
    m.add_argument("--timeline", metavar="TRACE#ID|BENCH.json",
                   help="phase stamps that feed the phases the model does not simulate: an evaluation of a trace, "
                        "or a `bench --phases --json` output (default: the seed's H200 profile in "
                        "traces/examples/kimi-accum, at ctx 2048 unless --ctx 16384)")
    m.add_argument("--ctx", type=arg_type(positive_int), help="the timeline's context, if it profiled several")
    m.add_argument("--moves", action="store_true", help="also model every one-knob move")
    m.add_argument("--what-ifs", action="store_true", help="also model the architecture what-ifs of issue 28")
    m.set_defaults(func=cmd_model)

    e = sub.add_parser("export", help=f"write a standalone KernelBench-Mega solution.py for a {DEFAULT_TASK} kernel")
    e.add_argument("kernel", nargs="?", help="CUDA source (default: the task's seed kernel)")
    e.add_argument("-o", "--output", default="solution.py", type=arg_type(solution_file),
                   help="file to write (its folder must exist)")
    e.add_argument("--knob", **knob, help="knob value baked into the solution (repeatable)")
    e.set_defaults(func=cmd_export)
    return ap


def main(argv: list[str] | None = None) -> int:
    """Run one command; bad input, no GPU and Ctrl-C end in one line on stderr and their exit code."""
    from megakernel_agent.sandbox.pool import NoGpuError, WorkerStartError
    from megakernel_agent.traces.loader import TraceError

    try:
        args = build_parser().parse_args(argv)
        return int(args.func(args))
    except (BadInput, TraceError) as e:
        print(f"{PROG}: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return ExitCode.USAGE
    except NoGpuError:
        print(NO_GPU, file=sys.stderr)
        return ExitCode.NO_GPU
    except WorkerStartError as e:  # in full: past its first line comes the tail of the worker's log, the why
        print(f"the GPU worker did not start: {e}", file=sys.stderr)
        return ExitCode.NO_GPU
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
