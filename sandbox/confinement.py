"""Confine the current process: resource limits and a Landlock ruleset (read-only access to a few folders,
no writes, no TCP). Used by the compiler process before it reads a candidate's source.

Landlock needs Linux 5.13+; where the kernel or a container refuses it, `restrict_filesystem` says
why and the caller records that the compiler ran unconfined (the token-stream rules still apply).
"""

from __future__ import annotations

import ctypes
import os
import resource

SYS_CREATE_RULESET, SYS_ADD_RULE, SYS_RESTRICT_SELF = 444, 445, 446   # the same on x86-64 and arm64
PR_SET_NO_NEW_PRIVS = 38
RULE_PATH_BENEATH = 1
CREATE_RULESET_VERSION = 1
READ_FILE, READ_DIR = 1 << 2, 1 << 3
REFER, TRUNCATE, IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1


class RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def limit_resources(memory_bytes: int, cpu_seconds: int) -> None:
    """Address space, CPU time, no files written, no core dumps."""
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 5))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _handled_fs(abi: int) -> int:
    handled = (1 << 13) - 1   # ABI 1: execute .. make_sym
    if abi >= 2:
        handled |= REFER
    if abi >= 3:
        handled |= TRUNCATE
    if abi >= 5:
        handled |= IOCTL_DEV
    return handled


def restrict_filesystem(readable: list[str]) -> str:
    """Allow only reading files and listing folders beneath `readable` (no writes anywhere, no TCP, no
    signals to other processes where the kernel supports it). Returns what was applied, or why not."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    abi = libc.syscall(SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(CREATE_RULESET_VERSION))
    if abi < 0:
        return f"unconfined: Landlock unavailable ({os.strerror(ctypes.get_errno())})"
    attr = RulesetAttr(_handled_fs(abi), NET_BIND_TCP | NET_CONNECT_TCP if abi >= 4 else 0,
                       SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0)
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    fd = libc.syscall(SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if fd < 0:
        return f"unconfined: landlock_create_ruleset failed ({os.strerror(ctypes.get_errno())})"
    try:
        for path in readable:
            try:
                dir_fd = os.open(path, os.O_PATH | os.O_DIRECTORY)
            except OSError as e:
                return f"unconfined: cannot open {path} ({e.strerror})"
            try:
                rule = PathBeneathAttr(READ_FILE | READ_DIR, dir_fd)
                if libc.syscall(SYS_ADD_RULE, ctypes.c_int(fd), ctypes.c_int(RULE_PATH_BENEATH),
                                ctypes.byref(rule), ctypes.c_uint32(0)) < 0:
                    return f"unconfined: landlock_add_rule({path}) failed ({os.strerror(ctypes.get_errno())})"
            finally:
                os.close(dir_fd)
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            return f"unconfined: PR_SET_NO_NEW_PRIVS failed ({os.strerror(ctypes.get_errno())})"
        if libc.syscall(SYS_RESTRICT_SELF, ctypes.c_int(fd), ctypes.c_uint32(0)) < 0:
            return f"unconfined: landlock_restrict_self failed ({os.strerror(ctypes.get_errno())})"
    finally:
        os.close(fd)
    return f"Landlock ABI {abi}: read-only access to {len(readable)} CUDA header folder(s); no writes, no TCP"
