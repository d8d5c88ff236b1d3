"""LLM planner through the official Anthropic SDK (Messages API, tool use, prompt caching).

Each turn sends the current best source, its knobs and the recent outcomes; the model answers by
calling `propose_kernel`. A missing tool call, invalid input or an edit that does not apply goes
back to the model with the exact error (bounded), and each such miss is reported as a failed
proposal. Transient API errors (429, 529, 5xx, connection) are retried with exponential backoff and
jitter. Tokens and an estimated cost are summed per proposal; a cost cap ends planning. The API key
is read from the environment by the SDK and never stored here.
"""

from __future__ import annotations

import json
import logging
import os

import anthropic
from pydantic import BaseModel, ValidationError
from tenacity import RetryCallState, retry, retry_if_exception, stop_after_attempt, wait_exponential_jitter

from sandbox.candidate import Candidate, CandidateError, validate
from traces.schema import LlmUsage

from ..edits import Edit, EditError, apply_edits
from .base import PlannedVersion, Planner, PlannerExhausted, PlannerFailure, PlannerView
from .prompts import system_prompt, turn_prompt

log = logging.getLogger(__name__)

DEFAULT_MODEL = "claude-sonnet-4-5"
# USD per million tokens: input, output, cache write, cache read. Unknown models use the first row's
# family by name, else Sonnet's prices (the cost is then an estimate and says so in settings()).
PRICES = {
    "opus": (15.0, 75.0, 18.75, 1.50),
    "sonnet": (3.0, 15.0, 3.75, 0.30),
    "haiku": (1.0, 5.0, 1.25, 0.10),
}
TOOL = {
    "name": "propose_kernel",
    "description": "Submit the next kernel version to build, check and time.",
    "input_schema": {
        "type": "object",
        "properties": {
            "hypothesis": {"type": "string", "description": "what you change and why it should be faster"},
            "predicted_change": {"type": "string", "description": "expected effect, e.g. '-8% µs/token at 16K'"},
            "edits": {
                "type": "array",
                "description": "anchored search/replace edits on the current best source (each search unique)",
                "items": {
                    "type": "object",
                    "properties": {"search": {"type": "string"}, "replace": {"type": "string"}},
                    "required": ["search", "replace"],
                },
            },
            "source": {"type": "string", "description": "a complete new source instead of edits"},
            "knobs": {"type": "object", "additionalProperties": {"type": "integer"},
                      "description": "knob values (declared knobs only)"},
        },
        "required": ["hypothesis", "predicted_change"],
    },
}


class ToolInput(BaseModel):
    hypothesis: str
    predicted_change: str
    edits: list[Edit] | None = None
    source: str | None = None
    knobs: dict[str, int] | None = None


def _transient(exc: BaseException) -> bool:
    if isinstance(exc, (anthropic.APIConnectionError, anthropic.APITimeoutError, anthropic.RateLimitError,
                        anthropic.InternalServerError)):
        return True
    return isinstance(exc, anthropic.APIStatusError) and (exc.status_code in (408, 409, 429, 529)
                                                           or exc.status_code >= 500)


class AnthropicPlanner(Planner):
    name = "anthropic"

    def __init__(self, model: str | None = None, max_cost_usd: float = 5.0, max_turn_retries: int = 3,
                 base_url: str | None = None, max_tokens: int = 16000, api_retries: int = 6,
                 retry_wait_initial: float = 1.0, retry_wait_max: float = 30.0, history_size: int = 12):
        self.model = model or os.environ.get("ANTHROPIC_MODEL", DEFAULT_MODEL)
        self.max_cost_usd, self.max_turn_retries = max_cost_usd, max_turn_retries
        self.max_tokens, self.history_size = max_tokens, history_size
        self.client = anthropic.Anthropic(base_url=base_url, max_retries=0)
        self.total = LlmUsage(model=self.model, calls=0)
        self._retries_this_turn = 0
        family = next((f for f in PRICES if f in self.model), None)
        self._prices, self._price_note = PRICES[family or "sonnet"], "" if family else "estimated (unknown model)"
        self._create = retry(
            retry=retry_if_exception(_transient),
            wait=wait_exponential_jitter(multiplier=retry_wait_initial, max=retry_wait_max, jitter=retry_wait_initial),
            stop=stop_after_attempt(api_retries),
            before_sleep=self._before_sleep,
            reraise=True,
        )(self.client.messages.create)

    def settings(self) -> dict:
        return {"model": self.model, "max_cost_usd": self.max_cost_usd, "max_turn_retries": self.max_turn_retries,
                "max_tokens": self.max_tokens, "prices_usd_per_mtok": self._prices, "price_note": self._price_note}

    def _before_sleep(self, state: RetryCallState) -> None:
        self._retries_this_turn += 1
        exc = state.outcome.exception() if state.outcome else None
        log.warning("Anthropic API transient error (%s); retry %d", type(exc).__name__, state.attempt_number)

    def _cost(self, u) -> float:
        p_in, p_out, p_cw, p_cr = self._prices
        return (u.input_tokens * p_in + u.output_tokens * p_out + (u.cache_creation_input_tokens or 0) * p_cw
                + (u.cache_read_input_tokens or 0) * p_cr) / 1e6

    def _add(self, turn: LlmUsage, u) -> None:
        for total in (turn, self.total):
            total.calls += 1
            total.input_tokens += u.input_tokens
            total.output_tokens += u.output_tokens
            total.cache_write_tokens += u.cache_creation_input_tokens or 0
            total.cache_read_tokens += u.cache_read_input_tokens or 0
            total.cost_usd += self._cost(u)

    def propose(self, view: PlannerView) -> PlannedVersion:
        if self.total.cost_usd >= self.max_cost_usd:
            raise PlannerExhausted(f"cost cap reached: ${self.total.cost_usd:.2f} of ${self.max_cost_usd:.2f}")
        system = [{"type": "text", "text": system_prompt(view), "cache_control": {"type": "ephemeral"}}]
        messages: list[dict] = [{"role": "user", "content": turn_prompt(view, self.history_size)}]
        turn = LlmUsage(model=self.model, calls=0)
        self._retries_this_turn = 0
        for _ in range(self.max_turn_retries + 1):
            try:
                resp = self._create(model=self.model, max_tokens=self.max_tokens, system=system, tools=[TOOL],
                                    tool_choice={"type": "auto"}, messages=messages)
            except anthropic.APIError as e:
                turn.retries = self._retries_this_turn
                raise PlannerFailure(f"Anthropic API error after retries: {type(e).__name__}: {e}", turn,
                                     retryable=_transient(e)) from e
            self._add(turn, resp.usage)
            turn.retries = self._retries_this_turn
            messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in resp.content]})
            call = next((b for b in resp.content if b.type == "tool_use" and b.name == TOOL["name"]), None)
            if call is None:
                error = "no propose_kernel tool call in the reply; call propose_kernel with your proposal"
                self._report(error)
                messages.append({"role": "user", "content": error})
                continue
            try:
                return self._planned(view, call.input, turn)
            except (ValidationError, EditError, CandidateError, ValueError) as e:
                error = f"proposal rejected: {e}"
                self._report(error)
                messages.append({"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": call.id, "is_error": True, "content": error}]})
        raise PlannerFailure(f"no usable proposal after {self.max_turn_retries + 1} replies", turn)

    def _report(self, message: str) -> None:
        """A failed attempt within a turn; its tokens are accounted with the turn's proposal or failure."""
        if self.on_error is not None:
            self.on_error(message, None)

    def _planned(self, view: PlannerView, raw, usage: LlmUsage) -> PlannedVersion:
        if isinstance(raw, str):
            raw = json.loads(raw)
        tool = ToolInput.model_validate(raw)
        if tool.source and tool.edits:
            raise ValueError("give either edits or a full source, not both")
        source = tool.source or (apply_edits(view.best_source, tool.edits) if tool.edits else view.best_source)
        if tool.knobs is None:  # keep the best's values for knobs the new source still declares
            declared = set(Candidate(source=source).resolved_knobs())
            knobs = {k: v for k, v in view.best_knobs.items() if k in declared}
        else:
            knobs = tool.knobs
        validate(Candidate(source=source, knobs=knobs))
        if source == view.best_source and knobs == view.best_knobs:
            raise ValueError("the proposal is identical to the current best; change the source or the knobs")
        return PlannedVersion(source=source, knobs=knobs, hypothesis=tool.hypothesis,
                              predicted_change=tool.predicted_change, llm=usage)
