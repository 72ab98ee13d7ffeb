"""An OpenAI-compatible server on loopback that plays planner and coder (see `player`).

For tests and demos without an LLM: `ksearch standin --port 8000`, then
`ksearch run --task trimul --model hosted_vllm/standin --api-base http://127.0.0.1:8000/v1`.
Like a real provider it sometimes refuses with a 429 (and a Retry-After) before it answers, and
it honours `response_format` (JSON-schema replies) when asked. It records every request it got,
so tests can read the prompts a run sent.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ksearch_ray.policies.standin.player import Habits, Player


@dataclass
class Exchange:
    """One chat request and what the stand-in did with it."""

    body: dict[str, Any]
    status: int
    reply: str = ""
    at: float = field(default_factory=time.time)

    @property
    def prompt(self) -> str:
        return "\n".join(str(m.get("content", "")) for m in self.body.get("messages", []))


class StandIn:
    """`with StandIn() as server:` serves on 127.0.0.1 (port 0 = any free port) until the block ends."""

    def __init__(self, port: int = 0, *, seed: int = 0, habits: Habits | None = None, rate_limit_every: int = 9,
                 latency_s: float = 0.0):
        self.player = Player(seed, habits)
        self.rate_limit_every = rate_limit_every
        self.latency_s = latency_s
        self.exchanges: list[Exchange] = []
        self._limited: set[str] = set()
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", port), _handler(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def api_base(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def start(self) -> StandIn:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> StandIn:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def respond(self, body: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
        """(status, JSON body, headers) for one chat request."""
        messages = body.get("messages") or []
        key = hashlib.sha256(json.dumps(messages, sort_keys=True).encode()).hexdigest()
        with self._lock:
            first_time = key not in self._limited
            self._limited.add(key)
        if self.rate_limit_every and first_time and int(key[:8], 16) % self.rate_limit_every == 0:
            self._record(Exchange(body, 429))
            error = {"error": {"message": "Rate limit reached for requests (stand-in)", "type": "rate_limit", "code": 429}}
            return 429, error, {"Retry-After": "0"}
        structured = (body.get("response_format") or {}).get("type") == "json_schema"
        text = self.player.answer(messages, structured)
        self._record(Exchange(body, 200, text))
        if self.latency_s:
            time.sleep(self.latency_s)
        prompt_tokens = sum(len(str(m.get("content", ""))) for m in messages) // 4
        return 200, {
            "id": f"chatcmpl-{uuid.uuid4().hex[:12]}", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model", "standin"),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(text) // 4,
                      "total_tokens": prompt_tokens + len(text) // 4},
        }, {}

    def _record(self, exchange: Exchange) -> None:
        with self._lock:
            self.exchanges.append(exchange)


def _handler(server: StandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002  (http.server's signature)
            pass

        def do_GET(self) -> None:  # noqa: N802  (http.server's naming)
            if self.path.rstrip("/") in ("/v1/models", "/models"):
                self._send(200, {"object": "list", "data": [{"id": "standin", "object": "model"}]})
            else:
                self._send(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self) -> None:  # noqa: N802
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
                self._send(404, {"error": {"message": f"no route {self.path}"}})
                return
            try:
                body = json.loads(raw or b"{}")
            except json.JSONDecodeError:
                self._send(400, {"error": {"message": "the request body is not JSON"}})
                return
            status, payload, headers = server.respond(body)
            self._send(status, payload, headers)

        def _send(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
            data = json.dumps(payload).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up; nothing to tell it

    return Handler
