"""The session's side of a planner's tools: each call is validated, run, recorded in the trace (a ToolCall
event, plus the evaluations it made) and charged to the session's budget by the wall clock it takes."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from pydantic import ValidationError

from megakernel_agent.sandbox.candidate import Candidate
from megakernel_agent.tasks.base import ModelledStep, ScheduleModelError
from megakernel_agent.traces.results import STAMP_COST, EvalResult, PhaseTimeline
from megakernel_agent.traces.schema import Evaluate, Note, ToolCall

from . import source_view
from .compare import Version as CompareVersion
from .compare import interleave, speedups
from .diagnosis import diagnose
from .tools import (
    TOOLS,
    CompareInput,
    DiagnoseInput,
    ModelInput,
    NoteInput,
    OutlineInput,
    ProfileInput,
    ReadInput,
    ToolOutput,
)

if TYPE_CHECKING:
    from .session import Session

MAX_SHOWN = 24_000   # characters of a tool's text kept in the trace


class ToolError(ValueError):
    """A tool call the session cannot carry out (unknown version, bad range); the message goes back as is."""


class SessionTools:
    def __init__(self, session: Session):
        self.s = session
        self.calls = 0
        self.context_notes = 0
        self.device_s = 0.0
        self.modelled: dict[tuple[str, int, int], ModelledStep | None] = {}   # (version, ctx, steps) -> its model

    def restore(self, events: list) -> None:
        """Number on from a resumed trace's tool calls and context notes, so no id is handed out twice."""
        self.calls = max((int(e.id[1:]) for e in events if e.type == "tool_call" and e.id[1:].isdigit()), default=0)
        self.context_notes = sum(1 for e in events if e.type == "note" and e.kind == "context")

    # ---- the entry point planners use ---------------------------------------------------------

    def call(self, tool: str, raw: dict, planner: str) -> ToolOutput:
        """Run `tool` with its raw input; every outcome, including a refused input, is a ToolOutput."""
        self.calls += 1
        tid = f"t{self.calls}"
        started_device = self.device_s
        versions: list[str] = []
        try:
            model = TOOLS[tool].model_validate(raw)
            out = getattr(self, f"_{tool}")(model, tid, versions)
        except (KeyError, ValidationError, ToolError, ValueError) as e:
            out = ToolOutput(text=f"{tool} failed: {e}", summary=f"{tool} failed: {str(e)[:160]}", ok=False)
        self.s.record(ToolCall(id=tid, planner=planner, tool=tool, input=raw, ok=out.ok, summary=out.summary,
                               output=out.text[:MAX_SHOWN], device_s=self.device_s - started_device,
                               versions=versions))
        return out

    def version(self, ref: str) -> tuple[str, str, dict[str, int]]:
        """(id, source, explicit knob values) of a version named by id, planner-given name or 'best'."""
        vid = self.resolve(ref)
        return vid, self.s.archive.source(vid), self.s.archive.explicit_knobs(vid)

    def outcome(self, vid: str) -> str:
        """What became of version `vid`, as a planner should read it: the decision, and for a failure the full
        diagnosis (compiler log, or every compared tensor), so the planner can repair that very version."""
        v = self.s.archive.get(vid)
        us = ", ".join(f"ctx {c}: {u:.1f} µs" for c, u in sorted(v.us_per_ctx.items()))
        lines = [f"{vid}: {v.outcome}" + (f" ({us})" if us else "") + f". {v.message}",
                 f"best is now {self.s.best.id}: " + ", ".join(
                     f"ctx {c}: {u:.1f} µs" for c, u in sorted(self.s.best.result.median_by_ctx().items()))]
        if not v.correct and v.outcome not in ("duplicate",) and vid in self.s.results:
            lines.append(diagnose(vid, self.s.results[vid])[0])
            lines.append(f"To repair it, propose with parent='{vid}'.")
        lines.append(f"budget left: {self.s.budget.remaining():.0f} s")
        return "\n".join(lines)

    def entry(self, vid: str):
        """The archive's record of `vid` (outcome, timings, resources, phase timelines)."""
        return self.s.archive.get(vid)

    def repair_depth(self, vid: str) -> int:
        return self.s.archive.repair_depth(vid)

    def name_taken(self, name: str) -> bool:
        return self.s.archive.name_taken(name)

    def context_note(self, text: str) -> None:
        """Record what the planner's context management did (old tool results summarised)."""
        self.context_notes += 1
        self.s.record(Note(id=f"c{self.context_notes}", author=self.s.planner.name, kind="context", text=text))

    def predict(self, ref: str, knobs: dict[str, int], what_if: str | None = None
                ) -> tuple[str, PhaseTimeline, ModelledStep, ModelledStep] | None:
        """(version id, the stamps used, model of the version, model with `knobs` merged on or the what-if) from
        the task's schedule model, on the version's largest profiled context; None when the task cannot model
        the version's source or it has no phase timeline yet."""
        vid = self.resolve(ref)
        stamped = max(self.s.archive.get(vid).phases, key=lambda t: t.ctx, default=None)
        if stamped is None:
            return None
        source, own = self.s.archive.source(vid), self.s.archive.explicit_knobs(vid)
        key = (vid, stamped.ctx, stamped.steps)
        try:
            if key not in self.modelled:
                self.modelled[key] = self.s.task.model_step(source, own, stamped)
            base = self.modelled[key]
            if base is None:
                return None
            new = self.s.task.model_step(source, {**own, **knobs}, stamped, what_if, stamped_knobs=own)
            if new is None:
                return None
        except ScheduleModelError as e:
            raise ToolError(str(e)) from e
        return vid, stamped, base, new

    # ---- helpers ------------------------------------------------------------------------------

    def resolve(self, ref: str) -> str:
        if ref == "best":
            return self.s.best.id
        try:
            return self.s.archive.resolve(ref)
        except KeyError as e:
            raise ToolError(e.args[0]) from e

    def _on_gpu(self, fn):
        t0 = time.monotonic()
        try:
            return fn()
        finally:
            self.device_s += time.monotonic() - t0

    def _candidate(self, vid: str) -> Candidate:
        return Candidate(source=self.s.archive.source(vid), knobs=self.s.archive.explicit_knobs(vid))

    def _correct(self, ref: str) -> str:
        vid = self.resolve(ref)
        if not self.s.archive.get(vid).correct:
            raise ToolError(f"{vid} is not a correct version ({self.s.archive.get(vid).outcome}); diagnose it instead")
        return vid

    # ---- the tools ----------------------------------------------------------------------------

    def _outline(self, inp: OutlineInput, tid: str, versions: list[str]) -> ToolOutput:
        vid = self.resolve(inp.version)
        text = source_view.outline(self.s.archive.source(vid))
        return ToolOutput(text=f"outline of {vid}:\n{text}", summary=f"outline of {vid} ({text.splitlines()[0]})")

    def _read(self, inp: ReadInput, tid: str, versions: list[str]) -> ToolOutput:
        vid = self.resolve(inp.version)
        text = source_view.read(self.s.archive.source(vid), inp.start, inp.end, inp.symbol)
        what = inp.symbol or f"lines {inp.start or 1}-{inp.end or ''}"
        return ToolOutput(text=f"{vid}, {what}:\n{text}", summary=f"read {what} of {vid}")

    def _profile(self, inp: ProfileInput, tid: str, versions: list[str]) -> ToolOutput:
        vid = self._correct(inp.version)
        contexts = inp.contexts or [max(self.s.task.spec.context_lengths)]
        label = f"{vid}~profile-{tid}"
        res: EvalResult = self._on_gpu(lambda: self.s.evaluate(
            label, self._candidate(vid), check=False, time=False, baseline=False, profile=contexts))
        self.s.record(Evaluate(id=label, result=res))
        versions.append(label)
        if not res.ok:
            f = res.failure
            return ToolOutput(text=f"profile of {vid} failed: {f.cls.value} in {f.phase}: {f.message}",
                              summary=f"profile of {vid} failed: {f.message[:120]}", ok=False)
        self.s.archive.add_phases(vid, res.phases)
        text = "\n\n".join(timeline_text(t) for t in res.phases)
        worst = max((r for t in res.phases for r in t.rows), key=lambda r: r.span_us, default=None)
        summary = f"profile of {vid} at {contexts}" + (f": longest phase {worst.name} {worst.span_us:.1f} µs"
                                                       if worst else "")
        return ToolOutput(text=f"phase timeline of {vid}:\n{text}", summary=summary)

    def _diagnose(self, inp: DiagnoseInput, tid: str, versions: list[str]) -> ToolOutput:
        vid = self.resolve(inp.version)
        res = self.s.results.get(vid)
        if res is None:
            raise ToolError(f"{vid} has no recorded evaluation")
        text, summary = diagnose(vid, res)
        return ToolOutput(text=text, summary=summary)

    def _compare(self, inp: CompareInput, tid: str, versions: list[str]) -> ToolOutput:
        a, b = self._correct(inp.a), self._correct(inp.b)
        pair = [CompareVersion(a, self._candidate(a), ok=True), CompareVersion(b, self._candidate(b), ok=True)]
        rounds = {a: 0, b: 0}

        def record(v: CompareVersion, res: EvalResult) -> None:
            rounds[v.label] += 1
            self.s.count_phases(res)
            label = f"{v.label}~compare-{tid}-{rounds[v.label]}"
            self.s.record(Evaluate(id=label, result=res.model_copy(update={"build": None})))
            versions.append(label)

        contexts = inp.contexts or None
        with self.s.lanes.borrow() as lane:   # both versions on one GPU, and the lane for this call alone
            self._on_gpu(lambda: interleave(lane.ev, pair, inp.rounds, 3, contexts, on_result=record,
                                            deadline=self.s.budget.deadline()))
        rows = speedups(pair)
        lines = [f"interleaved A={a} B={b}, {inp.rounds} rounds; speedup of B over A (95% bootstrap "
                 "interval, module loads then samples resampled):"]
        a_us = {r["ctx"]: r["median_us"] for r in rows if r["label"] == a}
        for r in rows:
            if "ratio" in r:
                lines.append(f"ctx {r['ctx']}: A {a_us.get(r['ctx'], float('nan')):.1f} µs, B {r['median_us']:.1f} µs"
                             f" -> {r['ratio']:.3f}x [{r['low']:.3f}, {r['high']:.3f}] {r['verdict']}")
        failed = [v for v in pair if not v.ok]
        lines += [f"{v.label}: {v.check}" for v in failed]
        verdicts = ", ".join(f"{r['ctx']}: {r['ratio']:.3f}x {r['verdict']}" for r in rows if "ratio" in r)
        return ToolOutput(text="\n".join(lines), summary=f"compare {a} vs {b}: {verdicts or 'no timing'}",
                          ok=not failed)

    def _model(self, inp: ModelInput, tid: str, versions: list[str]) -> ToolOutput:
        if not self.s.task.what_ifs():
            raise ToolError(f"task {self.s.task.spec.name} has no schedule model")
        if not inp.knobs and inp.what_if is None:
            raise ToolError("give knobs to model, or a what-if: " + "; ".join(
                f"{k}: {v}" for k, v in self.s.task.what_ifs().items()))
        got = self.predict(inp.version, inp.knobs, inp.what_if)
        if got is None:
            vid = self.resolve(inp.version)
            if not self.s.archive.get(vid).phases:
                raise ToolError(f"{vid} has no phase timeline: profile it first (the model takes the phases it "
                                "does not simulate from the version's stamps)")
            raise ToolError(f"the schedule model mirrors the seed's own source and takes the launch shape and the "
                            f"attention's split from the stamps: {vid}'s source is "
                            "not the seed's, or the move changes one of those knobs (profile a version with the "
                            "launch shape or split and model moves from it)")
        vid, stamped, base, new = got
        change = inp.what_if or ", ".join(f"{k}={v}" for k, v in sorted(inp.knobs.items()))
        lines = [f"schedule model of {vid} ({change}), phases not simulated from {vid}'s stamps at ctx "
                 f"{stamped.ctx}; kernel µs of the stamped build (bench runs ~7% below it):",
                 f"kernel {base.kernel_us:.1f} -> {new.kernel_us:.1f} µs ({new.kernel_us - base.kernel_us:+.1f})",
                 f"{'phase':22s} {'model':>7s} {'new':>7s} {'stamped':>8s}"]
        stamps = {r.name: r.span_us for r in stamped.rows}
        for name, span in base.spans_us.items():
            moved = new.spans_us[name] - span
            lines.append(f"{name:22s} {span:7.2f} {new.spans_us[name]:7.2f} {stamps.get(name, float('nan')):8.2f}"
                         + (f"  {moved:+.2f}" if abs(moved) >= 0.05 else ""))
        return ToolOutput(text="\n".join(lines),
                          summary=f"model of {vid} ({change}): {new.kernel_us - base.kernel_us:+.1f} µs per step")

    def _note(self, inp: NoteInput, tid: str, versions: list[str]) -> ToolOutput:
        self.s.record(Note(id=f"n{tid[1:]}", author=self.s.planner.name, kind=inp.kind, text=inp.text,
                           refs=inp.refs))
        return ToolOutput(text="noted", summary=f"note ({inp.kind}): {inp.text[:120]}")


def timeline_text(t) -> str:
    """A phase timeline as a fixed-width table (what the profile tool shows), with what a stamped build can and
    cannot tell."""
    lines = [f"ctx {t.ctx}: kernel {t.kernel_us:.1f} µs over {t.steps} {t.steps_kind} steps ({t.blocks} blocks)",
             f"a stamped build: {STAMP_COST}, so two profiles that differ by less than ~3 µs prove nothing; the "
             "timed compare decides",
             f"{'phase':22s} {'span µs':>8s} {'mean µs':>8s} {'wait µs':>8s} {'MB':>7s} {'TB/s':>6s}"]
    for r in t.rows:
        lines.append(f"{r.name:22s} {r.span_us:8.1f} {r.mean_us:8.1f} {r.wait_us:8.1f} {r.bytes / 1e6:7.2f} "
                     f"{r.tbs:6.2f}")
    return "\n".join(lines)
