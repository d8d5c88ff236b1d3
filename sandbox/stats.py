"""Statistics for timing samples: medians, spread, and a bootstrap interval of a ratio of medians."""

from __future__ import annotations

import random
import statistics


def quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    if not s:
        raise ValueError("no samples")
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def spread(xs: list[float]) -> float:
    """(p90 - p10) / median: a unitless noise figure."""
    return (quantile(xs, 0.9) - quantile(xs, 0.1)) / statistics.median(xs)


def ratio_interval(
    a: list[float], b: list[float], level: float = 0.95, resamples: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """median(a)/median(b) and a percentile-bootstrap interval (deterministic for a seed)."""
    if not a or not b:
        raise ValueError("need samples on both sides")
    rng = random.Random(seed)
    ratios = []
    for _ in range(resamples):
        ra = [rng.choice(a) for _ in a]
        rb = [rng.choice(b) for _ in b]
        ratios.append(statistics.median(ra) / statistics.median(rb))
    alpha = (1 - level) / 2
    return statistics.median(a) / statistics.median(b), quantile(ratios, alpha), quantile(ratios, 1 - alpha)


def verdict(a: list[float], b: list[float], min_gain: float = 0.01) -> tuple[str, tuple[float, float, float]]:
    """Is `b` faster than `a` (times)? 'faster' / 'slower' only if the interval of a/b excludes 1 by min_gain."""
    r, lo, hi = ratio_interval(a, b)
    if lo > 1.0 + min_gain:
        return "faster", (r, lo, hi)
    if hi < 1.0 - min_gain:
        return "slower", (r, lo, hi)
    return "within noise", (r, lo, hi)
