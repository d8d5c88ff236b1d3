"""Why a session could not start; each message is one line a user can act on (the CLI prints it)."""

from __future__ import annotations


class StartError(RuntimeError):
    """The session cannot start: nothing to optimize from, or nowhere safe to write."""


class RunFolderInUse(StartError):
    """The output folder holds another run, or the trace is held by another session."""


class ResumeMismatch(StartError):
    """The trace being resumed records another task or size than the one given."""


class BadInput(ValueError):
    """A command's input is unusable (a file, a name, a knob, a kernel that does not compile): one line, exit 2."""
