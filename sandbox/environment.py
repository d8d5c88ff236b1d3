"""The environment a worker process gets: an allow-list of this process's variables, never its secrets.

A worker runs candidate code; it needs the toolchain's variables (paths, locale, CUDA, CuPy, torch) and
nothing else, so an API key or cloud credential in the session's environment never reaches it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from megakernel_agent.traces.redaction import looks_secret

ALLOWED_NAMES = frozenset({"PATH", "HOME", "USER", "LANG", "TMPDIR", "TERM", "PYTHONUNBUFFERED", "LD_LIBRARY_PATH",
                           "MK_ALLOW_UNCONFINED_COMPILER"})   # the compiler's opt-in on hosts without Landlock
ALLOWED_PREFIXES = ("LC_", "CUDA_", "CUPY_", "NVIDIA_", "TORCH_", "PYTORCH_", "TRITON_")  # CUDA_VISIBLE_DEVICES too


def allowed(name: str) -> bool:
    """A variable a worker may inherit: on the allow-list and not named like a secret."""
    return (name in ALLOWED_NAMES or name.startswith(ALLOWED_PREFIXES)) and not looks_secret(name)


def worker_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The allowed part of os.environ, then `extra` (set by the caller on purpose; secret names are refused)."""
    extra = dict(extra or {})
    secret = sorted(name for name in extra if looks_secret(name))
    if secret:
        raise ValueError(f"refusing to hand secret-named variables to a worker: {', '.join(secret)}")
    return {name: value for name, value in os.environ.items() if allowed(name)} | extra
