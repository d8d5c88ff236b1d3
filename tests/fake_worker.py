"""A stand-in GPU worker speaking the real protocol, for testing the pool's timeout/kill/crash paths.

The request's source decides the behaviour: HANG_CHECK sleeps in the check phase (after starting a
grandchild that must die with the group), DIE exits mid-build, anything else returns a passing result.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from traces.results import DeviceInfo, EvalResult


def send(out, obj):
    out.write(json.dumps(obj) + "\n")
    out.flush()


def main():
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    if os.environ.get("FAKE_WORKER_NO_GPU"):
        send(out, {"event": "fatal", "message": "RuntimeError: no CUDA GPU is visible to this process"})
        return
    info = DeviceInfo(name="fake", sms=1, memory_gb=1, l2_mb=1, copy_tbs=1, driver="0", cuda="0", torch="0",
                      cupy="0", capability="0.0")
    send(out, {"event": "ready", "pid": os.getpid(), "device": info.model_dump()})
    for line in sys.stdin:
        msg = json.loads(line)
        if msg["op"] == "shutdown":
            return
        src = msg["request"]["source"]
        send(out, {"event": "phase", "phase": "build"})
        if "DIE" in src:
            os._exit(3)
        send(out, {"event": "phase", "phase": "check"})
        if "HANG_CHECK" in src:
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
            with open(os.environ["FAKE_WORKER_PIDFILE"], "w") as f:
                f.write(str(child.pid))
            time.sleep(600)
        send(out, {"event": "result", "retire": False,
                   "result": EvalResult(task="fake", size="x", key="k", knobs={}).model_dump()})


if __name__ == "__main__":
    main()
