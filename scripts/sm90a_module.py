"""Compile a probe's CUDA source for sm_90a with NVRTC and load it. CuPy's RawModule would pick sm_90, which lacks
the `a` features mma_rate_probe uses (wgmma, setmaxnreg); the other probes build the same way."""

from __future__ import annotations

import tempfile
from pathlib import Path

import cupy
from cupy_backends.cuda.libs import nvrtc


def load_sm90a(source: Path) -> cupy.RawModule:
    """The loaded module of `source`; exits with the compiler log if it does not compile."""
    prog = nvrtc.createProgram(source.read_text(), source.name, [], [])
    try:
        nvrtc.compileProgram(prog, ["-std=c++17", "-arch=sm_90a"])
    except nvrtc.NVRTCError as e:
        raise SystemExit(f"{source.name} did not compile: {e}\n{nvrtc.getProgramLog(prog)}") from None
    cubin = Path(tempfile.mkdtemp(prefix=f"{source.stem}-")) / "probe.cubin"
    cubin.write_bytes(nvrtc.getCUBIN(prog))
    return cupy.RawModule(path=str(cubin))
