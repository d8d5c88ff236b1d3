"""Session reports: HTML (plots embedded) or Markdown (plots beside it), from a trace alone.

Plots: best-so-far µs/token over the attempts with every attempt as a point coloured by outcome,
per-context speedup of the seed and the best over the baseline, the fraction of the memory
roofline each reaches, and, where the trace holds their phase timelines, a waterfall of each.
"""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from .loader import Trace  # noqa: E402
from .notebook import SECTIONS, llm_line  # noqa: E402
from .phases import timelines_of  # noqa: E402
from .render import primary_ctx, timeline  # noqa: E402
from .results import EvalResult, PhaseTimeline  # noqa: E402

COLORS = {"measured": "#1f77b4", "kept": "#2ca02c", "reverted": "#bcbd22", "slower": "#bcbd22", "wrong": "#d62728",
          "build": "#9467bd", "timeout": "#8c564b", "crash": "#e377c2", "infra": "#7f7f7f", "unfinished": "#7f7f7f"}


def _best_result(trace: Trace) -> tuple[str, EvalResult | None]:
    best_id, best = (trace.measure.id, trace.measure.result) if trace.measure else ("", None)
    for a in trace.attempts():
        if a.outcome == "kept" and a.evaluate:
            best_id, best = a.proposal.id, a.evaluate.result
    return best_id, best


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def plots(trace: Trace) -> dict[str, bytes]:
    rows = timeline(trace)
    ctx = primary_ctx(trace)
    out = {}
    fig, ax = plt.subplots(figsize=(8, 3.6))
    xs = [r["step"] for r in rows]
    ax.step(xs, [r["best_us"] for r in rows], where="post", color="black", label="best so far")
    for outcome in sorted({r["outcome"] for r in rows}):
        pts = [(r["step"], r["us"]) for r in rows if r["outcome"] == outcome and r["us"]]
        if pts:
            ax.scatter(*zip(*pts, strict=True), color=COLORS.get(outcome, "gray"), label=outcome, zorder=3, s=22)
        failed = [r["step"] for r in rows if r["outcome"] == outcome and not r["us"]]
        if failed:
            ymin = min((r["us"] for r in rows if r["us"]), default=1.0)
            ax.scatter(failed, [ymin * 0.97] * len(failed), marker="x", color=COLORS.get(outcome, "gray"),
                       label=f"{outcome} (no timing)", zorder=3)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("attempt")
    ax.set_ylabel(f"µs/token at ctx {ctx}")
    ax.set_title("best so far and every attempt")
    ax.legend(fontsize=7, ncol=3)
    out["progress.png"] = _png(fig)

    seed = trace.measure.result if trace.measure else None
    best_id, best = _best_result(trace)
    if seed and best and seed.timings:
        ctxs = [t.ctx for t in seed.timings]
        speed = lambda res: [next((t.speedup or 0) for t in res.timings if t.ctx == c) for c in ctxs]  # noqa: E731
        roof = lambda res: [100 * next(t.roofline for t in res.timings if t.ctx == c) for c in ctxs]  # noqa: E731
        for name, fn, ylabel in (("speedup.png", speed, "speedup vs PyTorch baseline"),
                                 ("roofline.png", roof, "% of memory roofline")):
            fig, ax = plt.subplots(figsize=(6, 3.2))
            w = 0.38
            pos = range(len(ctxs))
            ax.bar([p - w / 2 for p in pos], fn(seed), w, label="seed", color="#1f77b4")
            ax.bar([p + w / 2 for p in pos], fn(best), w, label=f"best ({best_id})", color="#2ca02c")
            ax.set_xticks(list(pos), [str(c) for c in ctxs])
            ax.set_xlabel("context length")
            ax.set_ylabel(ylabel)
            ax.legend(fontsize=8)
            out[name] = _png(fig)
    waterfall = _waterfall(trace, best_id)
    if waterfall:
        out["phases.png"] = waterfall
    return out


def _waterfall(trace: Trace, best_id: str) -> bytes | None:
    """The seed's and the best's phase timelines side by side at one context (the primary one if both have
    it); None when neither has a timeline or they share no context."""
    timelines = timelines_of(trace)
    seed_id = trace.measure.id if trace.measure else ""
    ids = [v for v in dict.fromkeys((seed_id, best_id)) if v in timelines]
    ctxs = set.intersection(*({t.ctx for t in timelines[v]} for v in ids)) if ids else set()
    if not ctxs:
        return None
    ctx = primary_ctx(trace) if primary_ctx(trace) in ctxs else max(ctxs)
    rows = max(len(t.rows) for v in ids for t in timelines[v])
    shown = [next(t for t in timelines[v] if t.ctx == ctx) for v in ids]
    same_phases = len({tuple(r.name for r in tl.rows) for tl in shown}) == 1   # else each panel its own names
    fig, axes = plt.subplots(1, len(ids), figsize=(6 * len(ids), 1.2 + 0.26 * rows), sharex=True,
                             sharey=same_phases, squeeze=False)
    for ax, vid, tl in zip(axes[0], ids, shown, strict=True):
        _draw_waterfall(ax, tl, "seed" if vid == seed_id else f"best ({vid})")
        if not same_phases or ax is axes[0][0]:
            ax.invert_yaxis()   # the first phase on top (once for a shared axis)
    axes[0][0].set_xlim(0, 1.03 * max(tl.kernel_us for tl in shown))
    axes[0][-1].legend(fontsize=7, loc="upper right")
    return _png(fig)


def _draw_waterfall(ax, tl: PhaseTimeline, label: str) -> None:
    """Each phase a bar from where the one before it ended: its span, then its barrier wait."""
    starts, t = [], 0.0
    for r in tl.rows:
        starts.append(t)
        t += r.span_us + r.wait_us
    ys = range(len(tl.rows))
    spans = [r.span_us for r in tl.rows]
    ax.barh(ys, spans, left=starts, color="#1f77b4", label="span (critical path)")
    ax.barh(ys, [r.wait_us for r in tl.rows], left=[s + w for s, w in zip(starts, spans, strict=True)],
            color="#bbbbbb", label="barrier wait")
    ax.set_yticks(list(ys), [r.name for r in tl.rows], fontsize=7)
    ax.set_xlabel("µs from the kernel's start")
    ax.set_title(f"{label}: {tl.kernel_us:.1f} µs at ctx {tl.ctx}", fontsize=9)


def _summary_rows(trace: Trace) -> list[tuple[str, str]]:
    s = trace.start
    end = next((e for e in reversed(trace.events) if e.type == "session_end"), None)
    dev = s.environment.device
    gpu = f"{dev.name}, {dev.sms} SMs, copy {dev.copy_tbs:.2f} TB/s" if dev else "unknown"
    rows = [("task", f"{s.task} ({s.size})"), ("planner", f"{s.planner} {s.planner_settings}"),
            ("budget", f"{s.budget_s:.0f} s"), ("GPU", gpu), ("commit", s.environment.project_commit),
            ("outcome", end.summary.get("line", "") if end else "interrupted")]
    if end:
        rows.append(("ended", end.reason))
    if llm_line(trace):
        rows.append(("LLM", llm_line(trace)))
    return rows


def _table(rows: list[dict]) -> list[list[str]]:
    return [[str(r["step"]), r["id"], r["hypothesis"], r["outcome"], f"{r['us']:.1f}" if r["us"] else "-",
             f"{r['speedup']:.1f}x" if r["speedup"] else "-", f"{r['best_us']:.1f}" if r["best_us"] else "-"]
            for r in rows]


HEAD = ["step", "id", "hypothesis", "outcome", "µs/token", "speedup", "best µs"]


def write_report(trace: Trace, path: Path) -> Path:
    """`path` ending in .html (self-contained) or .md (PNGs written beside it)."""
    path = Path(path)
    images = plots(trace)
    tables = [("Timeline", HEAD, _table(timeline(trace)))]
    tables += [(title, head, rows) for title, head, make in SECTIONS if (rows := make(trace))]
    if path.suffix == ".md":
        for name, data in images.items():
            (path.parent / f"{path.stem}-{name}").write_bytes(data)
        lines = [f"# Session {trace.start.session_id}", ""]
        lines += [f"- **{k}**: {v}" for k, v in _summary_rows(trace)] + [""]
        lines += [f"![{n}]({path.stem}-{n})" for n in images] + [""]
        for title, head, rows in tables:
            lines += [f"## {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
            lines += ["| " + " | ".join(c.replace("|", "/").replace("\n", " ") for c in r) + " |" for r in rows]
            lines.append("")
        path.write_text("\n".join(lines) + "\n")
        return path
    imgs = "".join(f'<img alt="{n}" src="data:image/png;base64,{base64.b64encode(d).decode()}">' for n, d in
                   images.items())
    summary = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>" for k, v in
                      _summary_rows(trace))
    sections = "".join(
        f"<h2>{html.escape(title)}</h2><table><tr>{''.join(f'<th>{html.escape(h)}</th>' for h in head)}</tr>"
        + "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows) + "</table>"
        for title, head, rows in tables)
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>session {trace.start.session_id}</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}}table{{border-collapse:collapse;
font-size:13px}}td,th{{border:1px solid #ccc;padding:3px 6px;text-align:left}}img{{max-width:48%;margin:4px}}</style>
</head><body><h1>Session {trace.start.session_id}</h1><table>{summary}</table><h2>Plots</h2>{imgs}
{sections}</body></html>"""
    path.write_text(page)
    return path
