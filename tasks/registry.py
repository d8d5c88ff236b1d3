"""Name -> task class. Adding a task = a folder under tasks/ plus one line here."""

from __future__ import annotations

from .base import Task
from .kimi_linear.task import KimiTask
from .w4a16_gemv.task import GemvTask

TASKS: dict[str, type[Task]] = {"kimi_linear": KimiTask, "w4a16_gemv": GemvTask}


def get_task(name: str, size: str = "full") -> Task:
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; available: {', '.join(sorted(TASKS))}")
    return TASKS[name](size)
