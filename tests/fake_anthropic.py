"""A local HTTP server on 127.0.0.1 that speaks enough of the Messages API for the real SDK.

Responses are scripted: each POST /v1/messages takes the next (status, body) from the queue.
Requests (headers and JSON bodies) are kept for assertions.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def message(content: list[dict], usage: dict | None = None, stop: str = "tool_use") -> tuple[int, dict]:
    return 200, {"id": "msg_test", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
                 "content": content, "stop_reason": stop, "stop_sequence": None,
                 "usage": {"input_tokens": 1200, "output_tokens": 300, "cache_creation_input_tokens": 0,
                           "cache_read_input_tokens": 0, **(usage or {})}}


def tool_use(inp: dict, usage: dict | None = None, tid: str = "toolu_1") -> tuple[int, dict]:
    return message([{"type": "text", "text": "Here is my proposal."},
                    {"type": "tool_use", "id": tid, "name": "propose_kernel", "input": inp}], usage)


def error(status: int, kind: str) -> tuple[int, dict]:
    return status, {"type": "error", "error": {"type": kind, "message": f"scripted {kind}"}}


class FakeAnthropic:
    def __init__(self, script: list[tuple[int, dict]]):
        self.script = list(script)
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                server.requests.append(body)
                server.headers.append({k.lower(): v for k, v in self.headers.items()})
                status, payload = server.script.pop(0) if server.script else error(500, "api_error")
                data = json.dumps(payload).encode()
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

    def __enter__(self) -> FakeAnthropic:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
