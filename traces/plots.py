"""The report's plots, each a matplotlib figure (None when the trace holds nothing to draw).

Progress: the best so far and every timed attempt at the primary context, on a scale that keeps the best
line's progress readable. Bars: the seed's and the best's speedup over the session's baseline and fraction of
the memory roofline per context. Waterfall: the seed's and the best's phase timelines where the trace holds
them. Legends sit outside the axes so they never cover data.
"""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from .loader import Trace  # noqa: E402
from .phases import timelines_of  # noqa: E402
from .render import NOT_FASTER, primary_ctx, timeline  # noqa: E402
from .results import PhaseTimeline  # noqa: E402
from .timings import best_id, of_record, session_baseline  # noqa: E402

COLORS = {"measured": "#1f77b4", "kept": "#2ca02c", NOT_FASTER: "#bcbd22", "slower": "#ff7f0e",
          "reverted": "#bcbd22", "wrong": "#d62728", "build": "#9467bd", "timeout": "#8c564b", "crash": "#e377c2",
          "infra": "#7f7f7f", "duplicate": "#17becf", "unfinished": "#7f7f7f"}
OUTSIDE = {"loc": "upper left", "bbox_to_anchor": (1.01, 1.0), "fontsize": 7, "frameon": False}
HEADROOM = 1.10   # the progress plot shows timings up to this much above the starting kernel's
MIN_SPAN = 0.04   # its y axis spans at least this fraction of its top


def png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def y_range(us: list[float], start: float | None) -> tuple[float, float]:
    """From the lowest timing to HEADROOM above the starting figure (or the highest timing if lower), padded
    and at least MIN_SPAN of the top high: one slow outlier must not flatten the best line, and a single
    timing must not get an axis of hundredths."""
    lo, hi = min(us), min(max(us), HEADROOM * (start or max(us)))
    half, mid = max(hi - lo, MIN_SPAN * hi) / 2, (hi + lo) / 2
    return mid - 1.16 * half, mid + 1.16 * half


def progress(trace: Trace) -> Figure | None:
    """Best so far and every timed attempt; an attempt above the scale sits on the top edge with its µs printed,
    one without a timing is a tick on the x axis (it has no µs/token to draw)."""
    rows = timeline(trace)
    timed = [r for r in rows if r["us"]]
    if not timed:
        return None
    fig, ax = plt.subplots(figsize=(8, 3.6))
    line = [r for r in rows if r["best_us"]]
    ax.step([r["step"] for r in line], [r["best_us"] for r in line], where="post", color="black", label="best so far")
    low, top = y_range([r["us"] for r in timed], line[0]["best_us"] if line else None)
    edge = ax.get_xaxis_transform()   # x in data, y in axes fractions
    for shown in dict.fromkeys(r["shown"] for r in rows):
        color = COLORS.get(shown, "gray")
        ax.scatter([r["step"] for r in timed if r["shown"] == shown and r["us"] <= top],
                   [r["us"] for r in timed if r["shown"] == shown and r["us"] <= top], color=color, s=22, zorder=3,
                   label=shown)
        for r in (r for r in timed if r["shown"] == shown and r["us"] > top):
            ax.plot(r["step"], 1.0, "^", color=color, transform=edge, clip_on=False, zorder=3)
            ax.annotate(f"{r['us']:.0f}", (r["step"], 1.0), xycoords=edge, xytext=(0, -11),
                        textcoords="offset points", ha="center", fontsize=6, color=color)
        untimed = [r["step"] for r in rows if r["shown"] == shown and not r["us"]]
        ax.plot(untimed, [0.0] * len(untimed), "|", color=color, markersize=12, mew=2, transform=edge, clip_on=False)
    handles, _ = ax.get_legend_handles_labels()
    handles += [Line2D([], [], marker="^", color="gray", ls="", label="above the scale (µs printed)"),
                Line2D([], [], marker="|", color="gray", ls="", markersize=10, mew=2, label="no timing")]
    ax.legend(handles=handles, **OUTSIDE)
    ax.set_ylim(low, top)
    ax.set_xlim(-0.5, rows[-1]["step"] + 0.5)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    ax.set_xlabel("attempt")
    ax.set_ylabel(f"µs/token at ctx {primary_ctx(trace)}")
    ax.set_title("best so far and every attempt")
    return fig


def bars(trace: Trace, metric: str) -> Figure | None:
    """`speedup` (over the session's one baseline) or `roofline` (% of the memory roofline) of the seed and the
    best per context; None without a timed seed."""
    records, base = of_record(trace), session_baseline(trace)
    seed = trace.measure.id if trace.measure else ""
    if seed not in records or (metric == "speedup" and base is None):
        return None
    ctxs = sorted(records[seed].samples)
    value = {"speedup": lambda t, c: base.speedup(c, t.median(c)) or 0.0,
             "roofline": lambda t, c: 100 * (t.roofline(c) or 0.0)}[metric]
    shown = list(dict.fromkeys((seed, best_id(trace))))
    fig, ax = plt.subplots(figsize=(4.6, 3.0))
    w = 0.8 / len(shown)
    for i, (vid, color) in enumerate(zip(shown, ("#1f77b4", "#2ca02c"), strict=False)):
        pos = [p + (i - (len(shown) - 1) / 2) * w for p in range(len(ctxs))]
        heights = [value(records[vid], c) for c in ctxs]
        ax.bar_label(ax.bar(pos, heights, w, color=color, label="seed" if vid == seed else f"best ({vid})"),
                     fmt="%.1f", fontsize=7)
    ax.set_xticks(range(len(ctxs)), [str(c) for c in ctxs])
    ax.set_xlabel("context length")
    ax.margins(y=0.12)
    if metric == "speedup":
        ax.set_ylabel("speedup (x)")
        ax.set_title(f"over the PyTorch baseline timed with {base.timed_with}", fontsize=9)
    else:
        ax.set_ylabel("% of memory roofline")
        ax.set_title("bytes per step / time / measured copy bandwidth", fontsize=9)
    ax.legend(**OUTSIDE)
    return fig


def waterfall(trace: Trace) -> Figure | None:
    """The seed's and the best's phase timelines side by side at one context (the primary one if both have
    it); None when neither has a timeline or they share no context."""
    timelines = timelines_of(trace)
    seed_id = trace.measure.id if trace.measure else ""
    ids = [v for v in dict.fromkeys((seed_id, best_id(trace))) if v in timelines]
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


def plots(trace: Trace) -> dict[str, bytes]:
    """Every plot the trace can fill, as PNG bytes by file name."""
    figures = {"progress.png": progress(trace), "speedup.png": bars(trace, "speedup"),
               "roofline.png": bars(trace, "roofline"), "phases.png": waterfall(trace)}
    return {name: png(fig) for name, fig in figures.items() if fig is not None}
