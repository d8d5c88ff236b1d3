"""Every version a session evaluated: source, knobs, parent, outcome, timings, resources, phase timelines.

Planners name parents from it (any version, not only the best: stacking two near-misses found several
of the seed's wins) and the session refuses an exact duplicate (same source, same resolved knobs)
before it reaches the GPU. Which version is the *best* is not decided here (agent.decision).
"""

from __future__ import annotations

import hashlib
import json

from pydantic import BaseModel

from megakernel_agent.sandbox.candidate import Candidate, CandidateError
from megakernel_agent.traces.loader import Trace
from megakernel_agent.traces.results import EvalResult, PhaseTimeline

CORRECT = ("measured", "kept", "slower")
IN_FLIGHT = "in flight"
OWN_FAILURES = ("wrong", "build", "crash", "timeout")


class ArchivedVersion(BaseModel):
    id: str
    parent_id: str | None = None
    name: str = ""
    hypothesis: str = ""
    source_sha: str
    knobs: dict[str, int] = {}
    outcome: str
    message: str = ""
    us_per_ctx: dict[int, float] = {}
    registers: int | None = None
    spill_bytes: int | None = None
    local_bytes: int | None = None
    phases: list[PhaseTimeline] = []

    @property
    def correct(self) -> bool:
        """Passed every check (the start, a kept version, or one that was correct but not faster)."""
        return self.outcome in CORRECT

    def line(self) -> str:
        """One line for a planner: id, name, parent, outcome, µs per context, resources."""
        us = "/".join(f"{u:.1f}" for _, u in sorted(self.us_per_ctx.items())) or "-"
        res = f" regs {self.registers} spills {self.spill_bytes}B" if self.registers is not None else ""
        label = f" '{self.name}'" if self.name else ""
        return f"{self.id}{label} <- {self.parent_id or '-'} [{self.outcome}] µs {us}{res}: {self.hypothesis[:120]}"


def version_key(source: str, knobs: dict[str, int]) -> str | None:
    """Source hash plus resolved knob values; None when the knob declarations are broken (no duplicate then)."""
    try:
        resolved = Candidate(source=source, knobs=knobs).resolved_knobs()
    except CandidateError:
        return None
    blob = json.dumps({"src": hashlib.sha256(source.encode()).hexdigest(), "knobs": resolved}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


class Archive:
    def __init__(self) -> None:
        self._versions: dict[str, ArchivedVersion] = {}
        self._sources: dict[str, str] = {}
        self._explicit_knobs: dict[str, dict[str, int]] = {}
        self._keys: dict[str, str] = {}

    def add(self, version: ArchivedVersion, source: str, explicit_knobs: dict[str, int],
            retryable: bool = False) -> None:
        """Record a version (again, when an attempt in flight is decided); a retryable failure (our side broke) does
        not block proposing it again."""
        self._versions[version.id] = version
        self._sources[version.source_sha] = source
        self._explicit_knobs[version.id] = dict(explicit_knobs)
        key = version_key(source, explicit_knobs)
        if key is None:
            return
        if not retryable:
            self._keys.setdefault(key, version.id)
        elif self._keys.get(key) == version.id:   # it was in flight; failed on our side, so it may come again
            del self._keys[key]

    def add_phases(self, vid: str, phases: list[PhaseTimeline]) -> None:
        self._versions[vid].phases = phases

    def __contains__(self, vid: str) -> bool:
        return vid in self._versions

    def get(self, vid: str) -> ArchivedVersion:
        return self._versions[vid]

    def source(self, vid: str) -> str:
        return self._sources[self._versions[vid].source_sha]

    def explicit_knobs(self, vid: str) -> dict[str, int]:
        """The knob values set on this version (not its source's defaults): what a child inherits."""
        return dict(self._explicit_knobs[vid])

    def resolve(self, ref: str) -> str:
        """A version id or a planner-given name -> the id; KeyError with the choices otherwise."""
        if ref in self._versions:
            return ref
        named = [v.id for v in self._versions.values() if v.name == ref]
        if len(named) == 1:
            return named[0]
        known = ", ".join(list(self._versions)[-12:])
        raise KeyError(f"no version {ref!r}" + (" (the name is ambiguous)" if named else "") + f"; latest: {known}")

    def name_taken(self, name: str) -> bool:
        return any(v.name == name for v in self._versions.values())

    def duplicate_of(self, source: str, knobs: dict[str, int]) -> str | None:
        key = version_key(source, knobs)
        return self._keys.get(key) if key is not None else None

    def versions(self) -> list[ArchivedVersion]:
        return list(self._versions.values())

    def correct(self, ctx: int | None = None) -> list[ArchivedVersion]:
        """Correct versions, fastest first at `ctx` (default: the largest timed context)."""
        good = [v for v in self._versions.values() if v.correct and v.us_per_ctx]
        if not good:
            return []
        at = ctx if ctx is not None else max(good[0].us_per_ctx)
        return sorted(good, key=lambda v: v.us_per_ctx.get(at, float("inf")))

    def repair_depth(self, vid: str) -> int:
        """How many versions that failed on their own account (wrong, did not build, crashed, hung) end at
        `vid` in a row (0 for a correct one, or one refused for reasons outside it)."""
        depth = 0
        while vid in self._versions and self._versions[vid].outcome in OWN_FAILURES:
            depth += 1
            vid = self._versions[vid].parent_id or ""
        return depth

    @classmethod
    def from_trace(cls, trace: Trace) -> Archive:
        """The archive a recorded session had built (for resuming it, or replaying it)."""
        archive = cls()
        m = trace.measure
        if m is not None:
            archive.add(archived(m.id, None, "", "starting kernel", m.source_sha, "measured", "", m.result),
                        trace.source_of(m.source_sha), dict(m.knobs))
        for a in trace.attempts():
            p = a.proposal
            res = a.evaluate.result if a.evaluate else None
            if res is not None and a.build is not None:
                res = res.model_copy(update={"build": a.build.result})
            failure = a.failure.failure if a.failure else None
            outcome = a.outcome
            message = failure.message if failure else (a.decision.reason if a.decision else "")
            archive.add(archived(p.id, p.parent_id, p.name, p.hypothesis, p.source_sha, outcome, message, res),
                        trace.source_of(p.source_sha), dict(p.knobs),
                        retryable=outcome == "unfinished" or bool(failure and failure.retryable))
        return archive


def archived(vid: str, parent: str | None, name: str, hypothesis: str, source_sha: str, outcome: str, message: str,
             res: EvalResult | None) -> ArchivedVersion:
    """An archive entry from an evaluation result (resources from its build, timings by context)."""
    build = res.build if res is not None else None
    r = build.resources if build is not None and build.resources else None
    return ArchivedVersion(
        id=vid, parent_id=parent, name=name, hypothesis=hypothesis, source_sha=source_sha,
        knobs=res.knobs if res is not None else {}, outcome=outcome, message=message[:2000],
        us_per_ctx={t.ctx: t.median_us for t in res.timings} if res is not None else {},
        registers=r.registers if r else None, local_bytes=r.local_bytes if r else None,
        spill_bytes=build.spill_bytes if build is not None and r else None,
        phases=list(res.phases) if res is not None else [])


def in_flight(vid: str, parent: str, planned, cand: Candidate) -> ArchivedVersion:
    """The archive entry of a version proposed and not decided yet: planners see it (and do not propose it again)."""
    try:
        knobs = cand.resolved_knobs()
    except CandidateError:
        knobs = dict(cand.knobs)
    return ArchivedVersion(id=vid, parent_id=parent, name=planned.name, hypothesis=planned.hypothesis,
                           source_sha=cand.source_sha, knobs=knobs, outcome=IN_FLIGHT)
