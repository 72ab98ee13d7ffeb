"""LLM access: one async call interface, a litellm implementation, and a replay cache.

This module is the one boundary where provider exceptions become data: a failed call ends as an
`LLMError` carrying a classified reason and the `LLMCall` record, so callers count failures
instead of crashing on them. litellm is imported lazily (it takes seconds) and only inside the
client, which is built inside the actor that uses it.

Retries follow tenacity's policy (exponential backoff with jitter, a server's Retry-After
honoured up to the cap), with litellm's and the OpenAI SDK's own retries off so that every HTTP
request is counted once, in `LLMCall.attempts`. Failures are classified by litellm's exception
types (`classify_error`): the provider unreachable (retried: a refused or cut connection, a timeout,
a 5xx, a 429, an "overloaded"), a reply that arrived and cannot be read (one failed call, never an
outage), errors that never clear (the run stops), and refusals of one request. A parameter the model
refuses is dropped for that model and the request sent again. Replies stream by default (a proxy
that cuts idle connections cannot cut a long reasoning call), and are read where the model put them:
the content (with a tool call's arguments, when it sent one), else the reasoning. A streamed reply
without an answer (a server that ignores `stream` and sends one JSON body, which litellm reads as an
empty stream; a stream that ends or breaks before its finish) is asked again once without
streaming, and when that answers the client streams no more (`stream_off`). A stream that never
sends `[DONE]` is read up to its finish and usage. Every token billed is in the call's record, a cut
stream's included (estimated). The call interface lives in `policies.llm_call` and the response cache in
`llm.reply_cache`; import them from there.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import random
import re
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import tenacity

from ksearch_ray.config import LLMConfig
from ksearch_ray.policies.llm.ratelimit import Limiter, take_slot
from ksearch_ray.policies.llm.reply_cache import CachedReply, ResponseCache
from ksearch_ray.policies.llm_call import ErrorKind, LLMCall, LLMError, LLMReply, Message
from ksearch_ray.text import clip as clip_line

__all__ = ["LiteLLMClient", "classify_error", "request_hash"]

log = logging.getLogger(__name__)


def request_hash(parameters: dict[str, Any], messages: list[Message]) -> str:
    canonical = json.dumps(
        {"parameters": parameters, "messages": messages},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


# ---------------------------------------------------------------------------------------------
# Error classification
# ---------------------------------------------------------------------------------------------

# Words in a 400's message that say what was refused (litellm maps a provider's 400 to one class; the
# message says why). Lower case.
_CONTENT_POLICY = ("content_policy", "content policy", "content management policy", "content_filter",
                   "content filter", "safety system", "flagged", "responsibleaipolicyviolation")
_QUOTA = ("insufficient_quota", "exceeded your current quota", "quota exceeded", "billing", "credit balance",
          "out of credits", "payment required")
_PARAM_REFUSED = ("unsupported", "not supported", "does not support", "unrecognized", "unknown parameter",
                  "unknown field", "invalid parameter", "extra inputs are not permitted", "not permitted",
                  "is not allowed", "only the default", "unexpected")
REFUSABLE_PARAMS = ("temperature", "max_tokens", "reasoning_effort", "response_format", "stream_options", "stream")
"""Parameters a model may refuse; each is dropped for that model and the call sent again."""
_OVERLOADED = ("overloaded", "overload")
"""A provider's "overloaded", whatever status it came with (some send it as a 200 whose body is an error)."""
_UNREADABLE = ("unable to get json response", "unterminated string", "expecting value", "expecting property name",
               "expecting ',' delimiter", "jsondecodeerror", "invalid control character", "extra data")
"""What litellm's message says when a 200's body did not parse as JSON (some providers' paths report it as a 500)."""
FINISH_GRACE_S = 2.0
"""How long a stream is read after its finish reason, for the usage that follows it: a server that never sends
`[DONE]` nor closes the connection would otherwise hold the call until its timeout."""


def _retry_after_s(exc: BaseException) -> float | None:
    # litellm keeps the provider's headers on its exception (its own `response` is a stand-in without them).
    headers = getattr(exc, "litellm_response_headers", None) or getattr(getattr(exc, "response", None), "headers", None)
    if not headers:
        return None
    headers = {str(k).lower(): v for k, v in dict(headers).items()}
    if (ms := headers.get("retry-after-ms")) is not None:
        try:
            return float(ms) / 1000
        except ValueError:
            pass  # fall through to the seconds header
    if (seconds := headers.get("retry-after")) is not None:
        try:
            return float(seconds)
        except ValueError:
            return None  # an HTTP-date; our own backoff is good enough
    return None


def refused_param(message: str, sent: set[str]) -> str | None:
    """The parameter a 400 says the model does not take, when it names one we sent."""
    text = message.lower()
    if not any(marker in text for marker in _PARAM_REFUSED):
        return None
    if "json_schema" in text and "response_format" in sent:
        return "response_format"
    named = [p for p in REFUSABLE_PARAMS if p in sent and re.search(rf"\b{p}\b", text)]
    # "max_tokens ... use max_completion_tokens": max_tokens is the refused one
    return named[0] if named else None


def classify_error(exc: BaseException, sent: set[str] | None = None) -> LLMError:
    """Turn whatever litellm raised into an LLMError with an honest class, by litellm's exception types
    (the provider's 400 is sorted further by what its message says was refused)."""
    import litellm

    errors = litellm.exceptions
    top = f"{type(exc).__name__}: {exc}"
    text = str(exc).lower()
    status = getattr(exc, "status_code", None)
    status = status if isinstance(status, int) else None
    if isinstance(exc, LLMError):
        return exc
    import httpx

    inner = getattr(exc, "original_exception", None)
    if isinstance(exc, errors.MidStreamFallbackError) and isinstance(inner, Exception) and inner is not exc:
        # What broke the stream says what it was: an error object in a 200 body, a cut connection.
        return classify_error(inner, sent)
    # Timeouts first: litellm's Timeout is a subclass of its connection error.
    if isinstance(exc, errors.Timeout | TimeoutError | httpx.TimeoutException):
        return LLMError("timeout", top, retryable=True, status_code=408)
    if isinstance(exc, errors.APIConnectionError | errors.MidStreamFallbackError | httpx.TransportError):
        return LLMError("connection", top, retryable=True)
    if any(marker in text for marker in _UNREADABLE):
        # A body that did not parse: the provider answered, in a way that cannot be read. One failed call, not
        # an outage (and not asked again: a server that answers so answers so again).
        return LLMError("malformed_response", top, retryable=False, status_code=status)
    if any(marker in text for marker in _OVERLOADED) and not isinstance(exc, errors.ContextWindowExceededError):
        # An outage in words, whatever status it came with (a 200 whose body is an error object included).
        return LLMError("server", top, retryable=True, status_code=status, retry_after_s=_retry_after_s(exc))
    if isinstance(exc, errors.ContextWindowExceededError):
        return LLMError("context_window", top, retryable=False, status_code=400)
    if isinstance(exc, errors.ContentPolicyViolationError):
        return LLMError("content_policy", top, retryable=False, status_code=status)
    if isinstance(exc, errors.RateLimitError):
        if any(marker in text for marker in _QUOTA):
            return LLMError("quota", top, retryable=False, status_code=429)
        return LLMError("rate_limit", top, retryable=True, status_code=429, retry_after_s=_retry_after_s(exc))
    if isinstance(exc, errors.BudgetExceededError | errors.PaymentRequiredError):
        return LLMError("quota", top, retryable=False, status_code=status)
    if isinstance(exc, errors.AuthenticationError | errors.PermissionDeniedError):
        return LLMError("auth", top, retryable=False, status_code=status)
    if isinstance(exc, errors.NotFoundError):
        return LLMError("not_found", top, retryable=False, status_code=status)
    if isinstance(exc, errors.UnsupportedParamsError | errors.BadRequestError | errors.UnprocessableEntityError):
        param = refused_param(str(exc), sent or set())
        if param is not None or isinstance(exc, errors.UnsupportedParamsError):
            return LLMError("unsupported_param", top, retryable=False, status_code=status, param=param)
        if any(marker in text for marker in _CONTENT_POLICY):
            return LLMError("content_policy", top, retryable=False, status_code=status)
        if any(marker in text for marker in _QUOTA):
            return LLMError("quota", top, retryable=False, status_code=status)
        return LLMError("bad_request", top, retryable=False, status_code=status)
    if isinstance(exc, errors.ServiceUnavailableError | errors.InternalServerError | errors.BadGatewayError):
        # litellm reports a refused connection as an InternalServerError: retryable either way.
        kind: ErrorKind = "connection" if any(m in text for m in ("connection error", "cannot connect",
                                                                  "connection refused")) else "server"
        return LLMError(kind, top, retryable=True, status_code=status, retry_after_s=_retry_after_s(exc))
    if isinstance(exc, errors.APIError | errors.APIResponseValidationError | json.JSONDecodeError):
        if status is not None and status >= 500 or status in (408, 409):
            return LLMError("server", top, retryable=True, status_code=status, retry_after_s=_retry_after_s(exc))
        # A 200 whose body does not parse: the provider answered, in a way that cannot be read. One failed call,
        # not an outage (and not asked again: a server that answers so answers so again).
        return LLMError("malformed_response", top, retryable=False, status_code=status)
    # Raised without an HTTP exchange (bad parameters, unknown provider): retrying cannot help.
    return LLMError("client", top, retryable=False, status_code=status)


# ---------------------------------------------------------------------------------------------
# The litellm client
# ---------------------------------------------------------------------------------------------


def _import_litellm() -> Any:
    # Without this, importing litellm fetches the price map from GitHub (and stalls offline).
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    litellm.suppress_debug_info = True  # otherwise every exception also prints a banner to stdout
    return litellm


@dataclass
class _Answer:
    """What one response (or one stream) said, whatever its shape."""

    content: str = ""
    reasoning: str = ""
    tool_arguments: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    estimated: bool = False

    chunks: int = 0  # stream chunks received
    usage_seen: bool = False  # a stream's usage chunk came

    @property
    def said(self) -> bool:
        return bool(self.content.strip() or self.reasoning.strip() or any(a.strip() for a in self.tool_arguments))

    def text(self) -> tuple[str, Literal["content", "reasoning", "tool_call"]]:
        """The reply to read: the content, with a tool call's arguments after it when the model sent one (a
        model that answers through a tool nobody offered, often after a line of prose); else the reasoning (a
        server that put the whole answer there and left content null)."""
        if self.tool_arguments:
            tools = "\n".join(tool_text(a) for a in self.tool_arguments)
            return (f"{self.content.strip()}\n\n{tools}" if self.content.strip() else tools), "tool_call"
        if self.content.strip():
            return self.content, "content"
        if self.reasoning.strip():
            return self.reasoning, "reasoning"
        return self.content, "content"


def tool_text(arguments: str) -> str:
    """A tool call's JSON arguments as a reply: ops stay JSON; code (in `code`, `source`, ... or
    `files`) becomes the fenced blocks the parser reads."""
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError:
        return arguments
    if isinstance(value, dict):
        files = value.get("files")
        if isinstance(files, dict) and all(isinstance(v, str) for v in files.values()):
            return "\n\n".join(f"### file: {name}\n```\n{source}\n```" for name, source in files.items())
        for key in ("code", "source", "kernel", "solution", "content", "program"):
            if isinstance(value.get(key), str):
                prose = value.get("explanation") or value.get("description") or ""
                # A whole reply in one argument (prose and fenced blocks) is read as it is, not fenced again.
                body = value[key] if "```" in value[key] or "~~~" in value[key] else f"```\n{value[key]}\n```"
                return f"{prose}\n\n{body}".strip()
    return arguments if isinstance(value, dict | list) else str(value)


def _unpack(response: Any) -> _Answer:
    choice = response.choices[0]
    message = choice.message
    usage = getattr(response, "usage", None)
    tools = [call.function.arguments for call in (getattr(message, "tool_calls", None) or [])
             if getattr(call, "function", None) is not None and call.function.arguments]
    return _Answer(
        content=message.content or "", reasoning=getattr(message, "reasoning_content", None) or "",
        tool_arguments=tools, finish_reason=choice.finish_reason,
        prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
        completion_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
    )


class LiteLLMClient:
    """LLMClient over litellm.acompletion, with our own retries so the attempt count is honest."""

    def __init__(
        self,
        config: LLMConfig,
        *,
        cache: ResponseCache | None = None,
        rng: random.Random | None = None,
        limiter: Limiter | None = None,
    ) -> None:
        if config.model is None:
            raise ValueError("an LLM client needs a model")
        self.model: str = config.model
        self.config = config
        self.cache = cache
        self._rng = rng or random.Random()
        self._semaphore = asyncio.Semaphore(config.concurrency)
        self.limiter = limiter
        """The endpoint's shared rate limit (`ratelimit`): every request sent waits for its slot first."""
        self._litellm: Any = None
        self.refused: set[str] = set()
        """Parameters this model refused: not sent again (a refused max_tokens goes as max_completion_tokens)."""
        self.stream_off: str | None = None
        """Why this endpoint is not streamed to (a streamed reply came without an answer and the same request,
        not streamed, answered): set once, by the first such call; the run records it and a resumed run starts
        with `llm.stream` off."""
        self._context: int | None | bool = False  # False: not looked up yet

    async def complete(self, kind: str, messages: list[Message], *, response_format: dict[str, Any] | None = None
                       ) -> LLMReply:
        parameters = self.config.reply_parameters() | ({"response_format": response_format} if response_format else {})
        key = request_hash(parameters, messages)
        sample = self.cache.claim(key) if self.cache else 0
        started = time.monotonic()
        base = LLMCall(kind=kind, model=self.model, request_hash=key, sample=sample)

        if self.cache and (hit := self.cache.get(key, sample)):
            call = base.model_copy(
                update={
                    "prompt_tokens": hit.prompt_tokens,
                    "completion_tokens": hit.completion_tokens,
                    "cost_known": hit.cost_known,
                    "original_cost_usd": hit.cost_usd,
                    "finish_reason": hit.finish_reason,
                    "cached": True,
                    "latency_s": time.monotonic() - started,
                }
            )
            return LLMReply(text=hit.text, call=call)

        ledger = _Ledger()
        try:
            answer, attempts = await self._attempt_with_retries(kind, messages, response_format, ledger)
        except LLMError as error:
            cost_usd, cost_known = self._cost(ledger.prompt_tokens, ledger.completion_tokens)
            error.call = base.model_copy(
                update={
                    "attempts": error.attempts,
                    "error": str(error),
                    "error_kind": error.kind,
                    "retry_after_s": error.retry_after_s,
                    "latency_s": time.monotonic() - started,
                    "prompt_tokens": ledger.prompt_tokens,
                    "completion_tokens": ledger.completion_tokens,
                    "tokens_estimated": ledger.estimated,
                    "cost_usd": cost_usd,
                    "cost_known": cost_known,
                    "dropped_params": sorted(ledger.dropped),
                    "streamed": ledger.streamed,
                    "stream_fallback": ledger.stream_fallback,
                }
            )
            raise

        text, answer_from = answer.text()
        prompt_tokens = ledger.prompt_tokens + answer.prompt_tokens
        completion_tokens = ledger.completion_tokens + answer.completion_tokens
        cost_usd, cost_known = self._cost(prompt_tokens, completion_tokens)
        call = base.model_copy(
            update={
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "cost_usd": cost_usd,
                "cost_known": cost_known,
                "finish_reason": answer.finish_reason,
                "attempts": attempts,
                "latency_s": time.monotonic() - started,
                "dropped_params": sorted(ledger.dropped),
                "tokens_estimated": ledger.estimated or answer.estimated,
                "streamed": ledger.streamed,
                "stream_fallback": ledger.stream_fallback,
                "reasoning_chars": len(answer.reasoning),
                "answer_from": answer_from,
            }
        )
        if self.cache:
            self.cache.put(
                CachedReply(
                    request_hash=key,
                    sample=sample,
                    model=self.model,
                    text=text,
                    prompt_tokens=prompt_tokens,
                    completion_tokens=completion_tokens,
                    cost_usd=cost_usd,
                    cost_known=cost_known,
                    finish_reason=answer.finish_reason,
                )
            )
        return LLMReply(text=text, call=call)

    async def _attempt_with_retries(self, kind: str, messages: list[Message], response_format: dict[str, Any] | None,
                                    ledger: _Ledger) -> tuple[_Answer, int]:
        """(answer, requests sent); the final LLMError carries the number of requests in `attempts`.

        A parameter the model refuses is dropped for it and the request sent again at once (not counted
        among the retries: nothing was wrong with the provider)."""
        sent = 0

        def wait(state: tenacity.RetryCallState) -> float:
            error = state.outcome.exception() if state.outcome else None
            return self._backoff_s(state.attempt_number, getattr(error, "retry_after_s", None))

        def before_sleep(state: tenacity.RetryCallState) -> None:
            error = state.outcome.exception() if state.outcome else None
            log.warning("%s attempt %d/%d failed (%s); retrying in %.2fs", kind, state.attempt_number,
                        self.config.max_retries + 1, error, state.upcoming_sleep)

        retrying = tenacity.AsyncRetrying(
            stop=tenacity.stop_after_attempt(self.config.max_retries + 1),
            wait=wait,
            retry=tenacity.retry_if_exception(lambda e: isinstance(e, LLMError) and e.retryable),
            before_sleep=before_sleep,
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    for _ in range(len(REFUSABLE_PARAMS) + 1):
                        sent += 1
                        try:
                            answer = await self._attempt(messages, response_format, ledger)
                            break
                        except LLMError as error:
                            if not error.sent_request:
                                sent -= 1
                            # The parameter named was sent with this request (refused_param only names
                            # those), so it goes at once; a concurrent call may have learnt it already.
                            if error.kind == "unsupported_param" and error.param:
                                if error.param not in self.refused:
                                    log.warning("%s refuses %s: sending it no more (%s)", self.model, error.param, error)
                                self.refused.add(error.param)
                                ledger.dropped.add(error.param)
                                continue
                            raise
            return answer, sent + ledger.extra_requests
        except LLMError as error:
            error.attempts = sent + ledger.extra_requests
            raise

    def _backoff_s(self, attempt: int, retry_after_s: float | None) -> float:
        cfg = self.config
        # Exponential with "equal jitter": at least half the nominal wait, so retries from many
        # concurrent cycles spread out without ever hammering the server immediately.
        nominal = min(cfg.backoff_max_s, cfg.backoff_base_s * 2 ** (attempt - 1))
        delay = nominal * self._rng.uniform(0.5, 1.0)
        if retry_after_s is not None:
            delay = max(delay, min(retry_after_s, cfg.backoff_max_s))
        return delay

    def _litellm_module(self) -> Any:
        if self._litellm is None:
            self._litellm = _import_litellm()
        return self._litellm

    def context_tokens(self) -> int | None:
        """The model's context window: litellm's model map, else what an OpenAI-compatible server says
        of it (vLLM's /models lists `max_model_len`), else None."""
        if self._context is False:
            self._context = self._lookup_context()
        return self._context if isinstance(self._context, int) else None

    def _lookup_context(self) -> int | None:
        litellm = self._litellm_module()
        try:
            info = litellm.get_model_info(self.model)
            window = info.get("max_input_tokens") or info.get("max_tokens")
            if window:
                return int(window)
        except Exception:  # noqa: BLE001  (litellm raises for any model it has no entry for)
            log.debug("litellm has no context window for %s", self.model)
        if not self.config.api_base:
            return None
        import urllib.request

        try:
            with urllib.request.urlopen(self.config.api_base.rstrip("/") + "/models", timeout=10) as response:
                listing = json.load(response)
        except (OSError, ValueError) as exc:
            log.debug("no model listing at %s: %s", self.config.api_base, exc)
            return None
        name = self.model.split("/", 1)[-1]
        for entry in listing.get("data") or []:
            if isinstance(entry, dict) and entry.get("id") in (name, self.model) and entry.get("max_model_len"):
                return int(entry["max_model_len"])
        return None

    def _api_key(self, litellm: Any) -> str | None:
        cfg = self.config
        if cfg.api_key_env:
            key = os.environ.get(cfg.api_key_env)
            if not key:
                raise LLMError(
                    "auth",
                    f"environment variable {cfg.api_key_env} (api_key_env) is not set",
                    retryable=False,
                    sent_request=False,
                )
            return key
        # litellm would otherwise report a missing key as a retryable-looking 500.
        missing = (
            litellm.validate_environment(model=cfg.model, api_base=cfg.api_base).get("missing_keys") or []
        )
        if missing:
            raise LLMError(
                "auth",
                f"no credentials for {cfg.model}: set {', '.join(missing)} or config.api_key_env",
                retryable=False,
                sent_request=False,
            )
        return None

    def _kwargs(self, litellm: Any, messages: list[Message], response_format: dict[str, Any] | None) -> dict[str, Any]:
        cfg = self.config
        kwargs: dict[str, Any] = {
            "model": cfg.model,
            "messages": messages,
            "timeout": cfg.timeout_s,
            # Both off: litellm's wrapper retries (num_retries) and the OpenAI SDK's (max_retries,
            # default 2) would hide attempts from our count and stack on top of our backoff.
            "num_retries": 0,
            "max_retries": 0,
            # Lets one config carry e.g. reasoning_effort across models that do and do not take it.
            "drop_params": True,
        }
        if cfg.api_base:
            kwargs["api_base"] = cfg.api_base
        if (api_key := self._api_key(litellm)) is not None:
            kwargs["api_key"] = api_key
        for name in ("temperature", "reasoning_effort"):
            if (value := getattr(cfg, name)) is not None and name not in self.refused:
                kwargs[name] = value
        if cfg.max_tokens is not None:
            # Reasoning models take max_completion_tokens (their reasoning counts against it).
            kwargs["max_completion_tokens" if "max_tokens" in self.refused else "max_tokens"] = cfg.max_tokens
        if response_format is not None and "response_format" not in self.refused:
            kwargs["response_format"] = response_format
        if cfg.stream and "stream" not in self.refused and self.stream_off is None:
            kwargs["stream"] = True
            if "stream_options" not in self.refused:
                kwargs["stream_options"] = {"include_usage": True}
        return kwargs

    async def _attempt(self, messages: list[Message], response_format: dict[str, Any] | None, ledger: _Ledger
                       ) -> _Answer:
        litellm = self._litellm_module()
        cfg = self.config
        kwargs = self._kwargs(litellm, messages, response_format)
        sent = set(kwargs)
        stream = bool(kwargs.get("stream"))
        ledger.streamed = ledger.streamed or stream
        received = _Answer()
        async with self._semaphore:
            grant = None
            if self.limiter is not None:  # the endpoint's shared limit: wait for this request's slot
                prompt_estimate = sum(len(str(m.get("content") or "")) for m in messages) // 3
                grant = await take_slot(self.limiter, prompt_estimate, cfg.max_tokens)
            try:
                # A guard above litellm's own timeout, for provider paths that do not honour it.
                async with asyncio.timeout(cfg.timeout_s * 1.1 + 1.0):
                    response = await litellm.acompletion(**kwargs)
                    if not stream:
                        answer = _unpack(response)
                        await self._settle(grant, answer)
                        return answer
                    why = await _read_stream(response, received, usage_wanted="stream_options" in kwargs)
                    if why is None:
                        if received.prompt_tokens == 0 and received.completion_tokens == 0:
                            _estimate(received, messages)
                        await self._settle(grant, received)
                        return received
            except Exception as exc:  # the LLM boundary: every failure becomes a classified LLMError
                error = classify_error(exc, sent)
                if error.kind == "rate_limit" and self.limiter is not None:
                    await self.limiter.throttled(error.retry_after_s, grant.id if grant is not None else None)
                if error.kind == "client":
                    log.warning("unexpected LLM client failure", exc_info=exc)
                chunks = received.chunks
                if received.said:
                    # A stream cut part way: the provider bills what it generated; count it, estimated.
                    _estimate(received, messages)
                    ledger.add(received)
                    received = _Answer()
                if not (stream and chunks and error.kind in ("connection", "malformed_response")):
                    raise error from exc
                # The endpoint answered, then its stream broke: not an outage; asked again without streaming.
                why = (f"the stream ended before its finish reason ({chunks} chunks)" if "finish_reason" in str(error)
                       else f"the stream broke mid-reply ({clip_line(str(error), 160)})")
            # A streamed reply without an answer: what it billed is counted, and the same request goes once more
            # without streaming.
            if received.said:
                _estimate(received, messages)
            ledger.add(received)
            return await self._unstreamed(kwargs, ledger, why)

    async def _settle(self, grant: Any, answer: _Answer) -> None:
        """Tell the shared limit what the request used (its slot was reserved with an estimate)."""
        if grant is not None and self.limiter is not None:
            await self.limiter.settle(grant.id, answer.prompt_tokens, answer.completion_tokens)

    async def _unstreamed(self, kwargs: dict[str, Any], ledger: _Ledger, why: str) -> _Answer:
        """The request of a streamed reply that had no answer, sent again without streaming; when that answers,
        this endpoint is streamed to no more."""
        litellm = self._litellm_module()
        plain = {k: v for k, v in kwargs.items() if k not in ("stream", "stream_options")}
        ledger.stream_fallback = why
        ledger.extra_requests += 1
        try:
            async with asyncio.timeout(self.config.timeout_s * 1.1 + 1.0):
                answer = _unpack(await litellm.acompletion(**plain))
        except Exception as exc:  # the LLM boundary, as in _attempt
            raise classify_error(exc, set(plain)) from exc
        if not answer.said:
            raise LLMError("malformed_response", f"{why}; asked again without streaming, the reply was empty too",
                           retryable=False)
        if self.stream_off is None:
            log.warning("%s: %s; the same request without streaming answered: not streaming from now on",
                        self.model, why)
            self.stream_off = why
        return answer

    def _cost(self, prompt_tokens: int, completion_tokens: int) -> tuple[float, bool]:
        if self.config.price_per_mtok is not None:
            # The user's price wins: it is the one they budget with.
            per_in, per_out = self.config.price_per_mtok
            return (prompt_tokens * per_in + completion_tokens * per_out) / 1e6, True
        litellm = self._litellm_module()
        try:
            cost_in, cost_out = litellm.cost_per_token(model=self.model, prompt_tokens=prompt_tokens,
                                                       completion_tokens=completion_tokens)
            return float(cost_in) + float(cost_out), True
        except Exception:  # noqa: BLE001  (litellm raises for models it has no price for, of several types)
            # Local servers and new models have no price; count tokens, report the cost as unknown.
            return 0.0, False


@dataclass
class _Ledger:
    """Tokens of one call's attempts that did not give the answer (a cut stream), and what was dropped."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    estimated: bool = False
    streamed: bool = False
    dropped: set[str] = field(default_factory=set)
    stream_fallback: str | None = None  # why the call was asked again without streaming
    extra_requests: int = 0  # requests beyond the retry loop's count (the unstreamed one)

    def add(self, answer: _Answer) -> None:
        self.prompt_tokens += answer.prompt_tokens
        self.completion_tokens += answer.completion_tokens
        self.estimated = self.estimated or answer.estimated


async def _read_stream(response: Any, received: _Answer, *, usage_wanted: bool) -> str | None:
    """Read a streamed reply into `received`; None if it holds an answer, else why not. A stream is read up to
    its finish reason and the usage after it (a short grace for that), not necessarily to `[DONE]`."""
    chunks = response.__aiter__()
    try:
        while True:
            try:
                if received.finish_reason is None:
                    chunk = await anext(chunks)
                else:
                    chunk = await asyncio.wait_for(anext(chunks), FINISH_GRACE_S)
            except StopAsyncIteration:
                break
            except TimeoutError:  # the grace after the finish ran out: the server keeps the stream open
                break
            received.chunks += 1
            _add_chunk(received, chunk)
            if received.finish_reason is not None and (received.usage_seen or not usage_wanted):
                break
    finally:
        close = getattr(response, "aclose", None)
        if close is not None and received.finish_reason is not None:
            with contextlib.suppress(Exception):  # closing a stream we stopped reading; nothing to lose
                await close()
    headers = (getattr(response, "_hidden_params", None) or {}).get("additional_headers") or {}
    body = str(headers.get("llm_provider-content-type") or "").split(";")[0].strip()
    if not received.said and not ("event-stream" in body and received.finish_reason is not None):
        # (A real event stream that finished empty is the model's empty answer, read as such.)
        shape = f"a plain {body} body" if body and "event-stream" not in body else f"{received.chunks} chunks"
        return (f"a streaming request was answered without any content ({shape}, finish reason "
                f"{received.finish_reason})")
    if received.finish_reason is None:
        return f"the stream ended before its finish reason ({len(received.content) + len(received.reasoning)} characters)"
    return None


def _add_chunk(answer: _Answer, chunk: Any) -> None:
    usage = getattr(chunk, "usage", None)
    if usage is not None and getattr(usage, "prompt_tokens", None) is not None:
        answer.usage_seen = True
        answer.prompt_tokens = int(usage.prompt_tokens or 0)
        answer.completion_tokens = int(getattr(usage, "completion_tokens", 0) or 0)
    for choice in getattr(chunk, "choices", None) or []:
        delta = getattr(choice, "delta", None)
        if delta is not None:
            answer.content += getattr(delta, "content", None) or ""
            answer.reasoning += getattr(delta, "reasoning_content", None) or ""
            for call in getattr(delta, "tool_calls", None) or []:
                index = getattr(call, "index", 0) or 0
                while len(answer.tool_arguments) <= index:
                    answer.tool_arguments.append("")
                function = getattr(call, "function", None)
                answer.tool_arguments[index] += (getattr(function, "arguments", None) or "") if function else ""
        if getattr(choice, "finish_reason", None):
            answer.finish_reason = choice.finish_reason


def _estimate(answer: _Answer, messages: list[Message]) -> None:
    """Tokens of an answer whose usage never came (3 characters a token, as prompts are budgeted)."""
    prompt_chars = sum(len(str(m.get("content") or "")) for m in messages)
    answer.prompt_tokens = answer.prompt_tokens or prompt_chars // 3
    answer.completion_tokens = answer.completion_tokens or (
        len(answer.content) + len(answer.reasoning) + sum(len(a) for a in answer.tool_arguments)) // 3
    answer.estimated = True
