"""LLM access: one async call interface, a litellm implementation, a replay cache and a cost ledger.

This module is the one boundary where provider exceptions become data: a failed call ends as an
`LLMError` carrying a classified reason and the `LLMCall` record, so callers count failures
instead of crashing on them. litellm is imported lazily (it takes seconds) and only inside the
client, which is built inside the actor that uses it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

log = logging.getLogger(__name__)

Message = dict[str, Any]

ErrorKind = Literal[
    "rate_limit", "timeout", "connection", "server", "malformed_response", "auth", "bad_request", "client"
]


class LLMConfig(BaseModel):
    """Which model to call and how patiently. Resolved once and handed to every actor."""

    model_config = ConfigDict(frozen=True)

    model: str = Field(
        description="Any litellm model string, e.g. 'openai/gpt-5' or 'hosted_vllm/Qwen/Qwen3-32B'."
    )
    api_base: str | None = Field(
        default=None, description="Base URL of an OpenAI-compatible server (vLLM, SGLang, Ollama)."
    )
    api_key_env: str | None = Field(
        default=None,
        description="Name of the environment variable holding the key; None lets litellm use the provider's default variable.",
    )
    temperature: float | None = Field(
        default=None, description="None sends nothing: reasoning models reject most values."
    )
    max_tokens: int | None = Field(default=None, gt=0, description="None leaves the limit to the server.")
    reasoning_effort: str | None = Field(
        default=None,
        description="e.g. 'low' / 'medium' / 'high'; dropped by litellm where the model does not take it.",
    )
    timeout_s: float = Field(default=600.0, gt=0, description="Per attempt, not per call.")
    max_retries: int = Field(
        default=4, ge=0, description="Retries after the first attempt, for retryable errors only."
    )
    backoff_base_s: float = Field(
        default=2.0, ge=0, description="First retry waits about this long, then doubling."
    )
    backoff_max_s: float = Field(
        default=60.0, ge=0, description="Cap on one wait, including a server's Retry-After."
    )
    max_concurrency: int = Field(default=8, gt=0, description="Requests in flight at once from one client.")

    def reply_parameters(self) -> dict[str, Any]:
        """The parameters that change what the model says; they key the response cache."""
        return {
            "model": self.model,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
            "reasoning_effort": self.reasoning_effort,
        }


class LLMCall(BaseModel):
    """One logical LLM call (possibly several HTTP attempts, or none when served from the cache)."""

    kind: str = Field(description="Call kind, e.g. generate_from_spec; names the prompt template.")
    model: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = Field(
        default=0.0, description="What this call cost; 0 on a cache hit or for an unpriced model."
    )
    cost_known: bool = Field(
        default=False, description="False when litellm has no price for the model (local servers)."
    )
    original_cost_usd: float | None = Field(
        default=None, description="On a cache hit, what the recorded call cost when it was made."
    )
    latency_s: float = 0.0
    cached: bool = Field(default=False, description="Served from the response cache; no request was sent.")
    attempts: int = Field(
        default=0, description="HTTP requests sent for this call; attempts - 1 were retries."
    )
    error: str | None = Field(default=None, description="None on success, else one line: '<kind>: <reason>'.")
    finish_reason: str | None = Field(
        default=None, description="'length' means the reply was cut off by max_tokens."
    )
    request_hash: str = Field(description="sha256 of model, messages and reply parameters; the cache key.")
    sample: int = Field(
        default=0, description="Occurrence of this request_hash in the client's lifetime (cache slot)."
    )
    started_at: float = Field(default_factory=time.time, description="Unix time the call began.")


class LLMReply(BaseModel):
    text: str
    call: LLMCall


class LLMError(Exception):
    """A call that did not produce a reply. `call` is the record of it, already written to the ledger."""

    def __init__(
        self,
        kind: ErrorKind,
        message: str,
        *,
        retryable: bool,
        status_code: int | None = None,
        retry_after_s: float | None = None,
        sent_request: bool = True,
    ) -> None:
        self.kind = kind
        self.message = " ".join(message.split())[:300]  # one line, bounded: it lands in logs and records
        self.retryable = retryable
        self.status_code = status_code
        self.retry_after_s = retry_after_s
        self.sent_request = sent_request  # False for checks that fail before anything goes out
        self.attempts = 0  # requests sent for the whole call, set by the retry loop
        self.call: LLMCall | None = None
        super().__init__(f"{kind}: {self.message}")


class LLMClient(Protocol):
    async def complete(self, kind: str, messages: list[Message]) -> LLMReply: ...


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
# Response cache
# ---------------------------------------------------------------------------------------------


class CachedReply(BaseModel):
    request_hash: str
    sample: int
    model: str
    text: str
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    cost_known: bool
    finish_reason: str | None = None
    created_at: float = Field(default_factory=time.time)


def _atomic_write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class ResponseCache:
    """Replies on disk, keyed by request content and by occurrence.

    The n-th identical request made by one client maps to slot n. With temperature > 0, a search
    that asks the same question twice wants two samples, not one reply twice; and a replay that
    asks the same questions in the same order gets back exactly what the original run got.
    """

    def __init__(self, directory: Path | str) -> None:
        self.directory = Path(directory)
        self._occurrences: dict[str, int] = {}
        self._lock = threading.Lock()

    def claim(self, key: str) -> int:
        """Reserve the next sample slot for this request."""
        with self._lock:
            slot = self._occurrences.get(key, 0)
            self._occurrences[key] = slot + 1
            return slot

    def path(self, key: str, sample: int) -> Path:
        return self.directory / key[:2] / f"{key}-{sample}.json"

    def get(self, key: str, sample: int) -> CachedReply | None:
        path = self.path(key, sample)
        try:
            return CachedReply.model_validate_json(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except ValidationError as exc:
            # Writes are atomic, so this is a hand-edited or foreign file: ask again, overwrite it.
            log.warning("ignoring unreadable cache entry %s: %s", path, exc.errors()[0]["msg"])
            return None

    def put(self, entry: CachedReply) -> None:
        _atomic_write_text(self.path(entry.request_hash, entry.sample), entry.model_dump_json(indent=1))


# ---------------------------------------------------------------------------------------------
# Ledger
# ---------------------------------------------------------------------------------------------


class LedgerTotals(BaseModel):
    calls: int = 0
    cached_calls: int = 0
    failed_calls: int = 0
    attempts: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0

    def add(self, call: LLMCall) -> None:
        self.calls += 1
        self.cached_calls += call.cached
        self.failed_calls += call.error is not None
        self.attempts += call.attempts
        self.prompt_tokens += call.prompt_tokens
        self.completion_tokens += call.completion_tokens
        self.cost_usd += call.cost_usd


class Ledger:
    """Append-only JSONL of LLMCall records with running totals and a cost budget.

    Opening a ledger replays the existing file, so a resumed run keeps counting where the killed
    one stopped. Each line is fsynced: the ledger is what the budget is enforced from.
    """

    def __init__(self, path: Path | str, max_cost_usd: float | None = None) -> None:
        self.path = Path(path)
        self.max_cost_usd = max_cost_usd
        self.totals = LedgerTotals()
        self._lock = threading.Lock()
        self._replay()

    @classmethod
    def load(cls, path: Path | str, max_cost_usd: float | None = None) -> Ledger:
        return cls(path, max_cost_usd=max_cost_usd)

    def _replay(self) -> None:
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        complete, _, torn = data.rpartition(b"\n")
        if torn:
            # A kill mid-append leaves a partial last line; cut it so the next append starts clean.
            log.warning("ledger %s: dropping a torn last line (%d bytes)", self.path, len(torn))
            with open(self.path, "r+b") as f:
                f.truncate(len(complete) + 1 if complete else 0)
        for number, line in enumerate(complete.decode("utf-8").splitlines(), start=1):
            if line.strip():
                try:
                    self.totals.add(LLMCall.model_validate_json(line))
                except ValidationError as exc:
                    raise ValueError(f"ledger {self.path} line {number} is not an LLMCall: {exc}") from exc

    def record(self, call: LLMCall) -> None:
        line = call.model_dump_json() + "\n"
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(line)
                f.flush()
                os.fsync(f.fileno())
            self.totals.add(call)

    def over_budget(self) -> bool:
        return self.max_cost_usd is not None and self.totals.cost_usd >= self.max_cost_usd


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
        ledger: Ledger | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.config = config
        self.cache = cache
        self.ledger = ledger
        self._rng = rng or random.Random()
        self._semaphore = asyncio.Semaphore(config.max_concurrency)
        self._litellm: Any = None

    async def complete(self, kind: str, messages: list[Message]) -> LLMReply:
        key = request_hash(self.config.reply_parameters(), messages)
        sample = self.cache.claim(key) if self.cache else 0
        started = time.monotonic()
        base = LLMCall(kind=kind, model=self.config.model, request_hash=key, sample=sample)

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
            self._record(call)
            return LLMReply(text=hit.text, call=call)

        try:
            response, attempts = await self._attempt_with_retries(kind, messages)
        except LLMError as error:
            error.call = base.model_copy(
                update={
                    "attempts": error.attempts,
                    "error": str(error),
                    "latency_s": time.monotonic() - started,
                }
            )
            self._record(error.call)
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
                    model=self.config.model,
                    text=text,
                    prompt_tokens=prompt_tokens,
                    completion_tokens=completion_tokens,
                    cost_usd=cost_usd,
                    cost_known=cost_known,
                    finish_reason=finish_reason,
                )
            )
        self._record(call)
        return LLMReply(text=text, call=call)

    async def _attempt_with_retries(self, kind: str, messages: list[Message]) -> tuple[Any, int]:
        """(response, requests sent); the final LLMError carries the number of requests in `attempts`."""
        attempts = 0
        while True:
            attempts += 1
            try:
                return await self._attempt(messages), attempts
            except LLMError as error:
                error.attempts = attempts if error.sent_request else attempts - 1
                if not error.retryable or attempts > self.config.max_retries:
                    raise
                delay = self._backoff_s(attempts, error.retry_after_s)
                log.warning(
                    "%s attempt %d/%d failed (%s); retrying in %.2fs",
                    kind,
                    attempts,
                    self.config.max_retries + 1,
                    error,
                    delay,
                )
                await asyncio.sleep(delay)

    def _record(self, call: LLMCall) -> None:
        if self.ledger is not None:
            self.ledger.record(call)

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

    async def _attempt(self, messages: list[Message]) -> Any:
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
