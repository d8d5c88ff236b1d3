"""The folder a session writes into: refused when it holds another run; best.cu replaced atomically."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from .errors import RunFolderInUse


def check_out_dir(out_dir: Path, resumed_trace: Path | None = None, work_dir: Path | None = None) -> None:
    """Raise RunFolderInUse unless `out_dir` may receive this session's trace, best.cu and report.

    A new session needs a folder that does not exist yet, is empty, or holds only the evaluator's `work_dir`
    or a folder around it (the CLI puts it in the run folder as sandbox/, one sandbox/gpu<n> per GPU, and
    creates it before the session starts, and a failed start leaves it behind). A resumed session may also
    write into the folder of the trace it resumes: that run continues there.
    """
    out_dir = Path(out_dir)
    if resumed_trace is not None and out_dir.resolve() == Path(resumed_trace).resolve().parent:
        return
    if not out_dir.exists():
        return
    if not out_dir.is_dir():
        raise RunFolderInUse(f"{out_dir} is not a folder")
    ours = Path(work_dir).resolve() if work_dir is not None else None
    held = sorted(p.name for p in out_dir.iterdir()
                  if ours is None or (p.resolve() != ours and p.resolve() not in ours.parents))
    if held:
        raise RunFolderInUse(f"{out_dir} already holds another run ({', '.join(held[:4])}"
                             f"{', ...' if len(held) > 4 else ''}): choose an empty folder, or resume that run's trace")


def missing_folders(path: Path) -> list[Path]:
    """`path` and those of its parents that do not exist yet, innermost first: what making it creates."""
    missing = []
    for p in [Path(path).absolute(), *Path(path).absolute().parents]:
        if p.exists():
            break
        missing.append(p)
    return missing


def remove_folders(made: list[Path]) -> None:
    """Undo `missing_folders` for a run that never started: the run folder with what it holds, its parents
    only while they are empty (another session may have put its own run there meanwhile)."""
    if not made:
        return
    shutil.rmtree(made[0], ignore_errors=True)
    for parent in made[1:]:
        try:
            parent.rmdir()
        except OSError:
            return


def write_best(out_dir: Path, text: str) -> Path:
    """Replace out_dir/best.cu atomically: a reader, or a crash, sees the old kernel or the new one, never half."""
    path = Path(out_dir) / "best.cu"
    tmp = path.with_name(".best.cu.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
