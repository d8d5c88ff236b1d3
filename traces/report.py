"""Session reports: HTML (plots embedded) or Markdown (plots beside it), from a trace alone.

Plots: best-so-far µs/token over the attempts with every attempt as a point coloured by outcome,
per-context speedup of the seed and the best over the baseline, and the fraction of the memory
roofline each reaches.
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
from .render import primary_ctx, timeline  # noqa: E402
from .results import EvalResult  # noqa: E402

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
    return out


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
    rows = _table(timeline(trace))
    if path.suffix == ".md":
        for name, data in images.items():
            (path.parent / f"{path.stem}-{name}").write_bytes(data)
        lines = [f"# Session {trace.start.session_id}", ""]
        lines += [f"- **{k}**: {v}" for k, v in _summary_rows(trace)] + [""]
        lines += [f"![{n}]({path.stem}-{n})" for n in images] + [""]
        lines += ["| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
        lines += ["| " + " | ".join(c.replace("|", "/") for c in r) + " |" for r in rows]
        path.write_text("\n".join(lines) + "\n")
        return path
    imgs = "".join(f'<img alt="{n}" src="data:image/png;base64,{base64.b64encode(d).decode()}">' for n, d in
                   images.items())
    summary = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>" for k, v in
                      _summary_rows(trace))
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>session {trace.start.session_id}</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}}table{{border-collapse:collapse;
font-size:13px}}td,th{{border:1px solid #ccc;padding:3px 6px;text-align:left}}img{{max-width:48%;margin:4px}}</style>
</head><body><h1>Session {trace.start.session_id}</h1><table>{summary}</table><h2>Plots</h2>{imgs}
<h2>Timeline</h2><table><tr>{''.join(f'<th>{h}</th>' for h in HEAD)}</tr>{body}</table></body></html>"""
    path.write_text(page)
    return path
