"""Read a trace back: every complete event, the sources by hash, and what was wrong with the file."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from .schema import EVENT, SCHEMA_VERSION, Build, Decision, Evaluate, FailureEvent, Measure, Proposal, SessionStart


class TraceError(ValueError):
    """The trace cannot be trusted past a point (a corrupt line that is not the last one)."""


@dataclass
class Attempt:
    """One proposal and what became of it."""

    proposal: Proposal
    build: Build | None = None
    evaluate: Evaluate | None = None
    decision: Decision | None = None
    failure: FailureEvent | None = None

    @property
    def outcome(self) -> str:
        if self.decision is not None and self.decision.kept:
            return "kept"
        if self.failure is not None:
            return self.failure.failure.cls.value
        if self.decision is not None:
            return "reverted"
        return "unfinished"


@dataclass
class Trace:
    path: Path
    events: list = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    @property
    def start(self) -> SessionStart:
        first = self.events[0] if self.events else None
        if not isinstance(first, SessionStart):
            raise TraceError(f"{self.path}: the first event is not a session_start")
        return first

    @property
    def measure(self) -> Measure | None:
        return next((e for e in self.events if isinstance(e, Measure)), None)

    def attempts(self) -> list[Attempt]:
        by_id: dict[str, Attempt] = {}
        for e in self.events:
            if isinstance(e, Proposal):
                by_id[e.id] = Attempt(e)
            elif isinstance(e, (Build, Evaluate, Decision, FailureEvent)) and e.id in by_id:
                slot = {Build: "build", Evaluate: "evaluate", Decision: "decision", FailureEvent: "failure"}[type(e)]
                setattr(by_id[e.id], slot, e)
        return list(by_id.values())

    def source_of(self, sha: str) -> str:
        if sha not in self.sources:
            raise TraceError(f"{self.path}: source {sha[:12]} is referenced but never stored")
        return self.sources[sha]

    def version(self, vid: str) -> tuple[str, dict[str, int]]:
        """(source, knobs) of the measure or proposal with id `vid`."""
        for e in self.events:
            if isinstance(e, (Measure, Proposal)) and e.id == vid:
                return self.source_of(e.source_sha), dict(e.knobs)
        raise TraceError(f"{self.path}: no version with id {vid!r}")


def load(path: Path) -> Trace:
    """Parse every line; a torn last line (a killed writer: no final newline) is dropped with a warning.

    Lines are decoded one by one, so a multi-byte character cut by the kill is only a torn line.
    """
    path = Path(path)
    trace = Trace(path)
    lines = path.read_bytes().split(b"\n")
    if lines[-1]:
        trace.warnings.append(f"line {len(lines)} is incomplete (the writer was interrupted); ignored")
    lines.pop()
    for n, line in enumerate(lines, 1):
        event = _event(path, n, line)
        if isinstance(event, (Measure, Proposal)) and event.source is not None:
            trace.sources[event.source_sha] = event.source
        trace.events.append(event)
    return trace


def _event(path: Path, n: int, line: bytes):
    """The event on complete line `n`; anything unreadable there is a TraceError naming the line."""
    try:
        raw = json.loads(line.decode("utf-8"))
    except ValueError as e:  # UnicodeDecodeError and JSONDecodeError are both ValueErrors
        raise TraceError(f"{path}:{n}: corrupt event: {e}") from e
    if isinstance(raw, dict) and raw.get("schema_version", SCHEMA_VERSION) > SCHEMA_VERSION:
        raise TraceError(f"{path}:{n}: schema_version {raw['schema_version']} is newer than this reader")
    try:
        return EVENT.validate_python(_upgraded(raw))
    except ValidationError as e:
        raise TraceError(f"{path}:{n}: corrupt event: {e}") from e


def _upgraded(raw):
    """Traces written before planner_finished existed recorded a planner's stop as a planner_error whose
    message starts 'finished: '; read it as the stop it was."""
    if (isinstance(raw, dict) and raw.get("type") == "planner_error" and raw.get("retryable") is False
            and str(raw.get("message", "")).startswith("finished: ")):
        kept = {k: v for k, v in raw.items() if k not in ("id", "retryable", "type", "message")}
        return {**kept, "type": "planner_finished", "message": raw["message"].removeprefix("finished: ")}
    return raw
