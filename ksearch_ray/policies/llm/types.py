"""The LLM call interface: the per-call record, replies, errors and the client protocol (the model's
settings are the run configuration's `llm` section, `config.LLMConfig`).

Split out of `ksearch_ray.policies.llm.client`, which re-exports every name here; the cache and ledger
(`ksearch_ray.policies.llm.store`) and the litellm client (`ksearch_ray.policies.llm.client`) both build on it.
"""

from __future__ import annotations

import time
from typing import Any, Literal, Protocol

from pydantic import BaseModel, Field

from ksearch_ray.config import LLMConfig
from ksearch_ray.text import clip

__all__ = ["LLMConfig"]  # the run configuration's llm section

Message = dict[str, Any]

ErrorKind = Literal[
    "rate_limit", "timeout", "connection", "server", "malformed_response", "auth", "bad_request", "client",
    "context_window", "unsupported",
]
FATAL_ERROR_KINDS: frozenset[str] = frozenset({"auth", "bad_request", "client"})
"""Failures no retry and no other prompt can fix (a rejected key, an unknown model, a request the
provider refuses): a search stops on them, loudly, instead of burning its budget on failures.
A prompt too long for the model's context is not among them: the next prompt may fit."""


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
