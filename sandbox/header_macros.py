"""Macros of the CUDA headers a candidate may include that would undo the source rules.

The rules refuse `_Pragma`, `__has_include` and `##` in the candidate's own text, but a listed header
(libcudacxx, through <cuda/std/...>) defines `_CCCL_PRAGMA(x)` as `_Pragma(#x)`, `_CCCL_HAS_INCLUDE(x)`
as `__has_include(x)` and pasting helpers built on `##` (which can assemble either). Every macro defined
in the header folders whose replacement uses one of those, directly or through another such macro, is
refused by name. Read from the headers the compiler will use (cached per process).
"""

from __future__ import annotations

import functools
import os
import re

OPERATORS = {"_Pragma", "__pragma", "__has_include", "__has_include_next", "__has_embed"}
DEFINE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+(\w+)(\([^)]*\))?(.*)$", re.MULTILINE)
IDENT = re.compile(r"[A-Za-z_]\w*")
HEADER_SUFFIXES = ("", ".h", ".hpp", ".cuh", ".inl", ".inc", ".hxx")


def macros_that_reach_the_preprocessor(texts: list[str]) -> frozenset[str]:
    """Names of the macros in `texts` through which a candidate's own tokens could be pasted, run as a
    pragma or tested as a file name: function-like macros that use `##`, `_Pragma`, `__has_include` or such
    a macro; and object-like macros that name one of those without calling it (an alias the candidate can
    call). An object-like macro that expands to a fixed call (`INFINITY`, a namespace) is harmless."""
    function_like: dict[str, str] = {}
    object_like: dict[str, str] = {}
    for text in texts:
        for m in DEFINE.finditer(text.replace("\\\r\n", " ").replace("\\\n", " ")):
            table = function_like if m.group(2) else object_like
            table[m.group(1)] = table.get(m.group(1), "") + " " + m.group(3)
    denied = {name for name, body in function_like.items() if "##" in body or set(IDENT.findall(body)) & OPERATORS}
    grew = True
    while grew:
        risky = denied | OPERATORS
        more = {name for name, body in function_like.items() if name not in denied and set(IDENT.findall(body)) & risky}
        more |= {name for name, body in object_like.items() if name not in denied and _names_uncalled(body) & risky}
        denied |= more
        grew = bool(more)
    return frozenset(denied)


def _names_uncalled(body: str) -> set[str]:
    """Identifiers of a replacement list that are not followed by '(' (a bare name: an alias)."""
    return {m.group(0) for m in IDENT.finditer(body) if not body[m.end():].lstrip().startswith("(")}


@functools.cache
def dangerous_header_macros(dirs: tuple[str, ...]) -> frozenset[str]:
    """macros_that_reach_the_preprocessor over every header file below `dirs`."""
    texts = []
    for top in dirs:
        for root, _, files in os.walk(top):
            for f in files:
                if os.path.splitext(f)[1] in HEADER_SUFFIXES:
                    try:
                        with open(os.path.join(root, f), encoding="utf-8", errors="replace") as fh:
                            texts.append(fh.read())
                    except OSError:
                        continue
    return macros_that_reach_the_preprocessor(texts)
