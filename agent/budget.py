"""Wall-clock budget of a session: what is left decides every phase timeout."""

from __future__ import annotations

import re
import time


def parse_duration(text: str) -> float:
    """'30m', '90s', '1h30m', '600' -> seconds."""
    text = text.strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    parts = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", text)
    if not parts or not any(parts.groups()):
        raise ValueError(f"cannot read duration {text!r} (use e.g. 30m, 90s, 1h30m)")
    h, m, s = (int(g or 0) for g in parts.groups())
    return float(h * 3600 + m * 60 + s)


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
