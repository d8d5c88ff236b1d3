"""Anchored search/replace edits on a kernel source, with errors precise enough to hand back to a model."""

from __future__ import annotations

from pydantic import BaseModel


class Edit(BaseModel):
    search: str
    replace: str


class EditError(ValueError):
    pass


def apply_edits(source: str, edits: list[Edit]) -> str:
    """Apply edits in order; each `search` must occur exactly once in the text as it stands then."""
    for i, e in enumerate(edits, 1):
        if not e.search:
            raise EditError(f"edit {i}: empty search text")
        count = source.count(e.search)
        if count == 0:
            head = e.search.strip().splitlines()[0][:80] if e.search.strip() else repr(e.search)
            raise EditError(f"edit {i}: search text not found (first line: {head!r}); copy it exactly from the source")
        if count > 1:
            raise EditError(f"edit {i}: search text occurs {count} times; include more context so it is unique")
        source = source.replace(e.search, e.replace, 1)
    return source
