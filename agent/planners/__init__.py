"""Planners by name. The tuner is the default when no ANTHROPIC_API_KEY is set."""

from __future__ import annotations

import os

from .base import Planner
from .prices import Price


def make_planner(name: str | None, *, seed: int = 0, model: str | None = None, max_cost: float = 5.0,
                 trace: str | None = None, price: Price | None = None, base_url: str | None = None,
                 api_key: str | None = None) -> Planner:
    """`base_url`/`api_key` point the LLM planner elsewhere (e.g. a local scripted model); by default the SDK
    reads ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY itself."""
    name = name or ("anthropic" if os.environ.get("ANTHROPIC_API_KEY") or api_key else "tuner")
    if name == "tuner":
        from .tuner import TunerPlanner

        return TunerPlanner(seed=seed)
    if name == "anthropic":
        if not (api_key or os.environ.get("ANTHROPIC_API_KEY")):
            raise ValueError("the anthropic planner needs ANTHROPIC_API_KEY in the environment")
        from .anthropic_planner import AnthropicPlanner

        return AnthropicPlanner(model=model, max_cost_usd=max_cost, price=price, api_key=api_key,
                                base_url=base_url or os.environ.get("ANTHROPIC_BASE_URL"))
    if name == "replay":
        if not trace:
            raise ValueError("the replay planner needs --replay-trace TRACE")
        from .replay import ReplayPlanner

        return ReplayPlanner(trace)
    raise ValueError(f"unknown planner {name!r}; choose tuner, anthropic or replay")
