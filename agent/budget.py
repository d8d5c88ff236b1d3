"""Wall-clock budget of a session: what is left decides every phase timeout."""

from __future__ import annotations

import re
import time

MAX_BUDGET_S = 7 * 24 * 3600  # longer is a typo, and would overflow the timeouts derived from it


def parse_duration(text: str) -> float:
    """'30m', '90s', '1h30m', '600' -> seconds; anything else, or no time at all, is a ValueError."""
    clean = text.strip().lower()
    parts = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", clean)
    if re.fullmatch(r"\d+(\.\d+)?", clean):
        seconds = float(clean)
    elif parts and any(parts.groups()):
        h, m, s = (int(g or 0) for g in parts.groups())
        seconds = float(h * 3600 + m * 60 + s)
    else:
        raise ValueError(f"cannot read duration {text!r} (use e.g. 30m, 90s, 1h30m or 600)")
    if not 0 < seconds <= MAX_BUDGET_S:
        raise ValueError(f"duration {text!r} must be more than zero and at most a week")
    return seconds


class Budget:
    def __init__(self, seconds: float, clock=time.monotonic):
        self.total = seconds
        self._clock = clock
        self._start = clock()

    def spent(self) -> float:
        return self._clock() - self._start

    def remaining(self) -> float:
        return max(0.0, self.total - self.spent())

    def deadline(self) -> float:
        """The budget's end on the same clock as time.monotonic()."""
        return self._start + self.total
