"""A stand-in GPU worker speaking the real protocol, for testing the pool's fault paths without a GPU.

The request's source decides the behaviour:
- HANG_CHECK: sleeps in the check phase after starting a grandchild that must die with the group; writes
  "<worker pid> <grandchild pid>" to $FAKE_WORKER_PIDFILE first.
- DIE: exits mid-build.
- GARBAGE, NO_EVENT, UNKNOWN_EVENT, BAD_RESULT, FATAL_MIDWAY: a malformed or unexpected message in check.
- INFRA: an infra failure marked retryable, retiring the worker (our side broke, not the candidate).
- ENV_DUMP: writes this process's environment as JSON to $FAKE_WORKER_ENV_OUT.
- SLEEP: sleeps $FAKE_WORKER_SLEEP_S (default 1) in check, then appends "<pid> <start> <end>" (time.time()) to
  $FAKE_WORKER_SPANS, so tests can see evaluations overlap across workers.
- HANG_ONCE: hangs like HANG_CHECK when $FAKE_WORKER_ONCE_FILE does not exist yet (creating it), else passes.
- anything else: a passing result.
Before "ready": $FAKE_WORKER_NO_GPU sends the no-GPU fatal message, $FAKE_WORKER_GARBAGE_START a non-JSON line,
$FAKE_WORKER_START_S sleeps that long (a worker loading its model);
$FAKE_WORKER_CAPABILITY is the compute capability it reports (for building ahead on the CPU).
Every result carries the worker's pid, so tests can tell a fresh worker from a reused one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from megakernel_agent.traces.results import DeviceInfo, EvalResult, Failure, FailureClass

MALFORMED = {
    "GARBAGE": "Segmentation fault (core dumped)",
    "NO_EVENT": json.dumps({"phase": "time"}),
    "UNKNOWN_EVENT": json.dumps({"event": "gossip"}),
    "BAD_RESULT": json.dumps({"event": "result", "result": {"task": "fake", "timings": "fast"}}),
    "FATAL_MIDWAY": json.dumps({"event": "fatal", "message": "out of memory"}),
}


def send(out, obj):
    out.write((obj if isinstance(obj, str) else json.dumps(obj)) + "\n")
    out.flush()


def hang_in_check() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with open(os.environ["FAKE_WORKER_PIDFILE"], "w") as f:
        f.write(f"{os.getpid()} {child.pid}")
    time.sleep(600)


def result(src: str) -> dict:
    res = EvalResult(task="fake", size="x", key="k", knobs={}, worker_pid=os.getpid())
    if "INFRA" in src:
        res.failure = Failure(cls=FailureClass.infra, phase="check", message="scripted infra", retryable=True)
    return {"event": "result", "retire": "INFRA" in src, "result": res.model_dump()}


def main():
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    if os.environ.get("FAKE_WORKER_NO_GPU"):
        send(out, {"event": "fatal", "message": "RuntimeError: no CUDA GPU is visible to this process"})
        return
    time.sleep(float(os.environ.get("FAKE_WORKER_START_S", "0")))
    if os.environ.get("FAKE_WORKER_GARBAGE_START"):
        send(out, "Warning: something printed to the protocol stream")
    info = DeviceInfo(name="fake", sms=1, memory_gb=1, l2_mb=1, copy_tbs=1, driver="0", cuda="0", torch="0",
                      cupy="0", capability=os.environ.get("FAKE_WORKER_CAPABILITY", "0.0"))
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
            hang_in_check()
        if "HANG_ONCE" in src:
            try:
                os.close(os.open(os.environ["FAKE_WORKER_ONCE_FILE"], os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                hang_in_check()
            except FileExistsError:
                pass
        if "SLEEP" in src:
            start = time.time()
            time.sleep(float(os.environ.get("FAKE_WORKER_SLEEP_S", "1")))
            with open(os.environ["FAKE_WORKER_SPANS"], "a") as f:
                f.write(f"{os.getpid()} {start} {time.time()}\n")
        if "ENV_DUMP" in src:
            with open(os.environ["FAKE_WORKER_ENV_OUT"], "w") as f:
                json.dump(dict(os.environ), f)
        bad = next((text for key, text in MALFORMED.items() if key in src), None)
        send(out, bad or result(src))


if __name__ == "__main__":
    main()
