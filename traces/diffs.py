"""What each kept version changed: its source and knobs against its parent's, from the sources the trace
stores (the same diff as `compare --diff`)."""

from __future__ import annotations

from agent.compare import Version, diff_text
from sandbox.candidate import Candidate

from .loader import Trace
from .sections import Blocks


def _named(trace: Trace, vid: str) -> str:
    name = next((e.name for e in trace.events if e.type == "proposal" and e.id == vid), "")
    return f"{vid} ({name})" if name else vid


def kept_diffs(trace: Trace) -> Blocks:
    items = []
    for a in trace.attempts():
        if a.outcome != "kept":
            continue
        p = a.proposal
        parent, child = (Version(vid, Candidate(source=s, knobs=k)) for vid, (s, k) in
                         ((p.parent_id, trace.version(p.parent_id)), (p.id, trace.version(p.id))))
        heading = f"{_named(trace, p.id)} against its parent {_named(trace, p.parent_id)}"
        items.append((heading, diff_text(parent, child)))
    return Blocks("Kept changes", "Each kept version's unified diff and knob changes against the version it was "
                  "proposed on.", items)
