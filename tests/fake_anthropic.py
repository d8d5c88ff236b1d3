"""A scripted Messages API for tests: each POST /v1/messages takes the next (status, body) from a queue.

Built on the product's local server (agent.scripted_model.MessagesServer) so the real SDK is exercised;
bodies may be raw bytes (a 200 with HTML, truncated JSON). Requests and headers are kept for assertions.
"""

from __future__ import annotations

import itertools

from megakernel_agent.agent.scripted_model import MessagesServer

_ids = itertools.count(1000)


def message(content: list[dict], usage: dict | None = None, stop: str = "tool_use") -> tuple[int, dict]:
    return 200, {"id": "msg_test", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
                 "content": content, "stop_reason": stop, "stop_sequence": None,
                 "usage": {"input_tokens": 1200, "output_tokens": 300, "cache_creation_input_tokens": 0,
                           "cache_read_input_tokens": 0, **(usage or {})}}


def tool_use(inp: dict, usage: dict | None = None, tid: str = "toolu_1", name: str = "propose",
             stop: str = "tool_use") -> tuple[int, dict]:
    return message([{"type": "text", "text": "Here is my call."},
                    {"type": "tool_use", "id": tid, "name": name, "input": inp}], usage, stop)


def calls(*uses: tuple[str, dict], usage: dict | None = None) -> tuple[int, dict]:
    """One reply with several tool calls: (name, input) pairs; ids unique across replies, as the API's are."""
    return message([{"type": "tool_use", "id": f"toolu_{next(_ids)}", "name": n, "input": inp} for n, inp in uses],
                   usage)


def error(status: int, kind: str) -> tuple[int, dict]:
    return status, {"type": "error", "error": {"type": kind, "message": f"scripted {kind}"}}


class FakeAnthropic:
    def __init__(self, script: list[tuple[int, dict | bytes]]):
        self.script = list(script)
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self.server = MessagesServer(self._respond)
        self.url = self.server.url

    def _respond(self, body: dict, headers: dict):
        self.requests.append(body)
        self.headers.append(headers)
        return self.script.pop(0) if self.script else error(500, "api_error")

    def __enter__(self) -> FakeAnthropic:
        self.server.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.server.__exit__(*exc)
