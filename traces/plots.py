"""The report's plots, drawn from a trace alone: the best so far over the attempts with every timed attempt as a
point, the seed's and the best's speedup over the session's baseline and fraction of the memory roofline per
context, and, where the trace holds their phase timelines, a waterfall of each.

Only measured values are drawn on a µs axis: an attempt without a timing (a failed build, a wrong result) is a
mark on its own strip. The µs axis spans the best-so-far line, so one far-off attempt cannot flatten it; an
attempt above the axis is a triangle on its top edge with its µs printed. Legends sit outside the axes.
"""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from .headline import baseline, best  # noqa: E402
from .loader import Trace  # noqa: E402
from .phases import timelines_of  # noqa: E402
from .render import primary_ctx, timeline  # noqa: E402
from .results import PhaseTimeline  # noqa: E402

COLORS = {"measured": "#1f77b4", "kept": "#2ca02c", "reverted": "#bcbd22", "not faster beyond noise": "#bcbd22",
          "slower": "#ff7f0e", "wrong": "#d62728", "build": "#9467bd", "timeout": "#8c564b", "crash": "#e377c2",
          "infra": "#7f7f7f", "duplicate": "#7f7f7f", "unfinished": "#7f7f7f"}
OUTSIDE = {"loc": "upper left", "bbox_to_anchor": (1.01, 1.0), "fontsize": 7, "borderaxespad": 0.0}


def plots(trace: Trace) -> dict[str, bytes]:
    """PNG bytes by file name; a plot the trace has nothing for is left out (a trace of only its first line
    has none)."""
    b = best(trace)
    figures = {"progress.png": progress_figure(trace), "speedup.png": bars_figure(trace, "speedup"),
               "roofline.png": bars_figure(trace, "roofline"),
               "phases.png": waterfall_figure(trace, b.id if b else "")}
    return {name: _png(fig) for name, fig in figures.items() if fig is not None}


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def y_range(timed_us: list[float], best_us: list[float]) -> tuple[float, float]:
    """From just under the fastest attempt to one best-line span above the best line's top (at least 5% of it)."""
    lo, hi = min(timed_us), max(best_us or timed_us)
    span = max(hi - lo, 0.05 * hi)
    return lo - 0.1 * span, hi + span


def progress_figure(trace: Trace) -> Figure | None:
    rows = timeline(trace)
    timed = [r for r in rows if r["us"]]
    if not timed:
        return None
    untimed = [r for r in rows if not r["us"]]
    if untimed:
        fig, (ax, strip) = plt.subplots(2, 1, sharex=True, figsize=(8, 4.2), gridspec_kw={"height_ratios": [7, 1]})
    else:
        fig, ax = plt.subplots(figsize=(8, 3.6))
    line = [r for r in rows if r["best_us"]]
    ax.step([r["step"] for r in line], [r["best_us"] for r in line], where="post", color="black",
            label="best so far")
    bottom, top = y_range([r["us"] for r in timed], [r["best_us"] for r in line])
    above = False
    for name in dict.fromkeys(r["shown"] for r in timed):
        pts = [(r["step"], r["us"]) for r in timed if r["shown"] == name]
        inside = [p for p in pts if p[1] <= top]
        if inside:
            ax.scatter(*zip(*inside, strict=True), color=COLORS.get(name, "gray"), label=name, zorder=3, s=22)
        for x, us in (p for p in pts if p[1] > top):
            above = True
            ax.scatter([x], [top], marker="^", color=COLORS.get(name, "gray"), zorder=3, s=36, clip_on=False)
            ax.annotate(f"{us:.0f}", (x, top), xytext=(0, -11), textcoords="offset points", ha="center", fontsize=7)
    ax.set_ylim(bottom, top)
    ax.set_ylabel(f"µs/token at ctx {primary_ctx(trace)}")
    ax.set_title("best so far and every timed attempt", pad=12)
    handles, _ = ax.get_legend_handles_labels()
    if above:
        handles.append(Line2D([], [], marker="^", color="gray", linestyle="", label="above the axis (µs printed)"))
    if untimed:
        _untimed_strip(strip, untimed, handles)
    (strip if untimed else ax).set_xlabel("attempt")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(handles=handles, **OUTSIDE)
    return fig


def _untimed_strip(strip, rows: list[dict], handles: list) -> None:
    """Attempts without a timing as crosses on a strip of their own, no µs implied."""
    for name in dict.fromkeys(r["shown"] for r in rows):
        steps = [r["step"] for r in rows if r["shown"] == name]
        handles.append(strip.scatter(steps, [0] * len(steps), marker="x", color=COLORS.get(name, "gray"),
                                     label=f"{name} (no timing)"))
    strip.set_yticks([])
    strip.set_ylabel("no\ntiming", rotation=0, ha="right", va="center", fontsize=8)


def bars_figure(trace: Trace, kind: str) -> Figure | None:
    """`speedup` or `roofline` (_measure) of the seed and the best per context; None when the trace lacks what it
    needs."""
    m, b, measure = trace.measure, best(trace), _measure(trace, kind)
    if m is None or b is None or measure is None:
        return None
    value, ctxs, ylabel, title, fmt = measure
    ctxs = [c for c in ctxs if c in b.us]
    series = [("seed", m.result.median_by_ctx())] + ([(f"best ({b.id})", b.us)] if b.id != m.id else [])
    fig, ax = plt.subplots(figsize=(6, 3.2))
    w = 0.8 / len(series)
    for i, (label, us) in enumerate(series):
        bars = ax.bar([p + (i - (len(series) - 1) / 2) * w for p in range(len(ctxs))],
                      [value(c, us[c]) for c in ctxs], w, label=label, color=("#1f77b4", "#2ca02c")[i])
        ax.bar_label(bars, fmt=fmt, fontsize=7)
    ax.margins(y=0.12)
    ax.set_xticks(range(len(ctxs)), [str(c) for c in ctxs])
    ax.set_xlabel("context length")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.legend(**OUTSIDE)
    return fig


def _measure(trace: Trace, kind: str):
    """(value of a µs at a context, contexts, y label, title, bar label format): the speedup over the session's
    one baseline, or the fraction of the copy bandwidth the session start measured; None without it."""
    seed = {t.ctx: t for t in trace.measure.result.timings} if trace.measure else {}
    base, dev = baseline(trace), trace.start.environment.device
    if kind == "speedup" and base:
        return (lambda c, us: base.us[c] / us, [c for c in sorted(seed) if c in base.us], "speedup over PyTorch",
                "over the session's baseline (timed once, at its start)", "%.1fx")
    if kind == "roofline" and dev:
        return (lambda c, us: 100 * seed[c].bytes_per_step / (us * 1e-6) / (dev.copy_tbs * 1e12), sorted(seed),
                "% of memory roofline", f"of the {dev.copy_tbs:.2f} TB/s copy bandwidth measured at the session start",
                "%.1f")
    return None


def waterfall_figure(trace: Trace, best_id: str) -> Figure | None:
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
                             sharey=same_phases, squeeze=False, layout="constrained")   # room for each panel's names
    for ax, vid, tl in zip(axes[0], ids, shown, strict=True):
        draw_waterfall(ax, tl, "seed" if vid == seed_id else f"best ({vid})")
        if not same_phases or ax is axes[0][0]:
            ax.invert_yaxis()   # the first phase on top (once for a shared axis)
    axes[0][0].set_xlim(0, 1.03 * max(tl.kernel_us for tl in shown))
    axes[0][-1].legend(**OUTSIDE)
    return fig


def draw_waterfall(ax, tl: PhaseTimeline, label: str) -> None:
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
