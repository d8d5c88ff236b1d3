"""What LLM calls cost: USD per million tokens, by model family, as data.

Rows match a model id by its longest listed prefix (dated ids like claude-haiku-4-5-20251001 match
their family). A model no row matches is refused unless the caller states its price: a silent
fallback once priced an unknown model at another family's rates. Source: Anthropic's pricing page
(platform.claude.com/docs/en/about-claude/pricing), read 2026-12-04; 5-minute cache writes.
"""

from __future__ import annotations

from pydantic import BaseModel


class Price(BaseModel):
    """USD per million tokens. `long_prompt_*` apply to a whole request whose prompt exceeds the threshold."""

    input: float
    output: float
    cache_write: float
    cache_read: float
    long_prompt_tokens: int | None = None
    long_prompt: tuple[float, float, float, float] | None = None

    def cost(self, input_tokens: int, output_tokens: int, cache_write: int, cache_read: int) -> float:
        rates = (self.input, self.output, self.cache_write, self.cache_read)
        prompt = input_tokens + cache_write + cache_read
        if self.long_prompt and self.long_prompt_tokens is not None and prompt > self.long_prompt_tokens:
            rates = self.long_prompt
        p_in, p_out, p_cw, p_cr = rates
        return (input_tokens * p_in + output_tokens * p_out + cache_write * p_cw + cache_read * p_cr) / 1e6

    def worst_case(self, prompt_tokens: int, max_output_tokens: int) -> float:
        """The most one call can cost: every prompt token at the dearest input rate, the whole output budget."""
        rates = [(self.input, self.output, self.cache_write)]
        if self.long_prompt:
            rates.append(self.long_prompt[:3])
        return max((prompt_tokens * max(p_in, p_cw) + max_output_tokens * p_out) / 1e6 for p_in, p_out, p_cw in rates)


def _row(input: float, output: float, cache_read: float) -> Price:
    return Price(input=input, output=output, cache_write=input * 1.25, cache_read=cache_read)


PRICES: dict[str, Price] = {
    "claude-fable-5-1": _row(10.0, 50.0, 0.25),
    "claude-mythos-5-1": _row(10.0, 50.0, 0.25),
    "claude-fable-5": _row(10.0, 50.0, 1.0),
    "claude-mythos-5": _row(10.0, 50.0, 1.0),
    "claude-opus-5-5": _row(4.0, 20.0, 0.20),
    "claude-opus-5": _row(5.0, 25.0, 0.50),
    "claude-opus-4-8": _row(5.0, 25.0, 0.50),
    "claude-opus-4-7": _row(5.0, 25.0, 0.50),
    "claude-opus-4-6": _row(5.0, 25.0, 0.50),
    "claude-opus-4-5": _row(5.0, 25.0, 0.50),
    "claude-opus-4-1": _row(15.0, 75.0, 1.50),
    "claude-opus-4": _row(15.0, 75.0, 1.50),
    "claude-sonnet-5-5": _row(2.0, 10.0, 0.10),
    "claude-sonnet-5": _row(2.0, 10.0, 0.20),
    "claude-sonnet-4": _row(3.0, 15.0, 0.30),
    "claude-3-7-sonnet": _row(3.0, 15.0, 0.30),
    "claude-haiku-5-5": Price(input=0.10, output=0.50, cache_write=0.125, cache_read=0.01, long_prompt_tokens=100_000,
                              long_prompt=(0.50, 2.50, 0.625, 0.05)),
    "claude-haiku-4-5": _row(1.0, 5.0, 0.10),
    "claude-3-5-haiku": _row(0.80, 4.0, 0.08),
    "claude-3-haiku": _row(0.25, 1.25, 0.03),
}


class UnknownModelPrice(ValueError):
    """No price is known for the model; the caller must state one."""


def price_for(model: str, stated: Price | None = None) -> Price:
    """The stated price, else the row with the longest prefix of `model`."""
    if stated is not None:
        return stated
    matches = [prefix for prefix in PRICES if model.startswith(prefix)]
    if not matches:
        raise UnknownModelPrice(f"no price is known for model {model!r}; give one with --price "
                                "INPUT,OUTPUT[,CACHE_WRITE,CACHE_READ] (USD per million tokens)")
    return PRICES[max(matches, key=len)]


def parse_price(text: str) -> Price:
    """'3,15' or '3,15,3.75,0.3' (USD per million tokens) -> Price; cache rates default to 1.25x and 0.1x input."""
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError as e:
        raise ValueError(f"--price expects numbers separated by commas, got {text!r}") from e
    if len(values) == 2:
        values += [values[0] * 1.25, values[0] * 0.1]
    if len(values) != 4 or any(v < 0 for v in values):
        raise ValueError(f"--price expects INPUT,OUTPUT or INPUT,OUTPUT,CACHE_WRITE,CACHE_READ, got {text!r}")
    return Price(input=values[0], output=values[1], cache_write=values[2], cache_read=values[3])
