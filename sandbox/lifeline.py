"""Runs a worker and ties its whole process group to the session that started it.

Started by sandbox.pool as the leader of a new process group:
`python -m megakernel_agent.sandbox.lifeline SESSION_PID CMD...`.
When the session dies (even by kill -9, when nothing of it can clean up) or the worker exits, this process
kills the group: the worker, anything the worker started (a compiler, a helper) and itself. A hung kernel
then cannot keep a GPU busy after its session is gone. The worker also gets PR_SET_PDEATHSIG, so it dies
at once should this process be killed alone.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time

POLL_S = 0.2
PR_SET_PDEATHSIG = 1


def _die_with_lifeline() -> None:
    """Runs in the worker between fork and exec: SIGKILL it when its parent (this process) dies."""
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


def watch(session_pid: int, command: list[str]) -> None:
    """Start `command` with our stdin/stdout, let go of them, and kill the group when either side is gone."""
    worker = subprocess.Popen(command, preexec_fn=_die_with_lifeline)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)  # the worker alone holds the protocol pipes: its exit is the session's EOF
    os.dup2(devnull, 1)
    while worker.poll() is None and os.getppid() == session_pid:
        time.sleep(POLL_S)
    os.killpg(0, signal.SIGKILL)


if __name__ == "__main__":
    watch(int(sys.argv[1]), sys.argv[2:])
