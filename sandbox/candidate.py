"""A kernel version: CUDA source text plus knob values, with its knobs and includes validated."""

from __future__ import annotations

import hashlib
import json
import re

from pydantic import BaseModel, ConfigDict

from .source_rules import SourceRuleError, check_source

# [ \t], not \s: a pattern anchored at every line start must not run over newlines (quadratic on blank lines)
KNOB_RE = re.compile(r"^[ \t]*//[ \t]*@knob[ \t]+(\w+)[ \t]+(-?\d+)[ \t]+\{([^}\n]*)\}[ \t]*(.*)$", re.MULTILINE)
KNOB_LOOSE_RE = re.compile(r"^[ \t]*//[ \t]*@knob\b.*$", re.MULTILINE)
MAX_SOURCE_CHARS = 1_000_000   # the seed is 88 KB; a planner's edits must not grow a source without bound


class CandidateError(ValueError):
    """The source breaks a rule of the sandbox (bad knob declaration, a directive or include it may not use)."""


class Knob(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    default: int
    values: tuple[int, ...]
    doc: str = ""


class Candidate(BaseModel):
    """What the planner controls: the source and the knob values (defaults fill the rest)."""

    model_config = ConfigDict(frozen=True)

    source: str
    knobs: dict[str, int] = {}

    @property
    def source_sha(self) -> str:
        return source_sha256(self.source)

    def resolved_knobs(self) -> dict[str, int]:
        return resolve_knobs(parse_knobs(self.source), self.knobs)

    def key(self, extra: str = "") -> str:
        """Build key: source, resolved knobs and whatever else determines the binary (options, arch, versions)."""
        blob = json.dumps({"src": self.source_sha, "knobs": self.resolved_knobs(), "extra": extra}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()


def source_sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def parse_knobs(source: str) -> list[Knob]:
    """`// @knob NAME DEFAULT {v1,v2,...} [what it does]` lines, in order; malformed or duplicates are errors."""
    if len(source) > MAX_SOURCE_CHARS:
        raise CandidateError(f"the source has {len(source):,} characters; at most {MAX_SOURCE_CHARS:,} are accepted")
    knobs: dict[str, Knob] = {}
    well_formed = {m.start() for m in KNOB_RE.finditer(source)}
    for m in KNOB_LOOSE_RE.finditer(source):
        if m.start() not in well_formed:
            raise CandidateError(f"malformed knob declaration: {m.group(0).strip()!r} "
                                 "(expected '// @knob NAME DEFAULT {v1,v2,...}')")
    for m in KNOB_RE.finditer(source):
        name, default = m.group(1), int(m.group(2))
        try:
            values = tuple(int(v) for v in m.group(3).split(",") if v.strip())
        except ValueError as e:
            raise CandidateError(f"knob {name}: values must be integers: {{{m.group(3)}}}") from e
        if name in knobs:
            raise CandidateError(f"knob {name} is declared twice")
        if default not in values:
            raise CandidateError(f"knob {name}: default {default} is not one of {values}")
        knobs[name] = Knob(name=name, default=default, values=values, doc=m.group(4).strip())
    return list(knobs.values())


def resolve_knobs(declared: list[Knob], values: dict[str, int]) -> dict[str, int]:
    """Defaults overridden by `values`; unknown names and undeclared values are errors."""
    by_name = {k.name: k for k in declared}
    unknown = sorted(set(values) - set(by_name))
    if unknown:
        raise CandidateError(f"unknown knob(s) {unknown}; declared: {sorted(by_name)}")
    out = {k.name: k.default for k in declared}
    for name, v in values.items():
        if int(v) not in by_name[name].values:
            raise CandidateError(f"knob {name}={v} is not one of {by_name[name].values}")
        out[name] = int(v)
    return out


def check_preprocessing(source: str) -> None:
    """The source's includes, pragmas and other directives follow sandbox.source_rules, and it uses none of
    the header macros that would undo them."""
    from .compiler import cuda_include_dirs
    from .header_macros import dangerous_header_macros

    try:
        check_source(source, dangerous_header_macros(cuda_include_dirs()))
    except SourceRuleError as e:
        raise CandidateError(str(e)) from e


def with_knob_defaults(source: str, knobs: dict[str, int]) -> str:
    """The source with each knob's declared default set to `knobs` (a standalone file of that version)."""
    resolve_knobs(parse_knobs(source), knobs)

    def sub(m: re.Match) -> str:
        if m.group(1) not in knobs:
            return m.group(0)
        i, j = m.start(2) - m.start(0), m.end(2) - m.start(0)
        return m.group(0)[:i] + str(knobs[m.group(1)]) + m.group(0)[j:]

    return KNOB_RE.sub(sub, source)


def validate(candidate: Candidate) -> dict[str, int]:
    """Everything checkable without a compiler; returns the resolved knob values."""
    check_preprocessing(candidate.source)
    return candidate.resolved_knobs()
