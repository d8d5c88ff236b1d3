"""Append-only trace writer: one event per line, flushed and fsynced before `record` returns.

A killed session leaves every completed event readable. Secrets never reach the file: the value
of every *_API_KEY / *_TOKEN environment variable and anything shaped like an API key or an
authorization header is replaced before the line is written.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from pydantic import BaseModel

from .schema import Measure, Proposal

REDACTED = "[REDACTED]"
SECRET_PATTERNS = [
    re.compile(r"sk-ant-[A-Za-z0-9_\-]{8,}"),
    re.compile(r"sk-[A-Za-z0-9]{20,}"),
    re.compile(r"(?i)(x-api-key|authorization|api[_-]?key)(\\?\"?\s*[:=]\s*\\?\"?)(bearer\s+)?[A-Za-z0-9_\-\.]{8,}"),
]
SECRET_ENV = re.compile(r"(API_KEY|TOKEN|SECRET|PASSWORD)$")


def redact(text: str) -> str:
    for name, value in os.environ.items():
        if SECRET_ENV.search(name) and len(value) >= 8:
            text = text.replace(value, REDACTED)
    text = SECRET_PATTERNS[0].sub(REDACTED, text)
    text = SECRET_PATTERNS[1].sub(REDACTED, text)
    return SECRET_PATTERNS[2].sub(lambda m: m.group(1) + m.group(2) + REDACTED, text)


class Recorder:
    """Writes events to `path` (appending: a resumed session continues the same file)."""

    def __init__(self, path: Path, known_sources: set[str] | None = None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.path, "a", encoding="utf-8")
        self._sources: set[str] = set(known_sources or ())

    def record(self, event: BaseModel) -> BaseModel:
        """Write one event durably; a source text is kept only on its first appearance."""
        if isinstance(event, (Proposal, Measure)):
            if event.source_sha in self._sources:
                event = event.model_copy(update={"source": None})
            elif event.source is None:
                raise ValueError(f"first use of source {event.source_sha[:12]} must carry its text")
            self._sources.add(event.source_sha)
        line = redact(event.model_dump_json())
        self._fh.write(line + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())
        return event

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
