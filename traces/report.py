"""Session reports: HTML (plots embedded) or Markdown (plots beside it), from a trace alone.

One figure per version throughout (its timing of record) and one baseline per session, both named in the
summary, so the summary line, the tables and the plots agree with `replay`'s timeline.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path

from .diffs import kept_diffs
from .loader import Trace
from .notebook import SECTIONS, llm_line
from .plots import plots
from .sections import Blocks, Table, failures, per_context, resources, timeline_table
from .timings import best_id, of_record, session_baseline

SHORT = 32       # characters: a cell this short (a number, an interval) never wraps in HTML
OPEN_LINES = 30  # a diff shorter than this is shown open in HTML
MISMATCH = 0.05   # µs: the session's own figures and the trace's agree within rounding


def _per_ctx(values: dict[int, float], fmt: str = ".1f") -> str:
    return " / ".join(format(v, fmt) for _, v in sorted(values.items()))


def _ctxs(values: dict[int, float]) -> str:
    return " / ".join(str(c) for c in sorted(values))


def summary_rows(trace: Trace) -> list[tuple[str, str]]:
    """Task, planner, GPU, the outcome, the best with its source and the baseline with its own."""
    s, records, base, bid = trace.start, of_record(trace), session_baseline(trace), best_id(trace)
    end = next((e for e in reversed(trace.events) if e.type == "session_end"), None)
    dev = s.environment.device
    rows = [("task", f"{s.task} ({s.size})"), ("planner", f"{s.planner} {s.planner_settings}"),
            ("budget", f"{s.budget_s:.0f} s"),
            ("GPU", f"{dev.name}, {dev.sms} SMs, copy {dev.copy_tbs:.2f} TB/s" if dev else "unknown"),
            ("commit", s.environment.project_commit)]
    attempts = trace.attempts()
    kept = sum(a.outcome == "kept" for a in attempts)
    seed = records.get(trace.measure.id) if trace.measure else None
    best = records.get(bid)
    if seed and best:
        seed_us, best_us = ({c: t.median(c) for c in t.samples} for t in (seed, best))
        rows.append(("outcome", f"{len(attempts)} attempts, {kept} kept; best {bid}: " + ", ".join(
            f"ctx {c}: {seed_us[c]:.1f} -> {u:.1f} µs" for c, u in sorted(best_us.items()) if c in seed_us)))
        rows.append(("best", f"{bid}: {_per_ctx(best_us)} µs/token at ctx {_ctxs(best_us)} ({best.source})"))
        recorded = {int(c): u for c, u in (end.summary.get("best_us", {}) if end else {}).items()}
        if any(abs(u - best_us.get(c, 0.0)) > MISMATCH for c, u in recorded.items()):
            rows.append(("session's line", f"{end.summary.get('line', '')} (its best differs from this report's "
                                           "timing of record: the session quotes the samples it last held for the "
                                           "best, a re-measure on resume or re-timings an older writer did not "
                                           "record)"))
    else:
        rows.append(("outcome", f"{len(attempts)} attempts; no version was timed"))
    if base:
        spread = " / ".join(f"{lo:.0f}-{hi:.0f}" for _, (lo, hi) in sorted(base.drift.items()))
        rows.append(("baseline", f"PyTorch, timed with {base.timed_with}: {_per_ctx(base.us, '.0f')} µs at ctx "
                                 f"{_ctxs(base.us)}; every speedup divides it (each worker's own timing: {spread} µs)"))
    rows.append(("ended", end.reason if end else "interrupted (no session_end)"))
    if llm_line(trace):
        rows.append(("LLM", llm_line(trace)))
    return rows


def sections(trace: Trace) -> list[Table | Blocks]:
    """Every section that has rows, in reading order."""
    made = [timeline_table(trace), per_context(trace), failures(trace), resources(trace), kept_diffs(trace)]
    made += [make(trace) for make in SECTIONS]
    return [s for s in made if (s.rows if isinstance(s, Table) else s.items)]


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _markdown(trace: Trace, images: list[str]) -> str:
    lines = [f"# Session {trace.start.session_id}", ""]
    lines += [f"- **{k}**: {v}" for k, v in summary_rows(trace)] + [""]
    lines += [f"![{n}]({n})" for n in images] + [""]
    for sec in sections(trace):
        lines += [f"## {sec.title}", "", sec.caption, ""]
        if isinstance(sec, Table):
            lines += ["| " + " | ".join(sec.head) + " |", "|" + "---|" * len(sec.head)]
            lines += ["| " + " | ".join(_md_cell(c) for c in r) + " |" for r in sec.rows]
        else:
            for heading, text in sec.items:
                lines += [f"### {heading}", "", "```diff", text, "```", ""]
        lines.append("")
    return "\n".join(lines)


def _html_section(sec: Table | Blocks) -> str:
    e = html.escape
    top = f"<h2>{e(sec.title)}</h2><p class=cap>{e(sec.caption)}</p>"
    if isinstance(sec, Blocks):
        return top + "".join(f"<details{' open' if t.count(chr(10)) < OPEN_LINES else ''}><summary>{e(h)}</summary>"
                             f"<pre>{e(t)}</pre></details>" for h, t in sec.items)
    head = "".join(f"<th>{e(h)}</th>" for h in sec.head)
    body = "".join("<tr>" + "".join(f"<td{' class=s' if len(c) <= SHORT else ''}>{e(c)}</td>" for c in r) + "</tr>"
                   for r in sec.rows)
    return top + f"<div class=wide><table><tr>{head}</tr>{body}</table></div>"


STYLE = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1250px}
table{border-collapse:collapse;font-size:13px}.wide{overflow-x:auto}
td,th{border:1px solid #ccc;padding:3px 6px;text-align:left;vertical-align:top}
td{overflow-wrap:break-word}td.s{white-space:nowrap}
.cap{color:#444;font-size:13px;max-width:900px}img{max-width:100%;margin:4px;vertical-align:top}
pre{font-size:12px;background:#f6f6f6;padding:6px;overflow-x:auto}summary{cursor:pointer;font-size:13px}"""


def _html(trace: Trace, images: dict[str, bytes]) -> str:
    e = html.escape
    summary = "".join(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in summary_rows(trace))
    imgs = "".join(f'<img alt="{n}" src="data:image/png;base64,{base64.b64encode(d).decode()}">'
                   for n, d in images.items())
    plots_part = f"<h2>Plots</h2>{imgs}" if images else ""
    body = "".join(_html_section(s) for s in sections(trace))
    return (f'<!doctype html><html><head><meta charset="utf-8"><title>session {e(trace.start.session_id)}</title>'
            f"<style>{STYLE}</style></head><body><h1>Session {e(trace.start.session_id)}</h1>"
            f"<table>{summary}</table>{plots_part}{body}</body></html>")


def write_report(trace: Trace, path: Path) -> Path:
    """`path` ending in .html (self-contained) or .md (PNGs written beside it, named `<stem>-<plot>.png`)."""
    path = Path(path)
    images = plots(trace)
    if path.suffix == ".md":
        for name, data in images.items():
            (path.parent / f"{path.stem}-{name}").write_bytes(data)
        path.write_text(_markdown(trace, [f"{path.stem}-{n}" for n in images]) + "\n")
    else:
        path.write_text(_html(trace, images))
    return path
