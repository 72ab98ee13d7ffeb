"""An OpenAI-compatible HTTP server on 127.0.0.1 in a thread of its own: what the stand-in, the wire-habit
proxies and the tests' scripted servers share. The lifecycle (start, stop, `with`, the port and the API
base), the handler's ways of answering (a JSON body, server-sent events), and the chat-completions wire
format: a completion's body, and the same completion as stream chunks."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self


class LoopbackServer:
    """A subclass builds its handler class and calls `_listen(handler, port, name)` in __init__."""

    _closing: threading.Event  # set on stop, so that slow replies stop sleeping and the server closes promptly

    def _listen(self, handler: type[BaseHTTPRequestHandler], port: int = 0, name: str = "loopback",
                poll_s: float = 0.05) -> None:
        self._closing = threading.Event()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", port), handler)
        self._httpd.daemon_threads = True
        # A short poll interval: shutdown() waits up to one interval, and tests stop many servers.
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": poll_s},
                                        name=name, daemon=True)

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def api_base(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._closing.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class WireHandler(BaseHTTPRequestHandler):
    """A request handler that answers as OpenAI-compatible servers do; a client that goes away mid-answer
    is not an error (that is often a test's point: a timeout that fired)."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002  (http.server's signature)
        pass  # servers record what they got themselves

    def send_json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        self.send_body(status, json.dumps(payload).encode(), headers)

    def send_body(self, status: int, data: bytes, headers: dict[str, str] | None = None,
                  content_type: str = "application/json") -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def send_events(self, chunks: list[dict[str, Any]], *, done: bool = True, cut_after: int | None = None,
                    pause: Callable[[], None] | None = None) -> None:
        """Server-sent events, then `[DONE]` (unless not `done`), and the connection closes (no length needed).
        `cut_after` drops the connection after that many chunks; `pause` runs after each chunk."""
        self.close_connection = True
        try:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            for n, chunk in enumerate(chunks):
                if cut_after is not None and n >= cut_after:
                    return  # the connection drops part way
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
                if pause is not None:
                    pause()
            if done:
                self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass


def completion_body(message: dict[str, Any], model: str, *, finish: str = "stop", prompt_tokens: int = 0,
                    completion_tokens: int = 0) -> dict[str, Any]:
    """A chat completion as a server sends it unstreamed: one choice, the usage."""
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:12]}", "object": "chat.completion", "created": int(time.time()),
        "model": model, "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    }


def chunks_of(completion: dict[str, Any], usage: bool) -> list[dict[str, Any]]:
    """A completion as stream chunks: the role, reasoning and content in pieces, each tool call's name and then
    its arguments in pieces, the finish, and (when asked) the usage last."""
    choice = completion["choices"][0]
    message = choice["message"]
    head = {"id": completion.get("id") or f"chatcmpl-{uuid.uuid4().hex[:12]}", "object": "chat.completion.chunk",
            "created": int(time.time()), "model": completion.get("model", "")}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return head | {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    out = [chunk({"role": "assistant", "content": ""})]
    for key in ("reasoning_content", "content"):
        text = message.get(key) or ""
        size = max(len(text) // 4, 1)
        out += [chunk({key: text[i:i + size]}) for i in range(0, len(text), size)]
    for index, call in enumerate(message.get("tool_calls") or []):
        arguments = call["function"]["arguments"]
        out.append(chunk({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                          "function": {"name": call["function"]["name"], "arguments": ""}}]}))
        size = max(len(arguments) // 3, 1)
        out += [chunk({"tool_calls": [{"index": index, "function": {"arguments": arguments[i:i + size]}}]})
                for i in range(0, len(arguments), size)]
    out.append(chunk({}, choice.get("finish_reason") or "stop"))
    if usage and completion.get("usage"):
        out.append(head | {"choices": [], "usage": completion["usage"]})
    return out


def wants_usage(body: dict[str, Any]) -> bool:
    """Whether a streamed request asks for the usage in a last chunk (`stream_options.include_usage`)."""
    return bool((body.get("stream_options") or {}).get("include_usage"))
