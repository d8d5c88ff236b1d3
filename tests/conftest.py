"""Shared test setup: GPU tests skip cleanly where CUDA is unavailable."""

from __future__ import annotations

import ctypes
import os

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU with CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _landlock_abi() -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc.syscall(444, None, ctypes.c_size_t(0), ctypes.c_uint32(1))


@pytest.fixture(autouse=True, scope="session")
def _compiler_confinement():
    """The compiler refuses to run unconfined; on a test machine whose kernel has no Landlock, the tests that
    compile are allowed to anyway (the fail-closed test clears this for itself)."""
    if _landlock_abi() < 1:
        os.environ["MK_ALLOW_UNCONFINED_COMPILER"] = "1"
    yield


@pytest.fixture(autouse=True)
def _deterministic_cpu():
    torch.manual_seed(0)
    yield
