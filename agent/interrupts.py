"""SIGINT and SIGTERM during a session: the first ends it the way Ctrl-C does; none cuts cleanup short.

Without a handler SIGTERM ends the process on the spot (exit 143): no session_end and no summary. A second
Ctrl-C while the session cleans up must not skip stopping the worker, so only the first signal is raised,
and none while cleaning; later ones are noted and the loop stops at its next turn even if the first was
swallowed somewhere.
"""

from __future__ import annotations

import signal
import threading


class Interrupted(KeyboardInterrupt):
    """Raised by the first SIGINT or SIGTERM of a session."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def reason_for(signum: int) -> str:
    """The session_end reason for a signal."""
    return "interrupted (Ctrl-C)" if signum == signal.SIGINT else f"terminated ({signal.Signals(signum).name})"


class SessionSignals:
    """Installs the handlers for the duration of a `with` block, then restores the previous ones.

    Signals reach only the main thread, so elsewhere this does nothing (the caller keeps its own handling).
    """

    HANDLED = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.received: int | None = None
        self.cleaning = False
        self._previous: dict = {}

    def __enter__(self) -> SessionSignals:
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._handle) for sig in self.HANDLED}
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        self._previous = {}

    def _handle(self, signum: int, _frame) -> None:
        first = self.received is None
        if first:
            self.received = signum
        if first and not self.cleaning:
            raise Interrupted(signum)
