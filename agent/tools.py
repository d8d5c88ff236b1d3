"""The tools a planner works with, one pydantic input model each; the LLM tool schemas are generated from
these models, and the session runs every tool but `propose` and `finish` (agent.session_tools)."""

from __future__ import annotations

import copy
from typing import Literal

from pydantic import BaseModel, Field

from .edits import Edit


class OutlineInput(BaseModel):
    """Sections and top-level definitions of a version's source, with line ranges."""

    version: str = Field("best", description="a version id, a name you gave, or 'best'")


class ReadInput(BaseModel):
    """Numbered source lines of a version: a line range (at most 400 lines) or a definition by name."""

    version: str = Field("best", description="a version id, a name you gave, or 'best'")
    start: int | None = Field(None, description="first line (1-based)")
    end: int | None = Field(None, description="last line (inclusive)")
    symbol: str | None = Field(None, description="a top-level definition's name instead of a range")


class ProfileInput(BaseModel):
    """Phase timeline of a correct version (on the GPU; costs budget): per phase the critical span, mean
    block work, barrier wait, bytes and achieved TB/s."""

    version: str = Field("best", description="a version id, a name you gave, or 'best'")
    contexts: list[int] = Field([], description="contexts to profile (default: the largest timed one)")


class DiagnoseInput(BaseModel):
    """Why a version failed (full compiler log; every compared tensor against its bound, the first layer that
    diverges, the routing tie branches tried), or how close a correct one came to its bounds. No GPU."""

    version: str = Field(description="a version id or a name you gave")


class CompareInput(BaseModel):
    """Interleaved A/B timing of two versions (A B, B A, ..., on the GPU; costs budget), speedup of B over A
    per context with a 95% bootstrap interval."""

    a: str = Field(description="version id or name")
    b: str = Field(description="version id or name")
    rounds: int = Field(3, ge=1, le=10)
    contexts: list[int] = Field([], description="default: every timed context")


class ModelInput(BaseModel):
    """The task's schedule model (no GPU, ~1 s): a discrete-event replay of every block of the seed's schedule,
    fed by probe figures and the version's own phase stamps (profile it first). Predicts the step's kernel µs
    and each phase's span for knob values set on the version, or for a named what-if (e.g. a faster inner
    loop, free barriers), against the version as it is. Only the seed's own source is modelled."""

    version: str = Field("best", description="a version id, a name you gave, or 'best' (profiled, seed source)")
    knobs: dict[str, int] = Field({}, description="knob values to model (merged onto the version's)")
    what_if: str | None = Field(None, description="a named what-if of the task's model (the tool lists them)")


class NoteInput(BaseModel):
    """Write to the session notebook (kept in the trace and the report): a prediction with its model, an
    observation, an idea, or an idea dropped and why."""

    kind: Literal["prediction", "observation", "idea", "dropped"]
    text: str
    refs: list[str] = Field([], description="version ids the note is about")


class ProposeInput(BaseModel):
    """Submit a new version, built on a parent: anchored search/replace edits of the parent's source (or a
    whole new source), knob values merged onto the parent's, a hypothesis and a prediction. It is built,
    checked against the fp32 reference and timed; the outcome comes back as this call's result (when the session
    keeps several in flight, the result may say it is still being evaluated; its outcome then follows later)."""

    parent: str = Field("best", description="the version to build on: an id, a name you gave, or 'best'; a "
                                            "failed version may be named to repair it")
    name: str = Field("", description="your short label for this version (later proposals may name it as parent)")
    hypothesis: str = Field(description="what changes and why it should be faster, against a model of the time")
    predicted_us: dict[int, float] = Field({}, description="predicted µs/token per timed context")
    predicted_phases: dict[str, float] = Field({}, description="predicted span (µs) of the phases you expect to move")
    edits: list[Edit] = Field([], description="search/replace edits; each search text must occur exactly once")
    source: str | None = Field(None, description="a complete new source instead of edits")
    knobs: dict[str, int] = Field({}, description="knob values to set (merged onto the parent's)")


class FinishInput(BaseModel):
    """End the session's planning: nothing left worth the budget."""

    reason: str


TOOLS: dict[str, type[BaseModel]] = {
    "outline": OutlineInput, "read": ReadInput, "profile": ProfileInput, "diagnose": DiagnoseInput,
    "compare": CompareInput, "model": ModelInput, "note": NoteInput, "propose": ProposeInput, "finish": FinishInput,
}


class ToolOutput(BaseModel):
    """What a tool returns to the planner: the text it shows, a one-line summary (what stays in the
    conversation once the text is compacted away), and whether it worked."""

    text: str
    summary: str
    ok: bool = True


def _inline_refs(schema: dict) -> dict:
    """A JSON schema with every `$ref` to `$defs` replaced by the definition (self-contained tool schemas)."""
    defs = schema.pop("$defs", {})

    def walk(node):
        if isinstance(node, dict):
            if "$ref" in node:
                return walk(copy.deepcopy(defs[node["$ref"].rsplit("/", 1)[-1]]))
            return {k: walk(v) for k, v in node.items() if k != "title"}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    return walk(schema)


def tool_schemas() -> list[dict]:
    """The Messages API `tools` list, from the input models (docstrings become descriptions)."""
    out = []
    for name, model in TOOLS.items():
        schema = _inline_refs(model.model_json_schema())
        schema.pop("description", None)   # the tool's description says it once
        out.append({"name": name, "description": " ".join((model.__doc__ or name).split()), "input_schema": schema})
    return out
