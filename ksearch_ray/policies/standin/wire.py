"""Servers with an HTTP habit: an OpenAI-compatible proxy on loopback that gets each answer from a real
answer source (the stand-in, or any endpoint) and hands it back the way some servers do.

It knows HTTP and the chat-completions wire format, nothing of the prompts: the answer source reads the
prompts as a model would, and the proxy only changes how the answer travels. Each request goes upstream
unstreamed; the reply comes back with one habit:

- `ignores_stream`: one plain JSON body, whatever `stream` asks (some self-hosted servers and gateways);
- `no_done`: an event stream that never sends `[DONE]` and keeps the connection open;
- `error_200`: every other request gets an HTTP 200 whose body is an error object (an "overloaded");
- `reasoning_only`: the answer only as `reasoning_content`; a stream of it then stops, without a finish;
- `cut_stream`: a stream cut mid-reply (the connection drops inside a chunked body);
- `rejects_stream_options`: a 400 for any request that carries `stream_options`;
- `fences`: code blocks fenced as `py`, `triton` or with no language, in turn;
- `tool_calls`: the answer as a tool call nobody asked for, after a line of prose.

`python -m ksearch_ray.policies.standin.wire --upstream URL --habit NAME --port N` serves one habit;
tests and `experiments/llm_habits.py` start them in-process.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import re
import socket
import threading
import urllib.error
import urllib.request
import uuid
from typing import Any, Literal, get_args

from ksearch_ray.policies.standin.loopback import LoopbackServer, WireHandler, chunks_of, wants_usage

Habit = Literal["ignores_stream", "no_done", "error_200", "reasoning_only", "cut_stream", "rejects_stream_options",
                "fences", "tool_calls"]
HABITS: tuple[str, ...] = get_args(Habit)
OVERLOADED = {"error": {"message": "The model is overloaded. Please try again later.", "type": "overloaded_error",
                        "code": "overloaded"}}
STREAM_OPTIONS_REFUSAL = ("TypeError: create_chat_completion() got an unexpected keyword argument 'stream_options'")
HOLD_S = 30.0
"""How long a `no_done` stream is held open after its last chunk."""
_PYTHON_FENCE = re.compile(r"^(\s*```)python[ \t]*$", re.MULTILINE | re.IGNORECASE)


class WireHabitServer(LoopbackServer):
    """`with WireHabitServer(upstream, "ignores_stream") as server:` serves on 127.0.0.1 until the block ends."""

    def __init__(self, upstream: str, habit: str, *, port: int = 0, error_body: dict[str, Any] | None = None):
        if habit not in HABITS:
            raise ValueError(f"unknown habit {habit!r}: one of {', '.join(HABITS)}")
        self.upstream = upstream.rstrip("/")
        self.habit = habit
        self.error_body = error_body or OVERLOADED
        self.requests: list[dict[str, Any]] = []
        self._count = itertools.count(1)
        self._lock = threading.Lock()
        self._listen(_handler(self), port, f"wire-{habit}")

    def ask_upstream(self, body: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
        """(status, JSON body, headers worth passing on) of the same request, unstreamed, upstream."""
        plain = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
        request = urllib.request.Request(f"{self.upstream}/chat/completions", data=json.dumps(plain).encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=600) as response:
                return response.status, json.load(response), {}
        except urllib.error.HTTPError as exc:
            kept = {k: v for k, v in exc.headers.items() if k.lower() == "retry-after"}
            try:
                payload = json.loads(exc.read() or b"{}")
            except json.JSONDecodeError:
                payload = {"error": {"message": f"upstream said {exc.code}"}}
            return exc.code, payload, kept


def reshape(habit: str, completion: dict[str, Any], n: int) -> dict[str, Any]:
    """The upstream's completion as this habit sends it (the n-th request: `fences` takes turns)."""
    out = json.loads(json.dumps(completion))
    message = out["choices"][0]["message"]
    text = message.get("content") or ""
    if habit == "fences":
        tag = ("py", "triton", "")[(n - 1) % 3]
        message["content"] = _PYTHON_FENCE.sub(lambda m: m.group(1) + tag, text)
    elif habit == "reasoning_only":
        message["content"] = None
        message["reasoning_content"] = text
    elif habit == "tool_calls":
        message["content"] = "I will give the answer through a tool call."
        message["tool_calls"] = [{"id": f"call_{uuid.uuid4().hex[:8]}", "type": "function",
                                  "function": {"name": "respond", "arguments": json.dumps({"content": text})}}]
        out["choices"][0]["finish_reason"] = "tool_calls"
    return out


def _handler(server: WireHabitServer) -> type[WireHandler]:
    class Handler(WireHandler):
        def do_GET(self) -> None:  # noqa: N802  (http.server's naming)
            try:
                with urllib.request.urlopen(f"{server.upstream}/models", timeout=30) as response:
                    self.send_json(response.status, json.load(response))
            except (OSError, ValueError) as exc:
                self.send_json(502, {"error": {"message": f"upstream: {exc}"}})

        def do_POST(self) -> None:  # noqa: N802
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                body = json.loads(raw or b"{}")
            except json.JSONDecodeError:
                self.send_json(400, {"error": {"message": "the request body is not JSON"}})
                return
            with server._lock:
                n = next(server._count)
                server.requests.append(body)
            habit = server.habit
            stream = bool(body.get("stream"))
            if habit == "rejects_stream_options" and "stream_options" in body:
                self.send_json(400, {"error": {"message": STREAM_OPTIONS_REFUSAL, "type": "BadRequestError", "code": 400}})
                return
            if habit == "error_200" and n % 2 == 1:
                self.send_json(200, server.error_body)
                return
            status, completion, headers = server.ask_upstream(body)
            if status != 200 or not completion.get("choices"):
                self.send_json(status, completion, headers)
                return
            completion = reshape(habit, completion, n)
            if not stream or habit == "ignores_stream":
                self.send_json(200, completion)
                return
            chunks = chunks_of(completion, wants_usage(body))
            if habit == "no_done":
                self._chunked(chunks, hold=True)
            elif habit == "cut_stream":
                self._chunked(chunks[: max(len(chunks) // 2, 2)], cut=True)
            elif habit == "reasoning_only":
                self.send_events([c for c in chunks if c["choices"] and not c["choices"][0]["finish_reason"]], done=False)
            else:
                self.send_events(chunks)

        def _chunked(self, chunks: list[dict[str, Any]], *, hold: bool = False, cut: bool = False) -> None:
            """Events in a chunked body: held open without `[DONE]` (hold), or dropped part way (cut)."""
            self.close_connection = True
            try:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for chunk in chunks:
                    data = f"data: {json.dumps(chunk)}\n\n".encode()
                    self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()
                if cut:
                    self.connection.shutdown(socket.SHUT_RDWR)  # no last chunk: the body ends mid-reply
                    return
                if hold:
                    server._closing.wait(HOLD_S)
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError, OSError):
                pass  # the client went away; nothing to tell it

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser(description="An OpenAI-compatible proxy with one HTTP habit.")
    parser.add_argument("--upstream", required=True, help="The answer source's API base, e.g. http://127.0.0.1:8000/v1")
    parser.add_argument("--habit", required=True, choices=HABITS)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    with WireHabitServer(args.upstream, args.habit, port=args.port) as server:
        print(f"{args.habit}: {server.api_base} (answers from {args.upstream})", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()


if __name__ == "__main__":
    main()
