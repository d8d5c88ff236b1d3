"""Render one field list as both a CUDA struct and its ctypes mirror (the ABI is defined once).

Fields are (name, C type, count). Pointers are 8 bytes on both sides and `int` fields come last,
so no padding differs. Imports nothing from this project (export embeds it).
"""

from __future__ import annotations

import ctypes

Field = tuple[str, str, int]


def c_struct(name: str, fields: list[Field]) -> str:
    lines = [f"struct {name} {{"]
    for fname, ctype, count in fields:
        lines.append(f"  {ctype} {fname}{f'[{count}]' if count > 1 else ''};")
    lines.append("};")
    return "\n".join(lines)


def py_struct(name: str, fields: list[Field], nested: dict[str, type] | None = None) -> type:
    nested = nested or {}
    layout = []
    for fname, ctype, count in fields:
        t = nested.get(ctype) or (ctypes.c_int if ctype == "int" else ctypes.c_uint64)
        layout.append((fname, t * count if count > 1 else t))
    return type(name, (ctypes.Structure,), {"_fields_": layout})
