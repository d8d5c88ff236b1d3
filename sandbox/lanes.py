"""Evaluators for every GPU of this host: one warm worker per GPU, pinned by CUDA_VISIBLE_DEVICES.

The parent never touches CUDA, so the GPUs are counted from CUDA_VISIBLE_DEVICES when it is set (its
entries, in order) and from `nvidia-smi -L` otherwise. The evaluators share one build-ahead pool: the
GPUs of one host share an architecture, so a build made for one serves all of them.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from megakernel_agent.tasks.registry import get_task

from .build_ahead import BuildAhead
from .pool import Evaluator


class GpuCountError(ValueError):
    """--gpus asks for more GPUs than this host shows, or they cannot be counted."""


def host_gpus() -> list[str]:
    """The ids a worker may be pinned to: CUDA_VISIBLE_DEVICES's entries when set, else nvidia-smi's indices."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [d.strip() for d in visible.split(",") if d.strip() and not d.strip().startswith("-")]
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        raise GpuCountError(f"cannot count this host's GPUs (nvidia-smi: {e}); set CUDA_VISIBLE_DEVICES") from None
    if listing.returncode != 0:
        raise GpuCountError(f"cannot count this host's GPUs: nvidia-smi -L said {listing.stderr.strip()[:200]!r}")
    return [m[1] for m in re.finditer(r"^GPU (\d+):", listing.stdout, re.MULTILINE)]


def pick_gpus(spec: str) -> list[str]:
    """--gpus N|all -> the device ids of the lanes. One GPU is not pinned (the worker takes what it sees, as
    without --gpus), so a single-GPU session never needs nvidia-smi."""
    if spec != "all":
        try:
            n = int(spec)
        except ValueError:
            raise GpuCountError(f"--gpus takes a number or 'all', not {spec!r}") from None
        if n < 1:
            raise GpuCountError(f"--gpus must be at least 1 (got {n})")
        if n == 1:
            return []
    ids = host_gpus()
    if spec == "all":
        return ids if len(ids) > 1 else []
    if n > len(ids):
        raise GpuCountError(f"--gpus {n} asks for more GPUs than this host shows "
                            f"({len(ids)}: {', '.join(ids) or 'none'})")
    return ids[:n]


def local_evaluators(task: str, size: str, gpus: list[str], work_dir: Path, build_ahead: int = 0,
                     **options) -> list[Evaluator]:
    """One evaluator per id in `gpus` (none pinned when it is empty), each with its own worker logs under
    `work_dir`/gpu<id>, all loading builds from one pool of `build_ahead` compile threads. `options` go to
    every Evaluator (timeouts, worker module, extra environment)."""
    work_dir = Path(work_dir)
    if not gpus:
        return [Evaluator(task, size, work_dir=work_dir, build_ahead=build_ahead, **options)]
    extra = dict(options.pop("extra_env", None) or {})
    ahead = BuildAhead(get_task(task, size), work_dir / "builds", build_ahead) if build_ahead else None
    try:
        return [Evaluator(task, size, work_dir=work_dir / f"gpu{gpu}", build_ahead=ahead or 0, name=f"gpu{gpu}",
                          extra_env={**extra, "CUDA_VISIBLE_DEVICES": gpu}, **options) for gpu in gpus]
    finally:
        if ahead is not None:
            ahead.close()   # the evaluators hold it now; the last of them to close really closes it
