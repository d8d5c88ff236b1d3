"""A kernel source as a planner reads it: an outline (banner sections and top-level definitions with
line ranges) and numbered excerpts by line range or by symbol, so no one has to resend 88 KB."""

from __future__ import annotations

import re

from pydantic import BaseModel

BANNER = re.compile(r"^//\s*=+\s*(.+?)\s*=+\s*$")
DEFINITION = re.compile(
    r"^(?:extern \"C\"\s+)?(?:template\s*<[^>]*>\s*)?"
    r"(?:(?:static|inline|constexpr|__device__|__global__|__host__|__forceinline__|__noinline__|const)\s+)*"
    r"(?:(?P<kind>struct|enum|class|union)\s+(?P<type>\w+)|[\w:<>,\*&\s]+?\b(?P<func>\w+)\s*\()")
CONSTANT = re.compile(r"^(?:static\s+)?constexpr\s+[\w:<>]+\s+(?P<name>\w+)\s*=")
MAX_READ_LINES = 400


class Symbol(BaseModel):
    name: str
    kind: str
    start: int
    end: int


def _definition_end(lines: list[str], start: int) -> int:
    """Last line (1-based) of the definition starting at `start`: where its braces close, or its `;`."""
    depth, opened = 0, False
    for i in range(start - 1, len(lines)):
        code = lines[i].split("//", 1)[0]
        depth += code.count("{") - code.count("}")
        opened = opened or "{" in code
        if (opened and depth <= 0) or (not opened and code.rstrip().endswith(";")):
            return i + 1
    return len(lines)


def symbols(source: str) -> list[Symbol]:
    """Top-level definitions (column 0): functions, kernels, structs/enums and constexpr constants."""
    lines = source.splitlines()
    out: list[Symbol] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line[:1].isspace() or line.startswith(("//", "#")) or not line.strip():
            i += 1
            continue
        const = CONSTANT.match(line)
        m = DEFINITION.match(line)
        if const:
            end = _definition_end(lines, i + 1)
            out.append(Symbol(name=const.group("name"), kind="constant", start=i + 1, end=end))
        elif m and (m.group("type") or m.group("func")):
            name = m.group("type") or m.group("func")
            if name == "__launch_bounds__" and i + 1 < len(lines):   # the entry's name opens the next line
                name = (re.match(r"\s*(\w+)", lines[i + 1]) or m).group(1)
            kind = m.group("kind") or ("kernel" if "__global__" in line or "__global__" in lines[i - 1 if i else 0]
                                       else "function")
            out.append(Symbol(name=name, kind=kind, start=i + 1, end=_definition_end(lines, i + 1)))
        i = out[-1].end if out and out[-1].start == i + 1 else i + 1
    return out


def outline(source: str) -> str:
    """Sections (banner comments) and the definitions in each, with line ranges."""
    lines = source.splitlines()
    banners = [(i + 1, m.group(1)) for i, line in enumerate(lines) if (m := BANNER.match(line))]
    syms = symbols(source)
    out = [f"{len(lines)} lines; {len(syms)} top-level definitions"]
    edges = [(1, "header")] + banners + [(len(lines) + 1, "")]
    for (start, title), (nxt, _) in zip(edges, edges[1:], strict=False):
        inside = [s for s in syms if start <= s.start < nxt]
        if nxt <= start or (title == "header" and not inside and start == nxt):
            continue
        out.append(f"lines {start}-{nxt - 1}: == {title} ==")
        out += _grouped(inside)
    return "\n".join(out)


def _grouped(syms: list[Symbol]) -> list[str]:
    """One line per definition, runs of constants folded into one line."""
    out: list[str] = []
    run: list[Symbol] = []
    for s in syms + [Symbol(name="", kind="", start=0, end=0)]:
        if s.kind == "constant":
            run.append(s)
            continue
        if run:
            out.append(f"  {run[0].start}-{run[-1].end} constants {', '.join(c.name for c in run)}")
            run = []
        if s.name:
            out.append(f"  {s.start}-{s.end} {s.kind} {s.name}")
    return out


def read(source: str, start: int | None = None, end: int | None = None, symbol: str | None = None) -> str:
    """Numbered lines `start`..`end` (1-based, inclusive) or every definition named `symbol`."""
    lines = source.splitlines()
    if symbol:
        found = [s for s in symbols(source) if s.name == symbol]
        if not found:
            near = sorted({s.name for s in symbols(source) if symbol.lower() in s.name.lower()})[:10]
            raise ValueError(f"no top-level definition named {symbol!r}" + (f"; similar: {near}" if near else ""))
        return "\n\n".join(read(source, s.start, s.end) for s in found)
    start = max(1, start or 1)
    end = min(len(lines), end or start + MAX_READ_LINES - 1)
    if end < start:
        raise ValueError(f"empty range {start}-{end} (the source has {len(lines)} lines)")
    if end - start + 1 > MAX_READ_LINES:
        end = start + MAX_READ_LINES - 1
    width = len(str(end))
    return "\n".join(f"{n:>{width}}| {lines[n - 1]}" for n in range(start, end + 1))
