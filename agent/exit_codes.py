"""The CLI's exit codes, defined once (README lists them)."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    FAILED = 1         # the job ran and failed: a wrong or slower kernel, a session that did not start or broke
    USAGE = 2          # a usage error or bad input (argparse's own code), found before any GPU work
    NO_GPU = 3         # no GPU visible here, or the GPU worker did not start
    INTERRUPTED = 130  # Ctrl-C (128 + SIGINT)
    TERMINATED = 143   # SIGTERM (128 + SIGTERM)


def session_exit(reason: str) -> ExitCode:
    """A finished session's code from its end reason (agent.interrupts.reason_for and Session's own words)."""
    if reason.startswith("interrupted"):
        return ExitCode.INTERRUPTED
    if reason.startswith("terminated"):
        return ExitCode.TERMINATED
    if reason.startswith(("stopped:", "planner failed")):
        return ExitCode.FAILED
    return ExitCode.OK
