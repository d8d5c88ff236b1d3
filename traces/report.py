"""Session reports: HTML (plots embedded) or Markdown (plots beside it), from a trace alone.

The summary, the plots and every table take their numbers from the same place (traces/headline.py and the
timeline of traces/render.py, which `replay` prints): one baseline, one best time with its source named.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path

from .headline import baseline_line, best_line, counts_line
from .loader import Trace
from .notebook import SECTIONS, llm_line
from .plots import plots
from .render import primary_ctx, timeline
from .versions import Table, failure_table, kept_diffs, resource_table, timing_table

WIDE = ("progress.png", "phases.png")   # drawn across the page; the others two by two


def _summary_rows(trace: Trace) -> list[tuple[str, str]]:
    s = trace.start
    end = next((e for e in reversed(trace.events) if e.type == "session_end"), None)
    dev = s.environment.device
    gpu = f"{dev.name}, {dev.sms} SMs, copy {dev.copy_tbs:.2f} TB/s" if dev else "unknown"
    rows = [("task", f"{s.task} ({s.size})"), ("planner", f"{s.planner} {s.planner_settings}"),
            ("budget", f"{s.budget_s:.0f} s"), ("GPU", gpu), ("commit", s.environment.project_commit),
            ("outcome", counts_line(trace)), ("best", best_line(trace) or "nothing measured"),
            ("baseline", baseline_line(trace)),
            ("ended", end.reason if end else "not recorded: the session was interrupted")]
    if llm_line(trace):
        rows.append(("LLM", llm_line(trace)))
    return rows


def _timeline_table(trace: Trace) -> Table:
    rows = [[str(r["step"]), r["id"], r["hypothesis"], r["shown"], f"{r['us']:.1f}" if r["us"] else "-",
             f"{r['speedup']:.1f}x" if r["speedup"] else "-", f"{r['best_us']:.1f}" if r["best_us"] else "-"]
            for r in timeline(trace)]
    head = ["step", "id", "hypothesis", "outcome", "µs/token", "speedup", "best so far µs"]
    note = (f"at ctx {primary_ctx(trace)}: the median of each version's own evaluation; speedup over the session's "
            "baseline (see the summary)")
    return Table(title="Timeline", head=head, rows=rows, note=note)


def tables(trace: Trace) -> list[Table]:
    made = [_timeline_table(trace), timing_table(trace), failure_table(trace), resource_table(trace)]
    made += [Table(title=title, head=head, rows=rows) for title, head, make in SECTIONS if (rows := make(trace))]
    return [t for t in made if t is not None and t.rows]


def write_report(trace: Trace, path: Path) -> Path:
    """`path` ending in .html (self-contained) or .md (PNGs written beside it)."""
    path = Path(path)
    images, made, diffs = plots(trace), tables(trace), kept_diffs(trace)
    if path.suffix == ".md":
        for name, data in images.items():
            (path.parent / f"{path.stem}-{name}").write_bytes(data)
        path.write_text(_markdown(trace, [f"{path.stem}-{n}" for n in images], made, diffs))
    else:
        path.write_text(_html(trace, images, made, diffs))
    return path


def _markdown(trace: Trace, image_files: list[str], made: list[Table], diffs: list[tuple[str, str]]) -> str:
    cell = lambda c: c.replace("|", "/").replace("\n", " ")  # noqa: E731
    lines = [f"# Session {trace.start.session_id}", ""]
    lines += [f"- **{k}**: {v}" for k, v in _summary_rows(trace)] + [""]
    lines += [f"![{n}]({n})" for n in image_files] or ["(no plots: the trace holds no timing)"]
    lines.append("")
    for t in made:
        lines += [f"## {t.title}", ""] + ([t.note, ""] if t.note else [])
        lines += ["| " + " | ".join(t.head) + " |", "|" + "---|" * len(t.head)]
        lines += ["| " + " | ".join(cell(c) for c in r) + " |" for r in t.rows] + [""]
    if diffs:
        lines += ["## Kept changes against their parents", ""]
        for title, text in diffs:
            lines += [f"### {title}", "", "```diff", text, "```", ""]
    return "\n".join(lines)


CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1250px}
table{border-collapse:collapse;font-size:13px;margin-bottom:.5em}
td,th{border:1px solid #ccc;padding:3px 6px;text-align:left;vertical-align:top;overflow-wrap:break-word}
td.short{white-space:nowrap}
.plots img{max-width:49%;margin:4px;vertical-align:top}.plots img.wide{max-width:100%}
p.note{font-size:13px;color:#444;max-width:1100px}
pre{font-size:12px;background:#f6f6f6;padding:6px;overflow-x:auto}summary{cursor:pointer;font-family:monospace}"""


def _html(trace: Trace, images: dict[str, bytes], made: list[Table], diffs: list[tuple[str, str]]) -> str:
    e = html.escape
    imgs = "".join(f'<img alt="{n}" class="{"wide" if n in WIDE else ""}" '
                   f'src="data:image/png;base64,{base64.b64encode(d).decode()}">' for n, d in images.items())
    summary = "".join(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in _summary_rows(trace))
    sections = "".join(
        f"<h2>{e(t.title)}</h2>" + (f'<p class="note">{e(t.note)}</p>' if t.note else "")
        + f"<table><tr>{''.join(f'<th>{e(h)}</th>' for h in t.head)}</tr>"
        + "".join("<tr>" + "".join(_td(c) for c in r) + "</tr>" for r in t.rows) + "</table>"
        for t in made)
    if diffs:
        sections += "<h2>Kept changes against their parents</h2>" + "".join(_diff(t, text) for t, text in diffs)
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>session {e(trace.start.session_id)}</title>
<style>{CSS}</style></head><body><h1>Session {e(trace.start.session_id)}</h1><table>{summary}</table>
<h2>Plots</h2><div class="plots">{imgs or "no plots: the trace holds no timing"}</div>
{sections}</body></html>"""


def _td(cell: str) -> str:
    """A cell; a short one (an id, a number, a ratio with its interval) is kept on one line."""
    return f'<td class="short">{html.escape(cell)}</td>' if len(cell) <= 32 else f"<td>{html.escape(cell)}</td>"


def _diff(title: str, text: str) -> str:
    """A diff, folded when long."""
    n = text.count("\n") + 1
    return (f"<details{' open' if n <= 40 else ''}><summary>{html.escape(title)} ({n} line{'s' * (n > 1)})"
            f"</summary><pre>{html.escape(text)}</pre></details>")
