"""The LLM call interface: model config, the per-call record, replies, errors and the client protocol.

Split out of `ksearch_ray.llm.client`, which re-exports every name here; the cache and ledger
(`ksearch_ray.llm.store`) and the litellm client (`ksearch_ray.llm.client`) both build on it.
"""

from __future__ import annotations

import time
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

Message = dict[str, Any]

ErrorKind = Literal[
    "rate_limit", "timeout", "connection", "server", "malformed_response", "auth", "bad_request", "client",
    "context_window", "unsupported",
]
FATAL_ERROR_KINDS: frozenset[str] = frozenset({"auth", "bad_request", "client"})
"""Failures no retry and no other prompt can fix (a rejected key, an unknown model, a request the
provider refuses): a search stops on them, loudly, instead of burning its budget on failures.
A prompt too long for the model's context is not among them: the next prompt may fit."""


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
    structured_output: Literal["auto", "on", "off"] = Field(
        default="auto", description="JSON-schema replies for planner calls: auto = where litellm says the model supports them."
    )
    planner_reasks: int = Field(default=1, ge=0, description="Re-asks of a planner reply that cannot be used.")
    price_per_mtok: tuple[float, float] | None = Field(
        default=None, description="USD per million prompt / completion tokens where litellm knows no price."
    )

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
        self.message = " ".join(message.split())[:300]  # one line, bounded: it lands in logs and records
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
