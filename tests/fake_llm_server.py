"""A real OpenAI-compatible HTTP server on loopback, driven by a script, for testing the LLM layer.

The point is to exercise litellm's real HTTP client (status mapping, timeouts, JSON decoding)
rather than a mock of it. Each incoming chat request takes the next step of the script:

    with FakeLLMServer([RateLimited(retry_after_s=0), Completion("hello")]) as server:
        ...  # point a client at server.api_base
        assert len(server.requests) == 2

A request that asks to stream gets the completion as server-sent events (with the usage last when
`stream_options.include_usage` is set), as OpenAI and vLLM send them.

A script is either a list of steps (consumed in order; once exhausted, every further request
gets a 500 that says so) or a function from the recorded request to a step.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from ksearch_ray.policies.standin.loopback import LoopbackServer


@dataclass(frozen=True)
class Completion:
    """A chat completion, sent whole or, when the request asks to stream, as server-sent events."""

    text: str | None  # None: `content: null`
    prompt_tokens: int = 10
    completion_tokens: int = 5
    delay_s: float = 0.0
    model: str | None = None  # echo the requested model when None
    reasoning: str | None = None  # `reasoning_content`, as vLLM's reasoning parsers and DeepSeek send it
    tool_arguments: str | None = None  # the answer as a tool call's arguments (content null)
    finish_reason: str = "stop"
    chunk_delay_s: float = 0.0  # between streamed chunks
    cut_after_chunks: int | None = None  # a stream the connection drops after this many chunks


@dataclass(frozen=True)
class HTTPError:
    """An error status with an OpenAI-style error body."""

    status: int
    message: str = "fake server error"
    retry_after_s: float | None = None
    delay_s: float = 0.0


def RateLimited(retry_after_s: float | None = 0.0) -> HTTPError:  # noqa: N802 - reads like a step type
    return HTTPError(429, "Rate limit reached for requests", retry_after_s=retry_after_s)


@dataclass(frozen=True)
class Malformed:
    """A 200 response whose body is not valid JSON."""

    body: bytes = b'{"id": "chatcmpl-broken", "choices": [ {"mess'
    delay_s: float = 0.0


Step = Completion | HTTPError | Malformed


@dataclass
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: Any
    received_at: float = field(default_factory=time.monotonic)


Script = Sequence[Step] | Callable[[RecordedRequest], Step]


def always(step: Step) -> Callable[[RecordedRequest], Step]:
    """A script that answers every request the same way."""
    return lambda _request: step


class FakeLLMServer(LoopbackServer):
    """Serves POST /v1/chat/completions, /chat/completions and GET /v1/models on 127.0.0.1."""

    def __init__(self, script: Script) -> None:
        self._script = script
        self._position = 0
        self._lock = threading.Lock()
        self.requests: list[RecordedRequest] = []
        self._listen(_make_handler(self), 0, "fake-llm-server", poll_s=0.02)

    @property
    def chat_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.path.rstrip("/").endswith("chat/completions")]

    def _record(self, request: RecordedRequest) -> None:
        with self._lock:
            self.requests.append(request)

    def _record_and_pick(self, request: RecordedRequest) -> Step:
        with self._lock:
            self.requests.append(request)
            if callable(self._script):
                return self._script(request)
            if self._position >= len(self._script):
                return HTTPError(500, f"fake server: script exhausted after {len(self._script)} steps")
            step = self._script[self._position]
            self._position += 1
            return step

    def _sleep(self, seconds: float) -> None:
        if seconds > 0:
            self._closing.wait(seconds)


def _message(step: Completion) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": step.text}
    if step.reasoning is not None:
        message["reasoning_content"] = step.reasoning
    if step.tool_arguments is not None:
        message["tool_calls"] = [{"id": "call_1", "type": "function",
                                  "function": {"name": "answer", "arguments": step.tool_arguments}}]
    return message


def _chunks(step: Completion, requested_model: str, usage: bool) -> list[dict[str, Any]]:
    """The completion as stream chunks: the reasoning, the content and the tool call's arguments in
    pieces, then the finish reason, then (when asked) the usage."""
    head = {"id": f"chatcmpl-{uuid.uuid4().hex[:12]}", "object": "chat.completion.chunk", "created": int(time.time()),
            "model": step.model or requested_model}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return head | {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    out = [chunk({"role": "assistant", "content": ""})]
    for key, text in (("reasoning_content", step.reasoning), ("content", step.text)):
        if text:
            size = max(len(text) // 3, 1)
            out += [chunk({key: text[i:i + size]}) for i in range(0, len(text), size)]
    if step.tool_arguments is not None:
        out.append(chunk({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                          "function": {"name": "answer", "arguments": ""}}]}))
        size = max(len(step.tool_arguments) // 2, 1)
        out += [chunk({"tool_calls": [{"index": 0, "function": {"arguments": step.tool_arguments[i:i + size]}}]})
                for i in range(0, len(step.tool_arguments), size)]
    out.append(chunk({}, step.finish_reason))
    if usage:
        out.append(head | {"choices": [], "usage": {"prompt_tokens": step.prompt_tokens,
                                                    "completion_tokens": step.completion_tokens,
                                                    "total_tokens": step.prompt_tokens + step.completion_tokens}})
    return out


def _completion_body(step: Completion, requested_model: str) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": step.model or requested_model,
        "choices": [
            {
                "index": 0,
                "message": _message(step),
                "finish_reason": step.finish_reason,
            }
        ],
        "usage": {
            "prompt_tokens": step.prompt_tokens,
            "completion_tokens": step.completion_tokens,
            "total_tokens": step.prompt_tokens + step.completion_tokens,
        },
    }


def _make_handler(server: FakeLLMServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - signature is http.server's
            pass  # keep test output clean; requests are recorded on the server instead

        def do_GET(self) -> None:  # noqa: N802 - http.server naming
            if self.path.rstrip("/") in ("/v1/models", "/models"):
                server._record(RecordedRequest("GET", self.path, dict(self.headers), None))
                self._send_json(200, {"object": "list", "data": [{"id": "fake-model", "object": "model"}]})
            else:
                self._send_json(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})

        def do_POST(self) -> None:  # noqa: N802 - http.server naming
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            try:
                body: Any = json.loads(raw) if raw else None
            except json.JSONDecodeError:
                body = raw.decode(errors="replace")
            if self.path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
                self._send_json(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
                return
            step = server._record_and_pick(RecordedRequest("POST", self.path, dict(self.headers), body))
            server._sleep(step.delay_s)
            if server._closing.is_set():
                return
            match step:
                case Completion():
                    model = body.get("model", "fake-model") if isinstance(body, dict) else "fake-model"
                    if isinstance(body, dict) and body.get("stream"):
                        usage = bool((body.get("stream_options") or {}).get("include_usage"))
                        self._send_stream(_chunks(step, model, usage), step)
                    else:
                        self._send_json(200, _completion_body(step, model))
                case HTTPError():
                    headers = {}
                    if step.retry_after_s is not None:
                        headers["Retry-After"] = f"{step.retry_after_s:g}"
                    error = {"error": {"message": step.message, "type": "fake_error", "code": step.status}}
                    self._send_json(step.status, error, headers)
                case Malformed():
                    self._send_raw(200, step.body, "application/json")

        def _send_stream(self, chunks: list[dict[str, Any]], step: Completion) -> None:
            """Server-sent events, then the connection closes (so no length is needed)."""
            self.close_connection = True
            try:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Connection", "close")
                self.end_headers()
                for n, chunk in enumerate(chunks):
                    if step.cut_after_chunks is not None and n >= step.cut_after_chunks:
                        return  # the connection drops part way
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()
                    server._sleep(step.chunk_delay_s)
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                pass

        def _send_json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
            self._send_raw(status, json.dumps(payload).encode(), "application/json", headers)

        def _send_raw(
            self, status: int, data: bytes, content_type: str, headers: dict[str, str] | None = None
        ) -> None:
            try:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                # The client gave up (e.g. its timeout fired during a slow step); that is the test's point.
                pass

    return Handler
