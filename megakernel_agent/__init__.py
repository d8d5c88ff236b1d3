"""One installed name for the project's packages: megakernel_agent.agent, .sandbox, .tasks, .traces, .kernels.

The repository keeps them as top-level folders (the layout the design asks for); in a checkout this package
reaches them by adding the repository root to its own search path. A wheel holds them inside this package
(pyproject.toml maps each folder here), so installing never claims generic top-level names such as `traces`
or `agent`, which other distributions on PyPI use.
"""

from __future__ import annotations

from pathlib import Path

IMPORT_ROOT = Path(__file__).resolve().parent.parent   # the folder a child process needs on its PYTHONPATH
_CHECKOUT_MARKS = ("pyproject.toml", "traces/__init__.py", "sandbox/__init__.py")

if all((IMPORT_ROOT / mark).is_file() for mark in _CHECKOUT_MARKS):
    __path__.append(str(IMPORT_ROOT))
