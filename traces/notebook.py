"""The session notebook as tables: predictions against outcomes, the planner's notes, its tool calls and
what the LLM cost. Read from a trace alone (the report renders these)."""

from __future__ import annotations

import json

from .loader import Trace
from .render import shown_outcome
from .schema import LLM_EVENTS
from .sections import Table
from .timings import of_record


def _us(values: dict[int, float]) -> str:
    return " / ".join(f"{u:.1f}" for _, u in sorted(values.items())) or "-"


def predictions(trace: Trace) -> Table:
    """id, name, parent, hypothesis, predicted µs, measured µs (per context, the timing of record), outcome: for
    each proposal that made a prediction."""
    records, rows = of_record(trace), []
    for a in trace.attempts():
        p = a.proposal
        if not p.predicted_us and not p.predicted_phases:
            continue
        t = records.get(p.id)
        measured = {c: t.median(c) for c in t.samples} if t else {}
        phases = ", ".join(f"{k} {v:.1f}" for k, v in p.predicted_phases.items())
        rows.append([p.id, p.name, p.parent_id, p.hypothesis[:160], _us(p.predicted_us) + (f" ({phases})" if phases
                     else ""), _us(measured), shown_outcome(a)])
    return Table("Predictions against outcomes", "The planner's predicted µs/token per context against each "
                 "version's timing of record.", ["id", "name", "parent", "hypothesis", "predicted µs", "measured µs",
                                                  "outcome"], rows)


def notes(trace: Trace) -> Table:
    return Table("Notebook", "The planner's notes.", ["at", "kind", "note", "about"],
                 [[e.at[11:19], e.kind, e.text, ", ".join(e.refs)] for e in trace.events if e.type == "note"])


def tool_calls(trace: Trace) -> Table:
    rows = [[e.id, e.tool, json.dumps(e.input)[:120], e.summary[:200], f"{e.device_s:.1f}", "ok" if e.ok else "failed"]
            for e in trace.events if e.type == "tool_call"]
    return Table("Tool calls", "What the planner asked for, what came back and the GPU seconds it held.",
                 ["id", "tool", "input", "result", "GPU s", ""], rows)


def llm_line(trace: Trace) -> str:
    """Calls, tokens (cache reads and writes apart) and cost of every LLM call the trace records."""
    usages = [e.llm for e in trace.events
              if e.type in LLM_EVENTS and e.llm is not None]
    if not usages:
        return ""
    s = {k: sum(getattr(u, k) for u in usages) for k in ("calls", "input_tokens", "output_tokens",
                                                         "cache_read_tokens", "cache_write_tokens", "cost_usd")}
    return (f"{s['calls']} calls; tokens in {s['input_tokens']:,}, out {s['output_tokens']:,}, cache read "
            f"{s['cache_read_tokens']:,}, cache write {s['cache_write_tokens']:,}; ${s['cost_usd']:.2f}")


SECTIONS = (predictions, notes, tool_calls)
