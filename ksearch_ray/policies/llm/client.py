"""LLM access: one async call interface, a litellm implementation, and a replay cache.

This module is the one boundary where provider exceptions become data: a failed call ends as an
`LLMError` carrying a classified reason and the `LLMCall` record, so callers count failures
instead of crashing on them. litellm is imported lazily (it takes seconds) and only inside the
client, which is built inside the actor that uses it.

Retries follow tenacity's policy (exponential backoff with jitter, a server's Retry-After
honoured up to the cap), with litellm's and the OpenAI SDK's own retries off so that every HTTP
request is counted once, in `LLMCall.attempts`. The call interface lives in `llm.types` and the
response cache in `llm.store`; every public name of those is importable from here too.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import random
import time
from collections.abc import Iterator
from typing import Any

import tenacity

from ksearch_ray.policies.llm.store import CachedReply, ResponseCache
from ksearch_ray.policies.llm.types import (
    ErrorKind,
    LLMCall,
    LLMClient,
    LLMConfig,
    LLMError,
    LLMReply,
    Message,
)

__all__ = [
    "CachedReply",
    "ErrorKind",
    "LLMCall",
    "LLMClient",
    "LLMConfig",
    "LLMError",
    "LLMReply",
    "LiteLLMClient",
    "Message",
    "ResponseCache",
    "classify_error",
    "request_hash",
]

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


def _cause_chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _retry_after_s(chain: list[BaseException]) -> float | None:
    for exc in chain:
        headers = getattr(getattr(exc, "response", None), "headers", None)
        if headers is None:
            continue
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


def classify_error(exc: BaseException) -> LLMError:
    """Turn whatever litellm raised into an LLMError with an honest retryable flag.

    litellm reports every failure as one of its own exception classes, but their status codes do
    not always mean an HTTP status: a refused connection, an unparseable body and a missing API
    key all arrive as InternalServerError(500). So the cause chain decides: a real HTTP response
    shows up as httpx.HTTPStatusError in it.
    """
    import httpx
    import openai

    chain = list(_cause_chain(exc))
    top = f"{type(exc).__name__}: {exc}"

    def has(*types: type[BaseException]) -> bool:
        return any(isinstance(e, types) for e in chain)

    # Timeouts first: openai's timeout error is a subclass of its connection error.
    if has(openai.APITimeoutError, httpx.TimeoutException, TimeoutError):
        return LLMError("timeout", top, retryable=True, status_code=408)
    if has(openai.APIConnectionError, httpx.TransportError, ConnectionError):
        return LLMError("connection", top, retryable=True)

    if any(type(e).__name__ == "ContextWindowExceededError" for e in chain):
        return LLMError("context_window", top, retryable=False, status_code=400)
    http_status = next((e.response.status_code for e in chain if isinstance(e, httpx.HTTPStatusError)), None)
    if http_status == 429:
        return LLMError(
            "rate_limit", top, retryable=True, status_code=429, retry_after_s=_retry_after_s(chain)
        )
    if http_status is not None and (http_status in (408, 409) or http_status >= 500):
        return LLMError(
            "server", top, retryable=True, status_code=http_status, retry_after_s=_retry_after_s(chain)
        )
    if http_status in (401, 403):
        return LLMError("auth", top, retryable=False, status_code=http_status)
    if http_status is not None:
        return LLMError("bad_request", top, retryable=False, status_code=http_status)
    if has(json.JSONDecodeError):
        # A 200 whose body does not parse: a proxy or server hiccup, worth another try.
        return LLMError("malformed_response", top, retryable=True)
    # Raised without an HTTP exchange (bad parameters, missing credentials, unknown provider):
    # retrying cannot help.
    status = getattr(exc, "status_code", None)
    return LLMError("client", top, retryable=False, status_code=status if isinstance(status, int) else None)


# ---------------------------------------------------------------------------------------------
# The litellm client
# ---------------------------------------------------------------------------------------------


def _import_litellm() -> Any:
    # Without this, importing litellm fetches the price map from GitHub (and stalls offline).
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    litellm.suppress_debug_info = True  # otherwise every exception also prints a banner to stdout
    return litellm


class LiteLLMClient:
    """LLMClient over litellm.acompletion, with our own retries so the attempt count is honest."""

    def __init__(
        self,
        config: LLMConfig,
        *,
        cache: ResponseCache | None = None,
        rng: random.Random | None = None,
    ) -> None:
        if config.model is None:
            raise ValueError("an LLM client needs a model")
        self.model: str = config.model
        self.config = config
        self.cache = cache
        self._rng = rng or random.Random()
        self._semaphore = asyncio.Semaphore(config.concurrency)
        self._litellm: Any = None

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

        try:
            response, attempts = await self._attempt_with_retries(kind, messages, response_format)
        except LLMError as error:
            error.call = base.model_copy(
                update={
                    "attempts": error.attempts,
                    "error": str(error),
                    "error_kind": error.kind,
                    "latency_s": time.monotonic() - started,
                }
            )
            raise

        text, finish_reason, prompt_tokens, completion_tokens = _unpack(response)
        cost_usd, cost_known = self._cost(response)
        call = base.model_copy(
            update={
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "cost_usd": cost_usd,
                "cost_known": cost_known,
                "finish_reason": finish_reason,
                "attempts": attempts,
                "latency_s": time.monotonic() - started,
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
                    finish_reason=finish_reason,
                )
            )
        return LLMReply(text=text, call=call)

    async def _attempt_with_retries(self, kind: str, messages: list[Message], response_format: dict[str, Any] | None
                                    ) -> tuple[Any, int]:
        """(response, requests sent); the final LLMError carries the number of requests in `attempts`."""
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
                    sent += 1
                    try:
                        response = await self._attempt(messages, response_format)
                    except LLMError as error:
                        if not error.sent_request:
                            sent -= 1
                        raise
            return response, sent
        except LLMError as error:
            error.attempts = sent
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

    async def _attempt(self, messages: list[Message], response_format: dict[str, Any] | None = None) -> Any:
        litellm = self._litellm_module()
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
        for name in ("temperature", "max_tokens", "reasoning_effort"):
            if (value := getattr(cfg, name)) is not None:
                kwargs[name] = value
        if response_format is not None:
            kwargs["response_format"] = response_format

        async with self._semaphore:
            try:
                # A guard above litellm's own timeout, for provider paths that do not honour it.
                async with asyncio.timeout(cfg.timeout_s * 1.1 + 1.0):
                    return await litellm.acompletion(**kwargs)
            except Exception as exc:  # the LLM boundary: every failure becomes a classified LLMError
                error = classify_error(exc)
                if error.kind == "client":
                    log.warning("unexpected LLM client failure", exc_info=exc)
                raise error from exc

    def _cost(self, response: Any) -> tuple[float, bool]:
        litellm = self._litellm_module()
        if self.config.price_per_mtok is not None:
            # The user's price wins: it is the one they budget with.
            _, _, prompt_tokens, completion_tokens = _unpack(response)
            per_in, per_out = self.config.price_per_mtok
            return (prompt_tokens * per_in + completion_tokens * per_out) / 1e6, True
        try:
            return float(litellm.completion_cost(completion_response=response)), True
        except litellm.exceptions.ModelNotMappedError:
            # Local servers and new models have no price; count tokens, report the cost as unknown.
            return 0.0, False


def _unpack(response: Any) -> tuple[str, str | None, int, int]:
    choice = response.choices[0]
    text = choice.message.content or ""
    usage = getattr(response, "usage", None)
    prompt_tokens = int(getattr(usage, "prompt_tokens", 0) or 0)
    completion_tokens = int(getattr(usage, "completion_tokens", 0) or 0)
    return text, choice.finish_reason, prompt_tokens, completion_tokens
