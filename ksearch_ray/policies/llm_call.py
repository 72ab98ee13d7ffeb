"""The LLM call interface: the per-call record, replies, errors and the client protocol (the model's
settings are the run configuration's `llm` section, `config.LLMConfig`). A contract, like `contract.py`:
the run's events and services read these records without depending on the LLM implementation (`llm/`).

The cache and ledger (`ksearch_ray.policies.llm.reply_cache`) and the litellm client
(`ksearch_ray.policies.llm.litellm_client`) both build on it; import these names from here.
"""

from __future__ import annotations

import time
from typing import Any, Literal, Protocol

from pydantic import BaseModel, Field

from ksearch_ray.text import clip

Message = dict[str, Any]

ErrorKind = Literal[
    # the provider unreachable or overloaded, which passes: the call is retried, and no round is spent on it
    "rate_limit", "timeout", "connection", "server",
    # a reply that arrived and cannot be used (a body that does not parse, a stream with no answer even when
    # asked again without streaming): a failed call, never an outage
    "malformed_response",
    # reasons that never clear: the run stops at once
    "auth", "not_found", "quota", "client",
    # this request refused: one failed call, the run goes on
    "bad_request", "content_policy", "context_window", "unsupported_param", "unsupported",
]
TRANSIENT_ERROR_KINDS: frozenset[str] = frozenset({"rate_limit", "timeout", "connection", "server"})
"""The provider unreachable (a refused or cut connection, a timeout, a 5xx, a 429, an "overloaded"): an outage,
which passes; the call is retried, within the outage allowance, and spends no round."""
UNUSABLE_ERROR_KINDS: frozenset[str] = frozenset({"malformed_response"})
"""The provider answered, in a way that cannot be read: the call failed (a round without code, for the coder),
and the provider is not counted as down."""
FATAL_ERROR_KINDS: frozenset[str] = frozenset({"auth", "not_found", "quota", "client"})
"""Failures no retry can fix (a rejected key, an unknown model, an exhausted quota, a request litellm
cannot even send): a search stops on them, loudly, instead of burning its budget on failures."""
ErrorClass = Literal["transient", "fatal", "rejected", "unusable"]


def error_class(kind: str | None) -> ErrorClass | None:
    """transient (wait and retry), fatal (stop the run), rejected (this request: asked again, then one failed
    call) or unusable (a reply that cannot be read: one failed call at once)."""
    if kind is None:
        return None
    if kind in TRANSIENT_ERROR_KINDS:
        return "transient"
    if kind in UNUSABLE_ERROR_KINDS:
        return "unusable"
    if kind in FATAL_ERROR_KINDS:
        return "fatal"
    return "rejected"


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
    error_kind: str | None = Field(default=None, description="The ErrorKind of a failed call.")
    retry_after_s: float | None = Field(default=None, description="A failed call's Retry-After, as the server said it.")
    dropped_params: list[str] = Field(
        default_factory=list, description="Parameters the model refused during this call: dropped for it from now on "
        "(max_tokens renamed max_completion_tokens).")
    tokens_estimated: bool = Field(
        default=False, description="Some tokens are estimated (3 characters a token): a stream cut before its usage.")
    streamed: bool = False
    stream_fallback: str | None = Field(
        default=None, description="Why this call was asked again without streaming (a streamed reply without an "
        "answer: a plain JSON body, no content delta, a stream that ended or broke before its finish); the client "
        "streams no more from then on.")
    reasoning_chars: int = Field(default=0, description="Characters of reasoning the model returned beside its answer.")
    answer_from: Literal["content", "reasoning", "tool_call"] = Field(
        default="content", description="Where the reply's text was found: the content, the reasoning (content was "
        "empty) or a tool call's arguments.")
    finish_reason: str | None = Field(
        default=None, description="'length' means the reply was cut off by max_tokens."
    )
    request_hash: str = Field(description="sha256 of model, messages and reply parameters; the cache key.")
    sample: int = Field(
        default=0, description="Occurrence of this request_hash in the client's lifetime (cache slot)."
    )
    started_at: float = Field(default_factory=time.time, description="Unix time the call began.")


def fatal_error(call: LLMCall) -> bool:
    return call.error_kind in FATAL_ERROR_KINDS


def transient_error(call: LLMCall) -> bool:
    return call.error_kind in TRANSIENT_ERROR_KINDS


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
        param: str | None = None,
    ) -> None:
        self.kind = kind
        self.param = param  # unsupported_param: the parameter the model refused
        self.message = clip(message, 300)  # one line, bounded: it lands in logs and records
        self.retryable = retryable
        self.status_code = status_code
        self.retry_after_s = retry_after_s
        self.sent_request = sent_request  # False for checks that fail before anything goes out
        self.attempts = 0  # requests sent for the whole call, set by the retry loop
        self.call: LLMCall | None = None
        super().__init__(f"{kind}: {self.message}")


class LLMClient(Protocol):
    async def complete(self, kind: str, messages: list[Message], *, response_format: dict[str, Any] | None = None
                       ) -> LLMReply: ...

    def context_tokens(self) -> int | None:
        """The model's context window in tokens, where it can be known (litellm's model map, the server)."""
        ...
