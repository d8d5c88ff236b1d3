"""Append-only trace writer: one event per line, written whole and fsynced before `record` returns.

A killed session leaves every completed event readable. The writer holds an exclusive lock on the trace
for its lifetime (one session appends at a time), cuts a torn last line left by a killed writer aside
before appending (so nothing is glued onto it), and undoes a partial write (disk full): the file always
ends with a complete line. Secrets never reach the file (see traces.redaction).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from pydantic import BaseModel

from .loader import Trace, load
from .redaction import redact
from .schema import Measure, Proposal


class TraceInUse(RuntimeError):
    """Another writer (another session) holds the trace."""


class TraceWriteError(RuntimeError):
    """An event could not be written (disk full, I/O error); the trace still ends with a complete line."""


class Recorder:
    """Appends events to `path`; `existing` is what the file held when it was opened (a resumed session's past)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            _lock(self._fd, self.path)
            self._size = _cut_torn_tail(self._fd, self.path)
            self.existing = load(self.path) if self._size else Trace(self.path)
        except BaseException:
            os.close(self._fd)
            raise
        self._sources: set[str] = set(self.existing.sources)
        self.broken: str | None = None

    def record(self, event: BaseModel) -> BaseModel:
        """Write one event durably; a source text is kept only on its first appearance.

        Raises TraceWriteError when the line cannot be written whole; the partial line is removed first.
        """
        if self.broken:
            raise TraceWriteError(f"{self.path}: not writable since an earlier failure: {self.broken}")
        if isinstance(event, (Proposal, Measure)):
            if event.source_sha in self._sources:
                event = event.model_copy(update={"source": None})
            elif event.source is None:
                raise ValueError(f"first use of source {event.source_sha[:12]} must carry its text")
        data = (redact(event.model_dump_json()) + "\n").encode("utf-8")
        try:
            _write_all(self._fd, data)
            os.fsync(self._fd)
        except OSError as e:
            self._undo_partial_write(e)
            raise TraceWriteError(f"{self.path}: could not write a {event.type} event: {e}") from e
        except BaseException as e:  # an interrupt mid-line: leave no torn line behind, then let it through
            self._undo_partial_write(e)
            raise
        self._size += len(data)
        if isinstance(event, (Proposal, Measure)):
            self._sources.add(event.source_sha)
        return event

    def _undo_partial_write(self, cause: BaseException) -> None:
        """Cut the file back to its last complete line; if even that fails, refuse every later write."""
        try:
            os.ftruncate(self._fd, self._size)
        except OSError as e:
            self.broken = f"{cause!r}; cutting back the partial line failed too: {e}"

    def close(self) -> None:
        """Release the lock (closing the file does); safe to call twice."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _write_all(fd: int, data: bytes) -> None:
    """os.write until every byte is out (a write may be partial)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _lock(fd: int, path: Path) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _lock_holder(fd)
        who = f" (pid {holder})" if holder else ""
        raise TraceInUse(f"trace {path} is in use by another session{who}") from None


def _lock_holder(fd: int) -> int | None:
    """The pid holding a flock on the file behind `fd`, as /proc/locks tells it (Linux), or None."""
    st = os.fstat(fd)
    ident = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == ident:
            return int(fields[4])
    return None


def _cut_torn_tail(fd: int, path: Path) -> int:
    """Move bytes after the last newline into `<trace>.torn-<n>` and cut them off; returns the new size."""
    size = os.fstat(fd).st_size
    if size == 0:
        return 0
    with open(path, "rb") as f:
        data = f.read()
    end = data.rfind(b"\n") + 1
    if end == len(data):
        return size
    n = 1
    while True:
        try:
            side = os.open(f"{path}.torn-{n}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            break
        except FileExistsError:
            n += 1
    try:
        _write_all(side, data[end:])
        os.fsync(side)
    finally:
        os.close(side)
    os.ftruncate(fd, end)
    os.fsync(fd)
    return end
