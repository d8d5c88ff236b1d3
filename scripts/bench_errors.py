"""Errors and attention spans from `run_agent.py bench --json` files, side by side: what a precision change costs
against the fp32 reference (rel-L2 of the output and of the worst later-layer tensor over the checked cases; the
fresh seeds differ between runs, so the fixed seed 0's first step is shown apart) and what it buys in the stamped
timeline (with --phases). Usage: python scripts/bench_errors.py A.json B.json ...
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from megakernel_agent.traces.results import CheckCase, EvalResult  # noqa: E402


def rel_l2(case: CheckCase, tensor_class: str) -> float | None:
    """The largest rel-L2 of a class of tensors in one checked case (None: the case has none)."""
    values = [t.rel_l2 for t in case.tensors if t.tensor_class == tensor_class]
    return max(values) if values else None


def fmt(value: float | None) -> str:
    """A table cell: four decimals, or a dash where a run has no such tensor."""
    return "-" if value is None else f"{value:.4f}"


def main(paths: list[str]) -> None:
    console = Console(width=200)
    table = Table(title="checked cases: rel-L2 against the fp32 reference")
    for column in ("result", "passed", "cases", "out median", "out max", "later max", "seed 0 out / later"):
        table.add_column(column, justify="right")
    for path in paths:
        r = EvalResult.model_validate_json(Path(path).read_text())
        cases = r.check.cases if r.check else []
        outs = [v for v in (rel_l2(c, "out") for c in cases) if v is not None]
        later = [v for v in (rel_l2(c, "later") for c in cases) if v is not None]
        first = next((c for c in cases if c.seed == 0 and c.kind == "step" and rel_l2(c, "out") is not None), None)
        table.add_row(Path(path).stem, str(bool(r.check and r.check.passed)), str(len(cases)),
                      fmt(statistics.median(outs) if outs else None), fmt(max(outs, default=None)),
                      fmt(max(later, default=None)),
                      f"{fmt(rel_l2(first, 'out'))} / {fmt(rel_l2(first, 'later'))}" if first else "-")
        for timeline in r.phases:
            spans = {row.name: row.span_us for row in timeline.rows}
            mla = {k: v for k, v in spans.items() if any(w in k for w in ("absorb", "attention", "merge"))}
            shown = ", ".join(f"{k} {v:.1f}" for k, v in mla.items())
            console.print(f"{Path(path).stem} @ {timeline.ctx}: {shown}; all spans {sum(spans.values()):.1f} µs")
    console.print(table)


if __name__ == "__main__":
    main(sys.argv[1:])
