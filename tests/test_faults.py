"""Faults that could lose work, injected on the CPU: each ends cleanly or goes on, loses no recorded event,
leaves a trace that loads, and orphans no process.

Traces: torn last lines, a torn multi-byte character, disk full mid-write, an interrupt mid-line, two
writers.
"""

from __future__ import annotations

import errno
import os

import pytest

import traces.recorder as recorder_mod
from traces.loader import TraceError, load
from traces.recorder import Recorder, TraceInUse, TraceWriteError
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
