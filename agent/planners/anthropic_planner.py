"""LLM planner: one conversation per session with Claude (Messages API, tool use, prompt caching), inside
the session's budget.

The model studies versions with tools the session runs (outline, read, profile, diagnose, compare, model,
note), submits versions with `propose` (edits on a named parent, a hypothesis, predicted µs), and stops with
`finish`. A proposal's outcome comes back as that call's result, with the full compiler log or diagnosis
when it failed, so the model can repair that very version (a bounded number of times in a row). The
prefix (tools, rules, task brief, the starting source's outline) is cached; the rolling history after it
carries a moving cache breakpoint. Old tool results are replaced by their one-line summaries when the
conversation outgrows its token budget (recorded as a notebook entry). Every stop_reason is handled; each
API call's timeout and retries end at the session deadline; before every call the cost cap must hold even
if the call costs its worst case. The API key is read by the SDK from the environment, never stored here.
"""

from __future__ import annotations

import json
import logging
import os
import time

import anthropic
from pydantic import ValidationError
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt, wait_exponential_jitter

from megakernel_agent.sandbox.candidate import Candidate, CandidateError, parse_knobs, validate
from megakernel_agent.traces.schema import LlmUsage

from ..archive import IN_FLIGHT
from ..edits import EditError, apply_edits
from ..tools import ProposeInput, tool_schemas
from .base import PlannedVersion, Planner, PlannerExhausted, PlannerFailure, PlannerView
from .prices import Price, price_for
from .prompts import opening, system_blocks

log = logging.getLogger(__name__)

DEFAULT_MODEL = "claude-sonnet-4-5"
CALL_TIMEOUT_S = 600.0
MIN_CALL_S = 5.0             # no call is started with less than this left before the deadline
CHARS_PER_TOKEN = 3.0        # conservative: over-estimates a prompt's tokens for the worst-case cost


def _transient(exc: BaseException) -> bool:
    if isinstance(exc, (anthropic.APIConnectionError, anthropic.APITimeoutError, anthropic.RateLimitError,
                        anthropic.InternalServerError)):
        return True
    return isinstance(exc, anthropic.APIStatusError) and (exc.status_code in (408, 409, 429, 529)
                                                           or exc.status_code >= 500)


class AnthropicPlanner(Planner):
    name = "anthropic"

    def __init__(self, model: str | None = None, max_cost_usd: float = 5.0, price: Price | None = None,
                 base_url: str | None = None, api_key: str | None = None, max_tokens: int = 16000, api_retries: int = 6,
                 retry_wait_initial: float = 1.0, retry_wait_max: float = 30.0, max_nudges: int = 3,
                 max_calls_per_proposal: int = 40, max_repairs: int = 3, context_tokens: int = 150_000,
                 keep_recent_messages: int = 8):
        self.model = model or os.environ.get("ANTHROPIC_MODEL", DEFAULT_MODEL)
        self.price = price_for(self.model, price)
        self.max_cost_usd, self.max_tokens = max_cost_usd, max_tokens
        self.api_retries, self.retry_wait = api_retries, (retry_wait_initial, retry_wait_max)
        self.max_nudges, self.max_calls, self.max_repairs = max_nudges, max_calls_per_proposal, max_repairs
        self.context_tokens, self.keep_recent = context_tokens, keep_recent_messages
        self.client = anthropic.Anthropic(base_url=base_url, api_key=api_key, max_retries=0)
        self.total = LlmUsage(model=self.model, calls=0)
        self.system: list[dict] = []
        self.messages: list[dict] = []
        self.summaries: dict[str, str] = {}      # tool_use id -> one line, what stays after compaction
        self.deferred: list[dict] = []           # results of the reply that carried the last proposal
        self.pending: str | None = None          # tool_use id of that proposal
        self.pending_version: str | None = None  # the id the session gave it
        self.awaiting: list[str] = []            # its versions still in flight when their result was sent
        self._retries = 0

    def settings(self) -> dict:
        return {"model": self.model, "max_cost_usd": self.max_cost_usd, "max_tokens": self.max_tokens,
                "prices_usd_per_mtok": self.price.model_dump(), "max_repairs": self.max_repairs,
                "context_tokens": self.context_tokens, "tools": [t["name"] for t in tool_schemas()]}

    def accepted(self, version_id: str) -> None:
        self.pending_version = version_id

    def restore(self, spent_usd: float) -> None:
        self.total.cost_usd = spent_usd

    # ---- one proposal ---------------------------------------------------------------------------

    def propose(self, view: PlannerView) -> PlannedVersion:
        deadline = time.monotonic() + view.budget_left_s
        turn = LlmUsage(model=self.model, calls=0)
        if not self.messages:
            self.system = system_blocks(view, view.best_source)
            self._say([{"type": "text", "text": opening(view)}])
        elif self.pending is not None:
            outcome = self.tools.outcome(self.pending_version) if self.pending_version else "not evaluated"
            if outcome.startswith(f"{self.pending_version}: {IN_FLIGHT}"):   # the text the model gets says so
                self.awaiting.append(self.pending_version)
                outcome += "\nIt is being evaluated while you plan; its outcome comes in a later message."
            self.summaries[self.pending] = outcome.splitlines()[0][:200]
            self._say(self.deferred + [_result(self.pending, outcome)] + self._decided_meanwhile())
            self.pending = self.pending_version = None
            self.deferred = []
        elif self.messages[-1]["role"] == "assistant":   # the last turn ended without a proposal
            dangling = [b["id"] for b in self.messages[-1]["content"] if b.get("type") == "tool_use"]
            self._say([_result(i, "not run: the turn ended", error=True) for i in dangling]
                      + [{"type": "text", "text": f"Budget left: {view.budget_left_s:.0f} s. Continue."}]
                      + self._decided_meanwhile())
        nudges = 0
        for _ in range(self.max_calls):
            resp = self._call(deadline, turn)
            self.messages.append({"role": "assistant", "content": [_block(b) for b in resp.content]})
            stop = resp.stop_reason
            if stop == "pause_turn":
                continue
            if stop == "refusal":
                raise PlannerFailure(f"the model refused: {_text(resp)[:300]}", turn, retryable=False)
            if stop == "model_context_window_exceeded":
                self.messages.pop()
                if not self._compact(keep_recent=1):   # the same request again would overflow again
                    raise PlannerFailure("the context window is full and no older tool result is left to "
                                         "shorten", turn, retryable=False)
                continue
            uses = [b for b in resp.content if b.type == "tool_use"]
            if stop == "max_tokens":
                self._report("the reply was cut at max_tokens")
                self._say([_result(b.id, "cut off at max_tokens; not run", error=True) for b in uses]
                          + [{"type": "text", "text": f"Your reply hit the {self.max_tokens}-token limit and was cut. "
                                                      "Send smaller edits (quote only the lines you change)."}])
                continue
            if not uses:
                nudges += 1
                if nudges > self.max_nudges:
                    raise PlannerFailure(f"no tool call after {nudges} replies (stop_reason {stop})", turn)
                self._report(f"no tool call in the reply (stop_reason {stop})")
                self._say([{"type": "text", "text": "Call a tool: study with outline/read/profile/diagnose/compare/"
                                                    "model, write with note, submit with propose, or finish."}])
                continue
            planned = self._run_tools(uses, turn)
            if planned is not None:
                planned.llm = turn
                return planned
        raise PlannerFailure(f"no proposal after {self.max_calls} model calls", turn)

    def _decided_meanwhile(self) -> list[dict]:
        """The outcomes of this planner's versions that were in flight when it last heard of them and are decided
        now (with several in flight, the session proposes again before an evaluation ends)."""
        done = [vid for vid in self.awaiting if self.tools.entry(vid).outcome != IN_FLIGHT]
        self.awaiting = [vid for vid in self.awaiting if vid not in done]
        return [{"type": "text", "text": f"Decided since: {self.tools.outcome(vid)}"} for vid in done]

    def _run_tools(self, uses, turn: LlmUsage) -> PlannedVersion | None:
        """Run every tool call of one reply; a valid proposal is returned (its result waits for the outcome)."""
        results, planned = [], None
        for b in uses:
            if b.name == "finish":
                raise PlannerExhausted(f"the model finished: {(b.input or {}).get('reason', '')}"[:500], turn)
            if b.name == "propose":
                if planned is not None:
                    results.append(_result(b.id, "one proposal per reply: this one was not evaluated", error=True))
                    continue
                try:
                    planned = self._planned(b.input)
                    self.pending = b.id
                except (ValidationError, EditError, CandidateError, ValueError, KeyError) as e:
                    self._report(f"proposal refused: {e}")
                    results.append(_result(b.id, f"proposal refused (not evaluated): {e}", error=True))
                continue
            out = self.tools.call(b.name, b.input or {}, self.name)
            self.summaries[b.id] = out.summary
            results.append(_result(b.id, out.text, error=not out.ok))
        if planned is not None:
            self.deferred = results
            return planned
        self._say(results)
        return None

    def _planned(self, raw) -> PlannedVersion:
        tool = ProposeInput.model_validate(json.loads(raw) if isinstance(raw, str) else raw)
        if tool.source and tool.edits:
            raise ValueError("give either edits or a full source, not both")
        parent_id, parent_source, parent_knobs = self.tools.version(tool.parent)
        depth = self.tools.repair_depth(parent_id)
        if depth >= self.max_repairs:
            raise ValueError(f"{parent_id} ends {depth} failed versions in a row (limit {self.max_repairs}); "
                             "build on a correct version")
        if tool.name and self.tools.name_taken(tool.name):
            raise ValueError(f"the name {tool.name!r} is taken; pick another")
        source = tool.source or apply_edits(parent_source, tool.edits)
        declared = {k.name for k in parse_knobs(source)}
        knobs = {k: v for k, v in parent_knobs.items() if k in declared} | tool.knobs
        validate(Candidate(source=source, knobs=knobs))
        predicted = ", ".join(f"ctx {c}: {u:.1f} µs" for c, u in sorted(tool.predicted_us.items()))
        return PlannedVersion(source=source, knobs=knobs, hypothesis=tool.hypothesis, predicted_change=predicted,
                              parent_id=parent_id, name=tool.name, predicted_us=tool.predicted_us,
                              predicted_phases=tool.predicted_phases)

    # ---- the API call ---------------------------------------------------------------------------

    def _call(self, deadline: float, turn: LlmUsage):
        """One Messages API call: cost cap (worst case) and deadline checked first; transient errors retried
        with backoff until the attempts or the deadline run out; any other failure is a PlannerFailure."""
        prompt_tokens = self._prompt_tokens()
        worst = self.price.worst_case(prompt_tokens, self.max_tokens)
        if self.total.cost_usd + worst > self.max_cost_usd:
            raise PlannerExhausted(f"cost cap: ${self.total.cost_usd:.2f} spent, the next call could cost up to "
                                   f"${worst:.2f}, the cap is ${self.max_cost_usd:.2f}", turn)
        if deadline - time.monotonic() < MIN_CALL_S:
            raise PlannerExhausted("the session's budget is spent", turn)
        self._retries = 0
        self._mark_cache_breakpoint()
        retrying = Retrying(
            retry=retry_if_exception(_transient), reraise=True, before_sleep=self._before_sleep,
            wait=wait_exponential_jitter(multiplier=self.retry_wait[0], max=self.retry_wait[1],
                                         jitter=self.retry_wait[0]),
            stop=stop_after_attempt(self.api_retries) | _stop_at(deadline))
        try:
            resp = retrying(lambda: self.client.messages.create(
                model=self.model, max_tokens=self.max_tokens, system=self.system, tools=tool_schemas(),
                tool_choice={"type": "auto"}, messages=self.messages,
                timeout=max(1.0, min(CALL_TIMEOUT_S, deadline - time.monotonic()))))
        except anthropic.APIError as e:
            turn.retries += self._retries
            raise PlannerFailure(f"Anthropic API error: {type(e).__name__}: {str(e)[:300]}", turn,
                                 retryable=_transient(e)) from e
        except Exception as e:  # noqa: BLE001 - a 200 with a non-JSON body, a truncated reply, a broken proxy
            turn.retries += self._retries
            raise PlannerFailure(f"unusable API response: {type(e).__name__}: {str(e)[:300]}", turn) from e
        turn.retries += self._retries
        self._add(turn, resp.usage)
        if self._used_tokens(resp.usage) > self.context_tokens:
            self._compact()
        return resp

    def _before_sleep(self, state: RetryCallState) -> None:
        self._retries += 1
        exc = state.outcome.exception() if state.outcome else None
        log.warning("Anthropic API transient error (%s); retry %d", type(exc).__name__, state.attempt_number)

    def _prompt_tokens(self) -> int:
        text = json.dumps(self.system) + json.dumps(tool_schemas()) + json.dumps(self.messages)
        return int(len(text) / CHARS_PER_TOKEN)

    @staticmethod
    def _used_tokens(u) -> int:
        return u.input_tokens + (u.cache_read_input_tokens or 0) + (u.cache_creation_input_tokens or 0)

    def _add(self, turn: LlmUsage, u) -> None:
        cost = self.price.cost(u.input_tokens, u.output_tokens, u.cache_creation_input_tokens or 0,
                               u.cache_read_input_tokens or 0)
        for total in (turn, self.total):
            total.calls += 1
            total.input_tokens += u.input_tokens
            total.output_tokens += u.output_tokens
            total.cache_write_tokens += u.cache_creation_input_tokens or 0
            total.cache_read_tokens += u.cache_read_input_tokens or 0
            total.cost_usd += cost

    # ---- the conversation -----------------------------------------------------------------------

    def _say(self, content: list[dict]) -> None:
        self.messages.append({"role": "user", "content": content})

    def _report(self, message: str) -> None:
        """A failed exchange within a turn; its tokens are accounted with the turn's proposal or failure."""
        if self.on_error is not None:
            self.on_error(message, None)

    def _mark_cache_breakpoint(self) -> None:
        """The last block of the last user message carries the moving breakpoint (the system prefix has its
        own); earlier ones are removed, so at most two are ever set."""
        for m in self.messages:
            for block in m["content"]:
                block.pop("cache_control", None)
        last = next((m for m in reversed(self.messages) if m["role"] == "user"), None)
        if last is not None and last["content"]:
            last["content"][-1]["cache_control"] = {"type": "ephemeral"}

    def _compact(self, keep_recent: int | None = None) -> int:
        """Replace the text of tool results older than the recent messages (`keep_recent`, else the planner's
        setting) with their one-line summaries; how many were replaced."""
        keep = self.keep_recent if keep_recent is None else keep_recent
        replaced = 0
        for m in self.messages[: max(0, len(self.messages) - keep)]:
            for block in m["content"]:
                if block.get("type") == "tool_result" and not str(block.get("content", "")).startswith("[summary]"):
                    block["content"] = f"[summary] {self.summaries.get(block['tool_use_id'], 'earlier result')}"
                    replaced += 1
        if replaced:
            self.tools.context_note(f"context over its budget of {self.context_tokens} tokens: {replaced} older "
                                    "tool results replaced by their one-line summaries")
        return replaced


def _stop_at(deadline: float):
    """Stop retrying once the next wait would end past the deadline."""
    def stop(state: RetryCallState) -> bool:
        wait = state.upcoming_sleep or 0.0
        return time.monotonic() + wait + MIN_CALL_S >= deadline
    return stop


def _result(tool_use_id: str, text: str, error: bool = False) -> dict:
    block = {"type": "tool_result", "tool_use_id": tool_use_id, "content": text}
    if error:
        block["is_error"] = True
    return block


def _block(b) -> dict:
    return b.model_dump(exclude_none=True)


def _text(resp) -> str:
    return " ".join(b.text for b in resp.content if b.type == "text")
