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


def _interval(draw_a, draw_b, point: float, level: float, resamples: int, seed: int) -> tuple[float, float, float]:
    """`point` and the percentile interval of median(draw_a) / median(draw_b) over `resamples` draws."""
    rng = random.Random(seed)
    ratios = [statistics.median(draw_a(rng)) / statistics.median(draw_b(rng)) for _ in range(resamples)]
    alpha = (1 - level) / 2
    return point, quantile(ratios, alpha), quantile(ratios, 1 - alpha)


def ratio_interval(
    a: list[float], b: list[float], level: float = 0.95, resamples: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """median(a)/median(b) and a percentile-bootstrap interval (deterministic for a seed)."""
    if not a or not b:
        raise ValueError("need samples on both sides")
    return _interval(lambda rng: [rng.choice(a) for _ in a], lambda rng: [rng.choice(b) for _ in b],
                     statistics.median(a) / statistics.median(b), level, resamples, seed)


def grouped_ratio_interval(
    a: list[list[float]], b: list[list[float]], level: float = 0.95, resamples: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """As ratio_interval, for samples that come in groups sharing a condition (a compare's round: one module
    load of each version, whose code placement biases all its samples alike). Each draw resamples the groups,
    then the samples within each drawn group, so what a group shares widens the interval instead of hiding
    in it (a two-stage bootstrap)."""
    if not any(a) or not any(b):
        raise ValueError("need samples on both sides")
    a, b = [g for g in a if g], [g for g in b if g]

    def draw(groups):
        return lambda rng: [rng.choice(g) for g in [rng.choice(groups) for _ in groups] for _ in g]

    point = statistics.median([x for g in a for x in g]) / statistics.median([x for g in b for x in g])
    return _interval(draw(a), draw(b), point, level, resamples, seed)


def rule_interval(a: list[list[float]], b: list[list[float]], by_load: bool = True
                  ) -> tuple[float, float, float]:
    """The keep rule's interval of median(a)/median(b) for samples grouped by module load: grouped (two-stage),
    or pooled as the rule drew it before the forty-eighth session (`by_load=False`, for old traces)."""
    if by_load:
        return grouped_ratio_interval(a, b)
    return ratio_interval([x for g in a for x in g], [x for g in b for x in g])


def verdict_of(interval: tuple[float, float, float], min_gain: float = 0.01) -> str:
    """'faster' / 'slower' only if the interval of a/b excludes 1 by min_gain, else 'within noise'."""
    _, lo, hi = interval
    if lo > 1.0 + min_gain:
        return "faster"
    if hi < 1.0 - min_gain:
        return "slower"
    return "within noise"


def verdict(a: list[float], b: list[float], min_gain: float = 0.01) -> tuple[str, tuple[float, float, float]]:
    """Is `b` faster than `a` (times)? 'faster' / 'slower' only if the interval of a/b excludes 1 by min_gain."""
    interval = ratio_interval(a, b)
    return verdict_of(interval, min_gain), interval
