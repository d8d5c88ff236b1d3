"""Faults that could lose work, injected on the CPU: each ends cleanly or goes on, loses no recorded event,
leaves a trace that loads, and orphans no process.

Traces: torn last lines, a torn multi-byte character, disk full mid-write, an interrupt mid-line, two
writers. Workers (the fake worker speaking the real protocol): malformed messages, garbage before "ready",
an interrupt mid-request or mid-shutdown, the session killed outright, logs of an earlier evaluator.
Sessions (the fake sandbox, and the fake worker where processes matter): SIGTERM, a second Ctrl-C during
cleanup, disk full at every event, best.cu written half, a folder holding another run, another task's trace,
two resumes at once, retries in-session and on resume, a hang or crash while confirming a win.
"""

from __future__ import annotations

import errno
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

import megakernel_agent.agent.run_folder as run_folder_mod
import megakernel_agent.agent.session as session_mod
import megakernel_agent.sandbox.pool as pool_mod
import megakernel_agent.traces.recorder as recorder_mod
from megakernel_agent.agent.errors import ResumeMismatch, RunFolderInUse
from megakernel_agent.agent.session import Session
from megakernel_agent.sandbox.candidate import Candidate, with_knob_defaults
from megakernel_agent.sandbox.pool import Evaluator, WorkerStartError
from megakernel_agent.sandbox.protocol import PhaseTimeouts
from megakernel_agent.tasks.registry import get_task
from megakernel_agent.traces.loader import TraceError, load
from megakernel_agent.traces.recorder import Recorder, TraceInUse, TraceWriteError
from megakernel_agent.traces.results import EvalResult, FailureClass
from megakernel_agent.traces.schema import PlannerError

from .fake_sandbox import FakeSandbox, failed, timed
from .test_agent_session import SRC, TASK, Scripted
from .trace_fixtures import write_session


def note(i: int) -> PlannerError:
    return PlannerError(id=f"n{i}", planner="x", message=f"event {i} µs")


def failing_writes(monkeypatch, after: int, error: BaseException, times: int | None = None):
    """Writes after the first `after` write half their line and raise `error` (`times` of them, or all)."""
    real = recorder_mod._write_all
    count = {"n": 0}

    def write(fd, data):
        count["n"] += 1
        if count["n"] <= after or (times is not None and count["n"] > after + times):
            return real(fd, data)
        real(fd, data[: len(data) // 2])
        raise error

    monkeypatch.setattr(recorder_mod, "_write_all", write)


# ---- traces ------------------------------------------------------------------------------------------------


def test_torn_last_line_is_cut_aside_before_a_resumed_writer_appends(tmp_path):
    path = write_session(tmp_path / "trace.jsonl", finish=False)
    before = load(path).events
    torn = b'{"type":"planner_error","id":"lost","mess'
    with open(path, "ab") as f:
        f.write(torn)
    with Recorder(path) as rec:
        assert rec.existing.events == before and not rec.existing.warnings
        written = rec.record(note(1))
    trace = load(path)
    assert trace.events == [*before, written]
    assert not trace.warnings
    assert (tmp_path / "trace.jsonl.torn-1").read_bytes() == torn


def test_a_torn_multibyte_character_is_only_a_torn_line(tmp_path):
    path = write_session(tmp_path / "trace.jsonl")
    n = len(load(path).events)
    with open(path, "ab") as f:
        f.write('{"type":"planner_error","id":"x","planner":"x","message":"µ'.encode()[:-1])
    trace = load(path)
    assert len(trace.events) == n and "incomplete" in trace.warnings[0]


def test_an_undecodable_middle_line_names_its_line(tmp_path):
    path = write_session(tmp_path / "trace.jsonl")
    lines = path.read_bytes().split(b"\n")
    lines[2] = lines[2][:40] + b"\xff\xfe" + lines[2][40:]
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(TraceError, match=":3: corrupt"):
        load(path)
    with pytest.raises(TraceError, match=":3: corrupt"):
        Recorder(path)  # never append to a trace that cannot be read back


def test_a_second_writer_is_refused_and_told_who_holds_the_trace(tmp_path):
    path = tmp_path / "trace.jsonl"
    with Recorder(path) as first:
        with pytest.raises(TraceInUse, match=rf"in use by another session \(pid {os.getpid()}\)"):
            Recorder(path)
        first.record(note(1))
    with Recorder(path) as again:  # released on close
        again.record(note(2))
    assert [e.id for e in load(path).events] == ["n1", "n2"]


def test_disk_full_mid_line_leaves_every_earlier_event_and_no_torn_line(tmp_path, monkeypatch):
    path = tmp_path / "trace.jsonl"
    failing_writes(monkeypatch, after=3, error=OSError(errno.ENOSPC, "No space left on device"), times=1)
    with Recorder(path) as rec:
        for i in range(3):
            rec.record(note(i))
        with pytest.raises(TraceWriteError, match="No space left"):
            rec.record(note(3))
        trace = load(path)
        assert [e.id for e in trace.events] == ["n0", "n1", "n2"] and not trace.warnings
        rec.record(note(4))  # space freed: the same writer goes on
    assert [e.id for e in load(path).events] == ["n0", "n1", "n2", "n4"]


def test_a_writer_that_cannot_undo_a_partial_line_refuses_to_write_more(tmp_path, monkeypatch):
    path = tmp_path / "trace.jsonl"
    failing_writes(monkeypatch, after=2, error=OSError(errno.EIO, "I/O error"))
    with Recorder(path) as rec:
        rec.record(note(0))
        rec.record(note(1))
        monkeypatch.setattr(recorder_mod.os, "ftruncate", _raise_eio)
        with pytest.raises(TraceWriteError):
            rec.record(note(2))
        monkeypatch.undo()
        with pytest.raises(TraceWriteError, match="not writable since an earlier failure"):
            rec.record(note(3))
    trace = load(path)
    assert [e.id for e in trace.events] == ["n0", "n1"] and "incomplete" in trace.warnings[0]


def _raise_eio(*_):
    raise OSError(errno.EIO, "I/O error")


def test_an_interrupt_mid_line_leaves_no_torn_line(tmp_path, monkeypatch):
    path = tmp_path / "trace.jsonl"
    failing_writes(monkeypatch, after=1, error=KeyboardInterrupt())
    with Recorder(path) as rec:
        rec.record(note(0))
        with pytest.raises(KeyboardInterrupt):
            rec.record(note(1))
    trace = load(path)
    assert [e.id for e in trace.events] == ["n0"] and not trace.warnings


# ---- workers -----------------------------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent
TIMEOUTS = PhaseTimeouts(startup=30, build=10, check=600, time=10)


def alive(pid: int) -> bool:
    """Running (a zombie nobody reaped has stopped running)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def group_members(pgid: int) -> list[int]:
    """Running processes in process group `pgid`."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                members.append(int(entry.name))
    return members


def started_by(work_dir: Path) -> list[int]:
    """Running processes of an evaluator on `work_dir` (lifeline, worker, their children): its worker
    environment names work_dir's CuPy cache."""
    mark = f"CUPY_CACHE_DIR={work_dir / 'cupy-cache'}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if mark in environ and alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def wait_until(cond, seconds: float = 10.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def fake_evaluator(tmp_path, **kw) -> Evaluator:
    env = {"FAKE_WORKER_PIDFILE": str(tmp_path / "pids")} | kw.pop("extra_env", {})
    return Evaluator("fake", work_dir=tmp_path / "sandbox", worker_module="tests.fake_worker",
                     timeouts=kw.pop("timeouts", TIMEOUTS), extra_env=env, **kw)


@pytest.mark.parametrize("behaviour, problem", [
    ("GARBAGE", "not JSON"), ("NO_EVENT", "without its 'event'"), ("UNKNOWN_EVENT", "unknown event 'gossip'"),
    ("BAD_RESULT", "invalid 'result' message"), ("FATAL_MIDWAY", "unexpected 'fatal'"),
])
def test_a_malformed_worker_message_is_a_retryable_infra_failure_and_a_fresh_worker_follows(
        tmp_path, behaviour, problem):
    with fake_evaluator(tmp_path) as ev:
        first = ev.evaluate(Candidate(source="fine"))
        group = os.getpgid(first.worker_pid)
        bad = ev.evaluate(Candidate(source=behaviour))
        assert bad.failure.cls == FailureClass.infra and bad.failure.retryable
        assert bad.failure.phase == "check" and problem in bad.failure.message
        assert wait_until(lambda: not group_members(group))
        again = ev.evaluate(Candidate(source="fine"))
        assert again.ok and again.worker_pid != first.worker_pid


def test_garbage_before_ready_is_a_start_error(tmp_path):
    with fake_evaluator(tmp_path, extra_env={"FAKE_WORKER_GARBAGE_START": "1"}) as ev:
        with pytest.raises(WorkerStartError, match="not JSON.*before 'ready'"):
            ev.start()
        res = ev.evaluate(Candidate(source="fine"))
    assert res.failure.cls == FailureClass.infra and res.failure.phase == "startup" and res.failure.retryable


def test_worker_logs_of_an_earlier_evaluator_are_kept(tmp_path):
    for _ in range(2):
        with fake_evaluator(tmp_path) as ev:
            ev.evaluate(Candidate(source="DIE"))  # a log worth keeping: the crash is in it
            ev.evaluate(Candidate(source="fine"))
    logs = sorted(p.name for p in (tmp_path / "sandbox").glob("worker-*.log"))
    assert logs == ["worker-1.log", "worker-2.log", "worker-3.log", "worker-4.log"]


def test_an_interrupt_mid_request_kills_the_worker_group(tmp_path, monkeypatch):
    ev = fake_evaluator(tmp_path)
    group = os.getpgid(ev.evaluate(Candidate(source="fine")).worker_pid)
    real_read = pool_mod._Worker.read

    def read(self, deadline):
        msg = real_read(self, deadline)
        if getattr(msg, "phase", "") == "check":
            raise KeyboardInterrupt
        return msg

    monkeypatch.setattr(pool_mod._Worker, "read", read)
    with pytest.raises(KeyboardInterrupt):
        ev.evaluate(Candidate(source="fine"))
    assert wait_until(lambda: not group_members(group))


def test_a_second_ctrl_c_while_closing_still_kills_the_worker_group(tmp_path, monkeypatch):
    ev = fake_evaluator(tmp_path)
    group = os.getpgid(ev.evaluate(Candidate(source="fine")).worker_pid)

    def interrupted_wait(self, timeout=None):
        monkeypatch.undo()  # the kill that follows must be able to wait
        raise KeyboardInterrupt

    monkeypatch.setattr(subprocess.Popen, "wait", interrupted_wait)
    with pytest.raises(KeyboardInterrupt):
        ev.close()
    assert wait_until(lambda: not group_members(group))


PARENT = """
import sys
sys.path.insert(0, {root!r})
from megakernel_agent.sandbox.candidate import Candidate
from megakernel_agent.sandbox.pool import Evaluator
from megakernel_agent.sandbox.protocol import PhaseTimeouts
ev = Evaluator("fake", work_dir={work!r}, worker_module="tests.fake_worker",
               timeouts=PhaseTimeouts(startup=30, build=10, check=600, time=10),
               extra_env={{"FAKE_WORKER_PIDFILE": {pids!r}}})
ev.evaluate(Candidate(source="HANG_CHECK"))
"""


def test_a_session_killed_outright_takes_its_hung_worker_and_grandchild_with_it(tmp_path):
    pids = tmp_path / "pids"
    parent = subprocess.Popen([sys.executable, "-c", PARENT.format(root=str(ROOT), work=str(tmp_path / "sb"),
                                                                   pids=str(pids))])
    try:
        assert wait_until(lambda: pids.exists() and len(pids.read_text().split()) == 2, 30)
        worker, grandchild = (int(p) for p in pids.read_text().split())
        group = os.getpgid(worker)
        assert alive(worker) and alive(grandchild) and group != os.getpgid(0)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        assert wait_until(lambda: not group_members(group), 5), f"left alive: {group_members(group)}"
    finally:
        parent.kill()
        parent.wait()


# ---- sessions ----------------------------------------------------------------------------------------------

FAST, SLOW = "// fast\n", "// slow\n"


def by_tag(cand: Candidate, _opts) -> EvalResult:
    """The seed takes 100 µs, FAST 90, SLOW 101; a tag the tests add decides anything else."""
    return timed(cand, 90.0 if cand.source.endswith(FAST) else 101.0 if cand.source.endswith(SLOW) else 100.0)


def plan(*tags) -> Scripted:
    return Scripted([(tag, {}) for tag in tags])


def make_session(out: Path, planner, script=by_tag, **kw) -> Session:
    sandbox = kw.pop("sandbox", None) or FakeSandbox(script)
    return Session(TASK, planner, sandbox, kw.pop("budget", 60.0), out, start_source=SRC, **kw)


def recording(monkeypatch) -> list:
    """Every event a Recorder confirmed as written, in order."""
    written = []
    real = Recorder.record

    def record(self, event):
        written.append(real(self, event))
        return written[-1]

    monkeypatch.setattr(Recorder, "record", record)
    return written


def test_sigterm_ends_a_session_like_ctrl_c_and_restores_the_handler(tmp_path):
    before = signal.getsignal(signal.SIGTERM)

    def script(cand, opts):
        if cand.source.endswith("term"):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler interrupts this sleep
        return by_tag(cand, opts)

    s = make_session(tmp_path, plan(FAST, "term", SLOW), script)
    summary = s.run()
    assert summary.reason == "terminated (SIGTERM)" and summary.best_id == "p1"
    trace = load(tmp_path / "trace.jsonl")
    assert trace.events[-1].type == "session_end" and [a.outcome for a in trace.attempts()] == ["kept", "unfinished"]
    assert (tmp_path / "best.cu").read_text().endswith(FAST) and s.ev.closed
    assert signal.getsignal(signal.SIGTERM) is before and signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.parametrize("tags, reason", [(["stop"], "interrupted (Ctrl-C)"), ([], "planner finished: script done")],
                         ids=["second-ctrl-c", "first-ctrl-c"])
def test_a_ctrl_c_during_cleanup_does_not_cut_it_short(tmp_path, tags, reason):
    def ctrl_c():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)  # where a raised KeyboardInterrupt would land

    def script(cand, opts):
        if cand.source.endswith("stop"):
            ctrl_c()
        return by_tag(cand, opts)

    sandbox = FakeSandbox(script, on_close=ctrl_c)
    summary = make_session(tmp_path, plan(*tags), sandbox=sandbox).run()
    assert summary.reason == reason and sandbox.closed
    assert load(tmp_path / "trace.jsonl").events[-1].type == "session_end"


def test_disk_full_at_any_event_ends_the_session_cleanly_with_every_written_event_readable(tmp_path, monkeypatch):
    clean = make_session(tmp_path / "clean", plan(FAST, SLOW, "same"))
    clean.run()
    total = len(load(tmp_path / "clean" / "trace.jsonl").events)
    for n in range(total):
        out = tmp_path / f"full-after-{n}"
        with monkeypatch.context() as m:
            written = recording(m)
            failing_writes(m, after=n, error=OSError(errno.ENOSPC, "No space left on device"))
            s = make_session(out, plan(FAST, SLOW, "same"))
            summary = s.run()
        assert "No space left" in summary.reason, n
        assert summary.reason.startswith("stopped:") or n == total - 1  # the session_end itself failed
        assert "session_end not written" in summary.reason or n == 0  # no session_start: no session_end either
        assert s.ev.closed
        Recorder(out / "trace.jsonl").close()  # the trace was released
        trace = load(out / "trace.jsonl")
        assert trace.events == written and len(written) == n and not trace.warnings
        kept = [e.id for e in written if e.type == "decision" and e.kept]
        if trace.measure is None:
            assert not (out / "best.cu").exists()
        else:
            best_id = kept[-1] if kept else "seed"
            source, knobs = trace.version(best_id)
            assert (out / "best.cu").read_text() == with_knob_defaults(source, knobs), n


def test_a_write_failing_once_ends_the_session_and_session_end_is_still_recorded(tmp_path, monkeypatch):
    failing_writes(monkeypatch, after=6, error=OSError(errno.ENOSPC, "No space left on device"), times=1)
    summary = make_session(tmp_path, plan(FAST, SLOW)).run()
    trace = load(tmp_path / "trace.jsonl")
    assert trace.events[-1].type == "session_end" and trace.events[-1].reason == summary.reason
    assert summary.reason.startswith("stopped:") and "No space left" in summary.reason


def test_best_cu_is_replaced_whole_or_not_at_all(tmp_path, monkeypatch):
    real_replace, calls = os.replace, []

    def replace(src, dst):
        calls.append(dst)
        if len(calls) > 1:  # the seed's best.cu is written; the first win's is not
            raise OSError(errno.ENOSPC, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(run_folder_mod.os, "replace", replace)
    summary = make_session(tmp_path, plan(FAST)).run()
    monkeypatch.undo()
    assert summary.reason.startswith("stopped:") and "No space left" in summary.reason
    assert (tmp_path / "best.cu").read_text() == with_knob_defaults(SRC, {})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.cu", "trace.jsonl"]
    trace = load(tmp_path / "trace.jsonl")
    assert trace.attempts()[0].outcome == "kept" and trace.events[-1].type == "session_end"


def snapshot(folder: Path) -> dict:
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_folder_holding_another_run_is_refused_before_anything_is_written(tmp_path):
    make_session(tmp_path, plan(FAST)).run()
    before = snapshot(tmp_path)
    s = make_session(tmp_path, plan(SLOW))
    with pytest.raises(RunFolderInUse, match="already holds another run .*best.cu.*trace.jsonl"):
        s.run()
    assert snapshot(tmp_path) == before and s.ev.closed


def test_an_empty_folder_or_one_holding_only_the_evaluators_work_dir_is_accepted(tmp_path):
    (tmp_path / "empty").mkdir()
    make_session(tmp_path / "empty", plan()).run()
    sandbox = FakeSandbox(by_tag)
    sandbox.work_dir = tmp_path / "started" / "sandbox"
    sandbox.work_dir.mkdir(parents=True)
    (sandbox.work_dir / "worker-1.log").write_text("started before the session")
    make_session(tmp_path / "started", plan(), sandbox=sandbox).run()
    assert load(tmp_path / "started" / "trace.jsonl").events[-1].type == "session_end"


def test_a_start_refused_after_making_the_folder_removes_it_again(tmp_path, monkeypatch):
    def no_recorder(path):
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(session_mod, "Recorder", no_recorder)
    s = make_session(tmp_path / "new" / "run", plan())
    with pytest.raises(PermissionError):
        s.run()
    assert not (tmp_path / "new" / "run").exists() and s.ev.closed


def test_resuming_another_tasks_trace_is_refused_before_anything_is_written(tmp_path):
    make_session(tmp_path / "run", plan(FAST)).run()
    trace = load(tmp_path / "run" / "trace.jsonl")
    before = snapshot(tmp_path)
    other = Session(get_task("w4a16_gemv", "full"), plan(), FakeSandbox(by_tag), 60.0, tmp_path / "run",
                    resume=trace)
    with pytest.raises(ResumeMismatch, match="records task kimi_linear \\(small\\), not w4a16_gemv \\(full\\)"):
        other.run()
    other_size = Session(get_task("kimi_linear", "full"), plan(), FakeSandbox(by_tag), 60.0, tmp_path / "elsewhere",
                         resume=trace)
    with pytest.raises(ResumeMismatch, match="not kimi_linear \\(full\\)"):
        other_size.run()
    assert snapshot(tmp_path) == before and not (tmp_path / "elsewhere").exists()


def test_resuming_into_another_runs_folder_is_refused(tmp_path):
    make_session(tmp_path / "a", plan(FAST)).run()
    make_session(tmp_path / "b", plan(SLOW)).run()
    before = snapshot(tmp_path)
    s = Session(TASK, plan(), FakeSandbox(by_tag), 60.0, tmp_path / "b", resume=load(tmp_path / "a" / "trace.jsonl"))
    with pytest.raises(RunFolderInUse, match="already holds another run"):
        s.run()
    assert snapshot(tmp_path) == before


def test_two_resumes_at_once_one_is_refused_and_a_stale_one_reads_the_trace_again(tmp_path):
    make_session(tmp_path, plan(FAST)).run()
    path = tmp_path / "trace.jsonl"
    stale = load(path)
    with Recorder(path):  # another session is appending right now
        before = path.read_bytes()
        s = Session(TASK, plan(SLOW), FakeSandbox(by_tag), 60.0, tmp_path, resume=stale)
        with pytest.raises(RunFolderInUse, match=rf"in use by another session \(pid {os.getpid()}\)"):
            s.run()
        assert path.read_bytes() == before and s.ev.closed
    Session(TASK, plan(SLOW), FakeSandbox(by_tag), 60.0, tmp_path, resume=stale).run()
    Session(TASK, plan("// third\n"), FakeSandbox(by_tag), 60.0, tmp_path, resume=stale).run()
    ids = [a.proposal.id for a in load(path).attempts()]
    assert ids == ["p1", "p2", "p3"]


def test_an_infra_failure_is_retried_once_on_the_spot(tmp_path):
    tries: dict = {}

    def script(cand, opts):
        tag = cand.source[len(SRC):]
        tries[tag] = tries.get(tag, 0) + 1
        if (tag == "flaky" and tries[tag] == 1) or tag == "broken":
            return failed(cand, FailureClass.infra, "startup", "worker did not start", retryable=True)
        return by_tag(cand, opts)

    make_session(tmp_path, plan("flaky", "broken"), script).run()
    trace = load(tmp_path / "trace.jsonl")
    assert [a.outcome for a in trace.attempts()] == ["slower", "infra"]
    assert tries == {"": 1, "flaky": 2, "broken": 2}
    assert [e.id for e in trace.events if e.type == "evaluate" and "~retried" in e.id] == ["p1~retried",
                                                                                          "p2~retried"]


def test_on_resume_unfinished_and_infra_failed_attempts_are_retried_first(tmp_path):
    def first(cand, opts):
        tag = cand.source[len(SRC):]
        if tag == "cut":
            raise KeyboardInterrupt  # the session stops mid-evaluation: no decision
        if tag == "infra":
            return failed(cand, FailureClass.infra, "check", "worker lost", retryable=True)
        return by_tag(cand, opts)

    make_session(tmp_path, Scripted([(FAST, {}), ("infra", {"A": 3}), ("cut", {})]), first).run()
    before = {a.proposal.id: a for a in load(tmp_path / "trace.jsonl").attempts()}
    assert [a.outcome for a in before.values()] == ["kept", "infra", "unfinished"]

    again = Session(TASK, plan(), FakeSandbox(by_tag), 60.0, tmp_path, resume=load(tmp_path / "trace.jsonl"))
    again.run()
    retried = [a for a in load(tmp_path / "trace.jsonl").attempts() if a.proposal.retry_of]
    assert [(a.proposal.id, a.proposal.retry_of) for a in retried] == [("p4", "p2"), ("p5", "p3")]
    for a in retried:
        old = before[a.proposal.retry_of].proposal
        assert (a.proposal.source_sha, a.proposal.knobs, a.proposal.parent_id) == (old.source_sha, old.knobs,
                                                                                    old.parent_id)
        assert a.proposal.hypothesis == f"retry of {old.id}: {old.hypothesis}" and a.outcome == "slower"

    Session(TASK, plan(), FakeSandbox(by_tag), 60.0, tmp_path, resume=load(tmp_path / "trace.jsonl")).run()
    assert len(load(tmp_path / "trace.jsonl").attempts()) == 5  # nothing left to retry


@pytest.mark.parametrize("which, cls", [("candidate", FailureClass.timeout), ("best", FailureClass.crash)])
def test_a_hang_or_crash_while_confirming_a_win_keeps_its_class(tmp_path, which, cls):
    def script(cand, opts):
        confirming = opts.get("check") is False
        if confirming and cand.source.endswith(FAST) == (which == "candidate"):   # a hang killed at its phase limit
            message = "time exceeded 120 s; worker process group killed" if cls == FailureClass.timeout \
                else "illegal address"
            return failed(cand, cls, "time", message)
        return by_tag(cand, opts)

    make_session(tmp_path, plan(FAST), script, budget=15.0).run()
    attempt = load(tmp_path / "trace.jsonl").attempts()[0]
    failure = attempt.failure.failure
    assert failure.phase.startswith(f"confirm ({which} re-timing)") and not attempt.decision.kept
    if which == "candidate":
        assert attempt.outcome == cls.value and not failure.retryable
    else:   # the best broke: not the candidate's failure, and worth another try
        assert attempt.outcome == "infra" and failure.retryable and f"re-timing failed ({cls.value})" in failure.message


def test_a_session_goes_on_past_malformed_worker_messages(tmp_path):
    ev = fake_evaluator(tmp_path, timeouts=PhaseTimeouts(startup=30, build=10, check=10, time=10))
    s = Session(TASK, plan("GARBAGE", "BAD_RESULT", "fine"), ev, 60.0, tmp_path / "run", start_source=SRC)
    summary = s.run()
    trace = load(tmp_path / "run" / "trace.jsonl")
    assert [a.outcome for a in trace.attempts()] == ["infra", "infra", "slower"]  # fake results have no timings
    assert summary.reason.startswith("planner finished") and wait_until(lambda: not started_by(ev.work_dir))


SESSION = """
import sys
sys.path.insert(0, {root!r})
from pathlib import Path
from megakernel_agent.agent.session import Session
from megakernel_agent.sandbox.pool import Evaluator
from megakernel_agent.sandbox.protocol import PhaseTimeouts
from tests.test_agent_session import SRC, TASK, Scripted
ev = Evaluator("fake", work_dir=Path({out!r}) / "sandbox", worker_module="tests.fake_worker",
               timeouts=PhaseTimeouts(startup=30, build=10, check=600, time=10),
               extra_env={{"FAKE_WORKER_PIDFILE": {pids!r}}})
summary = Session(TASK, Scripted([("HANG_CHECK", {{}})]), ev, 600.0, Path({out!r}), start_source=SRC).run()
print(summary.reason)
"""


@pytest.mark.parametrize("signals", [[signal.SIGTERM], [signal.SIGINT, signal.SIGINT]], ids=["sigterm", "ctrl-c-twice"])
def test_a_signalled_session_process_ends_cleanly_and_stops_its_hung_worker(tmp_path, signals):
    pids, out = tmp_path / "pids", tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-c", SESSION.format(root=str(ROOT), out=str(out), pids=str(pids))],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_until(lambda: pids.exists() and len(pids.read_text().split()) == 2, 60)
        group = os.getpgid(int(pids.read_text().split()[0]))
        assert len(started_by(out / "sandbox")) == 3  # lifeline, worker, grandchild
        for sig in signals:
            proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        proc.kill()
        proc.wait()
    expected = "terminated (SIGTERM)" if signals[0] == signal.SIGTERM else "interrupted (Ctrl-C)"
    assert proc.returncode == 0 and stdout.strip() == expected, stderr
    trace = load(out / "trace.jsonl")
    assert trace.events[-1].type == "session_end" and trace.events[-1].reason == expected
    assert wait_until(lambda: not group_members(group) and not started_by(out / "sandbox"), 5)


def test_a_resume_never_reuses_an_id_after_a_stop_recorded_by_an_older_writer(tmp_path):
    make_session(tmp_path, plan(FAST, SLOW)).run()
    path = tmp_path / "trace.jsonl"
    # the older writer: p1, a stop numbered p2 (a planner_error 'finished: ...'), a resume, p3
    lines = path.read_bytes().replace(b'"p2', b'"p3').splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if b'"type":"proposal","id":"p3"' in line)
    old_stop = (b'{"schema_version":1,"at":"2026-12-04T16:39:47.868+00:00","type":"planner_error","id":"p2",'
                b'"planner":"scripted","message":"finished: script done","retryable":false}\n')
    path.write_bytes(b"".join(lines[:at]) + old_stop + b"".join(lines[at:]))
    Session(TASK, plan("// third\n"), FakeSandbox(by_tag), 60.0, tmp_path, resume=load(path)).run()
    assert [a.proposal.id for a in load(path).attempts()] == ["p1", "p3", "p4"]


def test_after_a_resume_the_report_judges_against_the_best_as_re_measured(tmp_path):
    from megakernel_agent.traces.timings import judgements
    make_session(tmp_path, plan(FAST)).run()
    drifted = lambda cand, opts: timed(cand, 20.0 + by_tag(cand, opts).timings[0].median_us)  # noqa: E731
    Session(TASK, plan(SLOW), FakeSandbox(drifted), 60.0, tmp_path, resume=load(tmp_path / "trace.jsonl")).run()
    trace = load(tmp_path / "trace.jsonl")
    decision = next(a.decision for a in trace.attempts() if a.proposal.id == "p2")
    judged = judgements(trace)["p2"]
    geomean = statistics.geometric_mean(r for r, _, _ in judged.ratios.values())
    assert judged.against == "p1" and geomean == pytest.approx(decision.ratio)
