"""The keep/revert rule, stated once: a candidate replaces the best only if it is correct and faster
beyond noise at every timed context. The interval resamples module loads, then samples within them: where a
load's code lies biases all of its samples alike (BENCHMARKS.md, forty-seventh session), so pooling them would
count one placement as many independent draws."""

from __future__ import annotations

import math

from pydantic import BaseModel

from megakernel_agent.sandbox.stats import rule_interval
from megakernel_agent.traces.results import EvalResult

MIN_GAIN = 0.01
RULE = (f"keep iff every check passed, the 95% bootstrap interval of best/candidate median time (resampling "
        f"module loads, then samples within each) lies above 1.0 at every timed context, and the geometric-mean "
        f"ratio is at least {1 + MIN_GAIN:.2f}")


class Verdict(BaseModel):
    kept: bool
    reason: str
    ratio: float | None = None
    low: float | None = None
    high: float | None = None


def judge(best: EvalResult, cand: EvalResult) -> Verdict:
    if cand.failure is not None:
        return Verdict(kept=False, reason=f"{cand.failure.cls.value}: {cand.failure.message[:300]}")
    ratios, lows, highs = [], [], []
    for t in cand.timings:
        ref = next((b for b in best.timings if b.ctx == t.ctx), None)
        if ref is None:
            return Verdict(kept=False, reason=f"best has no timing at ctx {t.ctx}")
        r, lo, hi = rule_interval(ref.groups(), t.groups())
        ratios.append(r)
        lows.append(lo)
        highs.append(hi)
    if not ratios:
        return Verdict(kept=False, reason="no timings")
    geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    low, high = min(lows), max(highs)
    detail = ", ".join(f"ctx {t.ctx}: {r:.3f}x [{lo:.3f}, {hi:.3f}]"
                       for t, r, lo, hi in zip(cand.timings, ratios, lows, highs, strict=True))
    if all(lo > 1.0 for lo in lows) and geo >= 1 + MIN_GAIN:
        return Verdict(kept=True, reason=f"faster: geomean {geo:.3f}x ({detail})", ratio=geo, low=low, high=high)
    return Verdict(kept=False, reason=f"not faster beyond noise: geomean {geo:.3f}x ({detail})", ratio=geo,
                   low=low, high=high)
