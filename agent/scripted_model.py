"""A local Messages API server that plays a recorded model: each request gets the script's next reply.

The script is data (JSONL): an optional header line {"model": ..., "description": ...}, then one line per
assistant reply: {"content": [blocks], "stop_reason": "tool_use"}; tool_use blocks may omit their ids.
Driven through the real SDK, it proves the whole loop (planner, tools, sandbox, trace) on real proposals
without a real LLM: e.g. this project's own history of its seed kernel replayed as `propose` edits.
Token usage is estimated from the request size (about 4 characters a token; the prefix up to the system
prompt and the previous request's messages count as cache reads, the rest as cache writes), so cost
accounting runs as it would, without a tokenizer.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from pydantic import BaseModel

Responder = Callable[[dict, dict], tuple[int, dict]]
CHARS_PER_TOKEN = 4


class MessagesServer:
    """POST /v1/messages on 127.0.0.1 (a free port): `respond(body, headers) -> (status, json)` answers."""

    def __init__(self, respond: Responder):
        self.respond = respond
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - the http.server interface
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                status, payload = outer.respond(body, {k.lower(): v for k, v in self.headers.items()})
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> MessagesServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class ScriptHeader(BaseModel):
    model: str = "claude-sonnet-4-5"
    description: str = ""


class ScriptTurn(BaseModel):
    content: list[dict]
    stop_reason: str = "tool_use"


def load_script(path: Path) -> tuple[ScriptHeader, list[ScriptTurn]]:
    """A script file: its header (or the defaults) and its turns; a line that is not a turn is an error."""
    header, turns = ScriptHeader(), []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        raw = json.loads(line)
        if n == 1 and "content" not in raw:
            header = ScriptHeader.model_validate(raw)
            continue
        turns.append(ScriptTurn.model_validate(raw))
    return header, turns


def _tokens(obj) -> int:
    return max(1, len(json.dumps(obj)) // CHARS_PER_TOKEN)


class ScriptedModel:
    """Plays `turns` in order; once they are spent it answers `finish` (the session then ends cleanly)."""

    def __init__(self, header: ScriptHeader, turns: list[ScriptTurn]):
        self.header, self.turns = header, list(turns)
        self.requests: list[dict] = []
        self.server = MessagesServer(self._respond)
        self._lock = threading.Lock()

    @classmethod
    def from_file(cls, path: Path) -> ScriptedModel:
        return cls(*load_script(path))

    @property
    def url(self) -> str:
        return self.server.url

    def __enter__(self) -> ScriptedModel:
        self.server.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.server.__exit__(*exc)

    def _respond(self, body: dict, _headers: dict) -> tuple[int, dict]:
        with self._lock:
            previous = self.requests[-1] if self.requests else None
            self.requests.append(body)
            n = len(self.requests)
            turn = self.turns.pop(0) if self.turns else ScriptTurn(content=[
                {"type": "tool_use", "name": "finish", "input": {"reason": "the script is finished"}}])
        content = [dict(b, id=b.get("id") or f"toolu_s{n:04d}_{k}") if b.get("type") == "tool_use" else b
                   for k, b in enumerate(turn.content)]
        return 200, {"id": f"msg_script_{n:04d}", "type": "message", "role": "assistant", "model": self.header.model,
                     "content": content, "stop_reason": turn.stop_reason, "stop_sequence": None,
                     "usage": _usage(body, previous, content)}


def _unmarked(messages: list[dict]) -> list[dict]:
    """Messages without their cache breakpoints (a breakpoint moves; the content it marks does not)."""
    return [{**m, "content": [{k: v for k, v in b.items() if k != "cache_control"} for b in m["content"]]
             if isinstance(m.get("content"), list) else m.get("content")} for m in messages]


def _usage(body: dict, previous: dict | None, content: list[dict]) -> dict:
    """Estimated tokens of a request under prompt caching: the tools and system prompt are cached once, and the
    previous request's messages are read from the cache when this request extends them."""
    prefix = _tokens(body.get("tools", [])) + _tokens(body.get("system", []))
    messages = _unmarked(body.get("messages", []))
    same_prefix = previous is not None and previous.get("system") == body.get("system")
    before = _unmarked(previous["messages"]) if same_prefix else []
    seen = len(before) if same_prefix and before == messages[: len(before)] else 0
    read = (prefix if same_prefix else 0) + (_tokens(messages[:seen]) if seen else 0)
    write = (0 if same_prefix else prefix) + _tokens(messages[seen:])
    return {"input_tokens": 3, "output_tokens": _tokens(content), "cache_creation_input_tokens": write,
            "cache_read_input_tokens": read}
