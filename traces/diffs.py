"""What each kept version changed: its source and knobs against its parent's, from the sources the trace
stores (the same diff as `compare --diff`)."""

from __future__ import annotations

import difflib

from megakernel_agent.sandbox.candidate import Candidate

from .loader import Trace
from .sections import Blocks


def _named(trace: Trace, vid: str) -> str:
    name = next((e.name for e in trace.events if e.type == "proposal" and e.id == vid), "")
    return f"{vid} ({name})" if name else vid


def diff_text(label_a: str, a: Candidate, label_b: str, b: Candidate) -> str:
    """Unified source diff of two versions, then their resolved knob values that differ."""
    lines = list(difflib.unified_diff(a.source.splitlines(), b.source.splitlines(), label_a, label_b, lineterm=""))
    ka, kb = a.resolved_knobs(), b.resolved_knobs()
    changed = {k: (ka.get(k), kb.get(k)) for k in sorted(set(ka) | set(kb)) if ka.get(k) != kb.get(k)}
    if changed:
        lines.append("knobs: " + ", ".join(f"{k} {x}->{y}" for k, (x, y) in changed.items()))
    return "\n".join(lines) or "(identical source and knobs)"


def kept_diffs(trace: Trace) -> Blocks:
    items = []
    for a in trace.attempts():
        if a.outcome != "kept":
            continue
        p = a.proposal
        parent, child = (Candidate(source=s, knobs=k) for s, k in (trace.version(p.parent_id), trace.version(p.id)))
        heading = f"{_named(trace, p.id)} against its parent {_named(trace, p.parent_id)}"
        items.append((heading, diff_text(p.parent_id, parent, p.id, child)))
    return Blocks("Kept changes", "Each kept version's unified diff and knob changes against the version it was "
                  "proposed on.", items)
