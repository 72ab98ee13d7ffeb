"""An OpenAI-compatible server on loopback that plays planner and coder (see `player`).

For tests and demos without an LLM: `ksearch standin --port 8000`, then
`ksearch run --task trimul --model hosted_vllm/standin --api-base http://127.0.0.1:8000/v1`.
As a provider it has the habits `habits.Habits` names, each configurable: latency, 429s with a
Retry-After, outages (503s for a while), a temperature it refuses, content-policy refusals, a
context window, replies with `content: null` and the answer in `reasoning_content`, replies given
only as a tool call, replies cut at the length limit (continued when asked), an exhausted quota.
It streams when asked (server-sent events, usage last), honours `response_format` (JSON-schema
replies), and records every request it got, so tests can read the prompts a run sent.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Self

from ksearch_ray.policies.standin.habits import Habits
from ksearch_ray.policies.standin.loopback import (
    LoopbackServer,
    WireHandler,
    chunks_of,
    completion_body,
    wants_usage,
)
from ksearch_ray.policies.standin.player import Player

CONTINUE_MARK = "Your reply was cut off at the length limit"
"""How the client asks for the rest of a cut reply (`llm.llm_policy.CONTINUE`)."""


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


@dataclass
class Answer:
    """What one request gets: an HTTP status with an error, or a reply and how it is shaped."""

    status: int
    error: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    text: str = ""
    finish_reason: str = "stop"
    as_reasoning: bool = False
    as_tool_call: bool = False
    delay_s: float = 0.0
    prompt_tokens: int = 0


class StandIn(LoopbackServer):
    """`with StandIn() as server:` serves on 127.0.0.1 (port 0 = any free port) until the block ends."""

    def __init__(self, port: int = 0, *, seed: int = 0, habits: Habits | None = None,
                 rate_limit_every: int | None = None, latency_s: float | None = None):
        habits = habits or Habits()
        changes: dict[str, Any] = {}
        if rate_limit_every is not None:
            changes["rate_limit_every"] = rate_limit_every
        if latency_s is not None:
            changes["latency_s"] = (latency_s, latency_s)
        self.habits = habits.model_copy(update=changes)
        self.player = Player(seed, self.habits)
        self.seed = seed
        self.exchanges: list[Exchange] = []
        self.started = time.monotonic()
        self.first_chat: float | None = None  # outages are timed from the first chat request
        self._limited: set[str] = set()
        self._admitted: deque[tuple[float, int]] = deque()  # (monotonic time, tokens) in the limits' window
        self.throttled = 0
        """429s sent for the request and token limits."""
        self._chats = 0
        self._lock = threading.Lock()
        self._listen(_handler(self), port, "standin")

    def start(self) -> Self:
        self.started = time.monotonic()
        return super().start()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            self._closing.wait(seconds)

    def models(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"id": "standin", "object": "model"}
        if self.habits.context_tokens:
            entry["max_model_len"] = self.habits.context_tokens  # as vLLM lists it
        return {"object": "list", "data": [entry]}

    # --- one request --------------------------------------------------------------------------------

    def respond(self, body: dict[str, Any]) -> Answer:
        """What one chat request gets, by the habits, in order: quota, outage, a refused parameter, the
        context window, a content policy, a rate limit; then the player's reply, shaped."""
        h = self.habits
        messages = body.get("messages") or []
        key = hashlib.sha256(json.dumps(messages, sort_keys=True).encode()).hexdigest()
        roll = int(key[:8], 16) % 100
        rng = random.Random(f"{self.seed}:{key}")
        prompt_chars = sum(len(str(m.get("content") or "")) for m in messages)
        with self._lock:
            self._chats += 1
            calls = self._chats
            first_time = key not in self._limited
            self._limited.add(key)
        with self._lock:
            self.first_chat = self.first_chat if self.first_chat is not None else time.monotonic()
        now = time.monotonic() - self.first_chat

        def refuse(status: int, message: str, kind: str, headers: dict[str, str] | None = None) -> Answer:
            return Answer(status, {"error": {"message": message, "type": kind, "code": kind}}, headers or {})

        if h.quota_after is not None and calls > h.quota_after:
            return refuse(429, "You exceeded your current quota, please check your plan and billing details.",
                          "insufficient_quota")
        if (wait := self._over_limit(prompt_chars // 4 + int(body.get("max_tokens") or 0))) is not None:
            return refuse(429, "Rate limit reached for requests or tokens per min (stand-in limits)", "rate_limit_exceeded",
                          {"Retry-After": f"{math.ceil(wait)}", "retry-after-ms": f"{wait * 1000:.0f}"})
        if any(start <= now < end for start, end in h.outages):
            return refuse(503, "The server is overloaded or down for maintenance (stand-in outage).", "server_error")
        if h.refuse_temperature and "temperature" in body:
            return refuse(400, "Unsupported value: 'temperature' does not support this value with this model. "
                               "Only the default (1) value is supported.", "invalid_request_error")
        if h.context_tokens is not None and prompt_chars // 3 > h.context_tokens:
            return refuse(400, f"This model's maximum context length is {h.context_tokens} tokens. However, your "
                               f"messages resulted in {prompt_chars // 3} tokens. Please reduce the length of the "
                               "messages.", "invalid_request_error")
        if roll < h.content_policy and first_time:
            return refuse(400, "Your request was rejected as a result of our safety system (content_policy_violation).",
                          "invalid_request_error")
        if h.rate_limit_every and first_time and int(key[8:16], 16) % h.rate_limit_every == 0:
            return refuse(429, "Rate limit reached for requests (stand-in)", "rate_limit",
                          {"Retry-After": f"{h.retry_after_s:g}"})
        structured = (body.get("response_format") or {}).get("type") == "json_schema"
        continued = bool(messages) and CONTINUE_MARK in str(messages[-1].get("content") or "")
        if continued:  # the rest of a reply it cut: the same answer to the same question, from where it stopped
            original = [m for m in messages[:-2]]
            full = self.player.answer(original, structured)
            text, finish = full[len(str(messages[-2].get("content") or "")):], "stop"
        else:
            text, finish = self.player.answer(messages, structured), "stop"
            if (int(key[16:24], 16) % 100) < h.truncate and len(text) > 40:
                text, finish = text[: len(text) * 6 // 10], "length"
        low, high = h.latency_s
        shape = int(key[24:32], 16) % 100
        return Answer(200, text=text, finish_reason=finish, delay_s=rng.uniform(low, high) if high > 0 else 0.0,
                      as_reasoning=shape < h.reasoning and not structured,
                      as_tool_call=h.reasoning <= shape < h.reasoning + h.tool_calls,
                      prompt_tokens=prompt_chars // 4)

    def _over_limit(self, tokens: int) -> float | None:
        """None, and the request counted, when the window admits it; else seconds until it would."""
        h = self.habits
        if h.requests_per_min is None and h.tokens_per_min is None:
            return None
        with self._lock:
            now = time.monotonic()
            while self._admitted and self._admitted[0][0] <= now - h.limit_window_s:
                self._admitted.popleft()
            waits = []
            if h.requests_per_min is not None and len(self._admitted) >= h.requests_per_min:
                waits.append(self._admitted[len(self._admitted) - h.requests_per_min][0] + h.limit_window_s - now)
            used = sum(t for _, t in self._admitted)
            if h.tokens_per_min is not None and used + tokens > h.tokens_per_min:
                freed = 0
                for at, t in self._admitted:
                    freed += t
                    if used - freed + tokens <= h.tokens_per_min:
                        waits.append(at + h.limit_window_s - now)
                        break
                else:
                    waits.append(h.limit_window_s)
            if waits:
                self.throttled += 1
                return max(max(waits), 0.001)
            self._admitted.append((now, tokens))
            return None

    def record(self, exchange: Exchange) -> None:
        with self._lock:
            self.exchanges.append(exchange)


def _completion(answer: Answer, model: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": answer.text}
    if answer.as_reasoning:
        message = {"role": "assistant", "content": None, "reasoning_content": answer.text}
    elif answer.as_tool_call:
        message = {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_1", "type": "function", "function": {"name": "answer", "arguments": _tool_arguments(answer.text)}}]}
    return completion_body(message, model, finish=answer.finish_reason, prompt_tokens=answer.prompt_tokens,
                           completion_tokens=len(answer.text) // 4)


def _tool_arguments(text: str) -> str:
    """A reply as a tool call: plans as their JSON, code as {"explanation", "code"}."""
    block = text.split("```", 2)
    if len(block) == 3:
        tag, _, code = block[1].partition("\n")
        if tag.strip() == "json":
            return code.strip()
        return json.dumps({"explanation": block[0].strip(), "code": code})
    return json.dumps({"explanation": text})


def _handler(server: StandIn) -> type[WireHandler]:
    class Handler(WireHandler):
        def do_GET(self) -> None:  # noqa: N802  (http.server's naming)
            if self.path.rstrip("/") in ("/v1/models", "/models"):
                self.send_json(200, server.models())
            else:
                self.send_json(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self) -> None:  # noqa: N802
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
                self.send_json(404, {"error": {"message": f"no route {self.path}"}})
                return
            try:
                body = json.loads(raw or b"{}")
            except json.JSONDecodeError:
                self.send_json(400, {"error": {"message": "the request body is not JSON"}})
                return
            answer = server.respond(body)
            server.record(Exchange(body, answer.status, answer.text))
            if answer.error is not None:
                self.send_json(answer.status, answer.error, answer.headers)
                return
            server.sleep(answer.delay_s)
            completion = _completion(answer, str(body.get("model", "standin")))
            if body.get("stream"):
                self.send_events(chunks_of(completion, wants_usage(body)),
                                 pause=lambda: server.sleep(server.habits.stream_chunk_s))
            else:
                self.send_json(200, completion)

    return Handler
