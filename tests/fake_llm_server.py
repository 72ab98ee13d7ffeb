"""A real OpenAI-compatible HTTP server on loopback, driven by a script, for testing the LLM layer's wire
handling. It is not a model (the stand-in, `ksearch_ray.policies.standin`, is the one that plays a model):
each step says exactly what the next reply is. It shares the stand-in's server and wire format
(`policies/standin/loopback.py`).

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ksearch_ray.policies.standin.loopback import (
    LoopbackServer,
    WireHandler,
    chunks_of,
    completion_body,
    wants_usage,
)


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


def _completion_body(step: Completion, requested_model: str) -> dict[str, Any]:
    return completion_body(_message(step), step.model or requested_model, finish=step.finish_reason,
                           prompt_tokens=step.prompt_tokens, completion_tokens=step.completion_tokens)


def _make_handler(server: FakeLLMServer) -> type[WireHandler]:
    class Handler(WireHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server naming
            if self.path.rstrip("/") in ("/v1/models", "/models"):
                server._record(RecordedRequest("GET", self.path, dict(self.headers), None))
                self.send_json(200, {"object": "list", "data": [{"id": "fake-model", "object": "model"}]})
            else:
                self.send_json(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})

        def do_POST(self) -> None:  # noqa: N802 - http.server naming
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            try:
                body: Any = json.loads(raw) if raw else None
            except json.JSONDecodeError:
                body = raw.decode(errors="replace")
            if self.path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
                self.send_json(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
                return
            step = server._record_and_pick(RecordedRequest("POST", self.path, dict(self.headers), body))
            server._sleep(step.delay_s)
            if server._closing.is_set():
                return
            match step:
                case Completion():
                    model = body.get("model", "fake-model") if isinstance(body, dict) else "fake-model"
                    completion = _completion_body(step, model)
                    if isinstance(body, dict) and body.get("stream"):
                        self.send_events(chunks_of(completion, wants_usage(body)), cut_after=step.cut_after_chunks,
                                         pause=lambda: server._sleep(step.chunk_delay_s))
                    else:
                        self.send_json(200, completion)
                case HTTPError():
                    headers = {}
                    if step.retry_after_s is not None:
                        headers["Retry-After"] = f"{step.retry_after_s:g}"
                    error = {"error": {"message": step.message, "type": "fake_error", "code": step.status}}
                    self.send_json(step.status, error, headers)
                case Malformed():
                    self.send_body(200, step.body)

    return Handler
