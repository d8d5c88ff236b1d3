"""The compiler process: NVRTC on one source, confined first (resource limits, Landlock), then judged by nothing.

Started by sandbox.compiler with an allow-listed environment and the caller's pid as its argument. Reads one
JSON request on stdin and writes one JSON answer on stdout. NVRTC and its builtins library are loaded (by
compiling an empty program) before the confinement, so that afterwards the process can read nothing but the
include folders.
"""

from __future__ import annotations

import base64
import ctypes
import json
import os
import signal
import sys

from .lifeline import PR_SET_PDEATHSIG


def _tie_to(parent: int) -> None:
    """SIGKILL this process when the thread that started it ends; end now if the caller is already gone."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)


def main() -> None:
    _tie_to(int(sys.argv[1]))
    req = json.loads(sys.stdin.read())
    from .confinement import limit_resources, restrict_filesystem

    limit_resources(req["memory_bytes"], req["cpu_seconds"])
    from cupy_backends.cuda.libs import nvrtc

    arch = [o for o in req["options"] if o.startswith("-arch=")]
    warm = nvrtc.createProgram("", "warm_up.cu", [], [])
    nvrtc.compileProgram(warm, arch)
    nvrtc.destroyProgram(warm)
    confinement = restrict_filesystem(req["include_dirs"])
    answer = {"confinement": confinement, "nvrtc": ".".join(map(str, nvrtc.getVersion())), "log": ""}
    if confinement.startswith("unconfined") and not req["allow_unconfined"]:
        answer |= {"ok": False, "error": f"the compiler could not be confined ({confinement}); it does not compile "
                                         "untrusted source unconfined (MK_ALLOW_UNCONFINED_COMPILER=1 allows it)"}
        sys.stdout.write(json.dumps(answer))
        return
    prog = nvrtc.createProgram(req["source"], req["name"], [], [])
    try:
        nvrtc.compileProgram(prog, [*req["options"], *(f"-I{d}" for d in req["include_dirs"])])
        answer |= {"ok": True, "cubin": base64.b64encode(nvrtc.getCUBIN(prog)).decode()}
    except nvrtc.NVRTCError as e:
        answer |= {"ok": False, "error": str(e)}
    answer["log"] = nvrtc.getProgramLog(prog)
    sys.stdout.write(json.dumps(answer))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
