"""Warp stall samples of one Kimi step by source function, from Nsight Compute's source page (cuda,sass CSV).

`gpu_suite.sh stalls` profiles one seed step under ncu (scripts/kimi_stall_profile.py) and exports
`--page source --csv --print-source cuda,sass`. There every SASS row follows a source line it came from; an
instruction that serves several lines (inlined helpers) is listed under each, and this counts it once, under its
first listing, which in this kernel's profiles is the innermost line (ncu lists header files first, and helpers
are defined above their callers; a forward-declared function is the exception, and takes a few instructions of
its callers). ncu cannot open NVRTC's source file, so the lines come as numbers only; this rebuilds the compiled
text (the task's prelude + the kernel source, as the build joins them), finds the function each line sits in
(named with its first line, `name:line`, since overloads and member functions share names), and sums the samples
per function. It also counts instructions and "no instruction" samples by how often an instruction ran per
warp, averaged over every warp of the grid: code that ran at most about once per warp is code a phase runs once,
usually cold; code that only some warps run lands lower than it ran on them.

Usage: python3 scripts/kimi_stall_table.py STALLS_CUDA_SASS.csv[.gz] [KERNEL.cu] [--top 30]
"""

from __future__ import annotations

import argparse
import bisect
import csv
import gzip
import re
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

COLUMNS = {"samples": "Warp Stall Sampling (All Samples)", "no_inst": "stall_no_inst", "long_sb": "stall_long_sb",
           "barrier": "stall_barrier", "wait": "stall_wait", "selected": "stall_selected",
           "executed": "Instructions Executed"}
QUALIFIERS = re.compile(r"__launch_bounds__\s*\([^)]*\)|__(device|global|forceinline|noinline)__|extern\s+\"C\"")
NAME = re.compile(r"([A-Za-z_]\w*)\s*\(")


@dataclass
class SassRow:
    """One SASS instruction of the profile: its address, the file and line it came from, its sample counts."""

    address: str
    file: str
    line: int | None
    counts: dict[str, int]


def function_starts(text: str) -> list[tuple[int, str]]:
    """(1-based line, name) of every __device__ / __global__ function definition, in line order. A declaration
    (a `;` before any `{`) is not one; a name on the next line is taken only after `__launch_bounds__(...)`."""
    lines = text.splitlines()
    starts = []
    for i, raw in enumerate(lines):
        if raw.lstrip().startswith("//") or not re.search(r"__(device|global)__", raw):
            continue
        rest = QUALIFIERS.sub(" ", raw)
        m = NAME.search(rest)
        span = raw
        if m is None and "__launch_bounds__" in raw and i + 1 < len(lines) and "=" not in lines[i + 1]:
            m, span = NAME.search(lines[i + 1]), raw + lines[i + 1]
        body, decl = span.find("{"), span.find(";")
        if m and not (decl >= 0 and (body < 0 or decl < body)):
            starts.append((i + 1, m.group(1)))
    return starts


def enclosing(starts: list[tuple[int, str]], line: int) -> str:
    """`name:line` of the function whose definition is the last one at or before `line` ("(prelude)" before the
    first)."""
    k = bisect.bisect_right([s for s, _ in starts], line) - 1
    return "(prelude)" if k < 0 else f"{starts[k][1]}:{starts[k][0]}"


def read_rows(path: Path) -> list[SassRow]:
    """The SASS rows of an ncu cuda,sass source-page CSV, each with the source line above it. The page lists an
    instruction under every line it serves; it counts once, under the first."""
    rows: list[SassRow] = []
    seen: set[str] = set()
    header: dict[str, int] | None = None
    file, line = "", None
    with (gzip.open(path, "rt", newline="") if path.suffix == ".gz" else path.open(newline="")) as fh:
        for r in csv.reader(fh):
            if not r:
                continue
            if r[0] == "File Path":
                file, header = r[1], None
            elif r[0] == "Line No":
                header = {h: i for i, h in enumerate(r)}
            elif header is None or r[0] == "Function Name":
                continue
            elif r[0]:
                line = int(r[0]) if r[0].isdigit() else None
            elif len(r) > 2 and r[2] not in ("", "...", "-") and r[2] not in seen:
                seen.add(r[2])
                counts = {k: int(r[header[c]]) if r[header[c]].isdigit() else 0 for k, c in COLUMNS.items()}
                rows.append(SassRow(r[2], file, line, counts))
    return rows


RUNS_BUCKETS = ("never", "<= 1", "<= 4", "<= 16", "> 16")


def runs_bucket(runs: float) -> str:
    """How often an instruction ran per warp, as a coarse bucket."""
    if runs == 0:
        return "never"
    return next((f"<= {b}" for b in (1, 4, 16) if runs <= b), "> 16")


def tabulate(rows: list[SassRow], compiled_text: str, warps: int) -> tuple[dict[str, Counter], dict[str, Counter]]:
    """Counts per function (kernel lines) or per header file, and per runs-per-warp bucket (instructions and
    no-instruction samples)."""
    starts = function_starts(compiled_text)
    per: dict[str, Counter] = defaultdict(Counter)
    by_runs: dict[str, Counter] = defaultdict(Counter)
    for row in rows:
        own = row.file.endswith(".cu") and row.line is not None
        key = enclosing(starts, row.line) if own else Path(row.file).name or "(unknown)"
        per[key].update(row.counts)
        per[key]["instructions"] += 1
        bucket = by_runs[runs_bucket(row.counts["executed"] / warps)]
        bucket["instructions"] += 1
        bucket["no_inst"] += row.counts["no_inst"]
    return per, by_runs


def main() -> None:
    from rich.console import Console
    from rich.table import Table

    from megakernel_agent.tasks.kimi_linear.megakernel import kernel_prelude
    from megakernel_agent.tasks.kimi_linear.task import KimiTask

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", type=Path)
    ap.add_argument("kernel", type=Path, nargs="?", default=None)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--warps", type=int, default=264 * 8, help="warps in the grid (blocks x warps per block)")
    args = ap.parse_args()
    task = KimiTask("full")
    kernel = args.kernel or ROOT / task.spec.seed_kernel
    per, by_runs = tabulate(read_rows(args.csv), kernel_prelude(task.cfg) + kernel.read_text(), args.warps)
    total = sum(per.values(), Counter())
    cols = ("instructions", "samples", "no_inst", "long_sb", "barrier", "wait", "selected")
    t = Table(title=f"{kernel.name}: warp stall samples by function, most 'no instruction' first "
                    f"({total['samples']} samples, {total['no_inst']} no instruction)")
    t.add_column("function")
    for c in cols:
        t.add_column(c, justify="right")
    for name, c in sorted(per.items(), key=lambda kv: -kv[1]["no_inst"])[:args.top]:
        t.add_row(name, *(str(c[k]) for k in cols))
    console = Console(width=140)
    console.print(t)
    console.print("by runs per warp (SASS instructions, KiB of code at 16 B each, no-instruction samples): " +
                  "; ".join(f"{k}: {by_runs[k]['instructions']}, {by_runs[k]['instructions'] * 16 / 1024:.0f} KiB, "
                            f"{by_runs[k]['no_inst']}" for k in RUNS_BUCKETS))


if __name__ == "__main__":
    main()
