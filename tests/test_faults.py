"""Faults that could lose work, injected on the CPU: each ends cleanly or goes on, loses no recorded event,
leaves a trace that loads, and orphans no process.

Traces: torn last lines, a torn multi-byte character, disk full mid-write, an interrupt mid-line, two
writers. Workers (the fake worker speaking the real protocol): malformed messages, garbage before "ready",
an interrupt mid-request or mid-shutdown, the session killed outright, logs of an earlier evaluator.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import sandbox.pool as pool_mod
import traces.recorder as recorder_mod
from sandbox.candidate import Candidate
from sandbox.pool import Evaluator, WorkerStartError
from sandbox.protocol import PhaseTimeouts
from traces.loader import TraceError, load
from traces.recorder import Recorder, TraceInUse, TraceWriteError
from traces.results import FailureClass
from traces.schema import PlannerError

from .trace_fixtures import write_session


def note(i: int) -> PlannerError:
    return PlannerError(id=f"n{i}", planner="x", message=f"event {i} µs")


def failing_writes(monkeypatch, after: int, error: BaseException, fixed: list | None = None):
    """From the `after`-th write on, write half the line and raise `error` (until `fixed` is non-empty)."""
    real = recorder_mod._write_all
    count = {"n": 0}

    def write(fd, data):
        count["n"] += 1
        if count["n"] <= after or fixed:
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
    fixed: list = []
    failing_writes(monkeypatch, after=3, error=OSError(errno.ENOSPC, "No space left on device"), fixed=fixed)
    with Recorder(path) as rec:
        for i in range(3):
            rec.record(note(i))
        with pytest.raises(TraceWriteError, match="No space left"):
            rec.record(note(3))
        trace = load(path)
        assert [e.id for e in trace.events] == ["n0", "n1", "n2"] and not trace.warnings
        fixed.append(True)  # space freed: the same writer goes on
        rec.record(note(4))
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
        group = ev._worker.proc.pid
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
    ev.start()
    group = ev._worker.proc.pid
    real_read = pool_mod._Worker.read

    def read(self, deadline):
        msg = real_read(self, deadline)
        if getattr(msg, "phase", "") == "check":
            raise KeyboardInterrupt
        return msg

    monkeypatch.setattr(pool_mod._Worker, "read", read)
    with pytest.raises(KeyboardInterrupt):
        ev.evaluate(Candidate(source="fine"))
    assert ev._worker is None and wait_until(lambda: not group_members(group))


def test_a_second_ctrl_c_while_closing_still_kills_the_worker_group(tmp_path, monkeypatch):
    ev = fake_evaluator(tmp_path)
    ev.start()
    group = ev._worker.proc.pid

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
from sandbox.candidate import Candidate
from sandbox.pool import Evaluator
from sandbox.protocol import PhaseTimeouts
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
