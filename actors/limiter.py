"""LimiterActor: the rate book of one LLM endpoint (`policies.llm.ratelimit`), shared by every planner and
coder actor of the cluster that calls it. Asked once per request; the callers wait on their own clocks."""

from __future__ import annotations

import time
from typing import Any

import ray

from ksearch_ray.policies.llm.ratelimit import Grant, RateBook, endpoint_key

NAMESPACE = "ksearch-llm-limits"


@ray.remote(num_cpus=0)
class LimiterActor:
    """Each method is a few arithmetic steps on one book: the actor serialises them (max_concurrency 1)."""

    def __init__(self, requests: int | None, tokens: int | None, window_s: float):
        self.book = RateBook(requests=requests, tokens=tokens, window_s=window_s)
        self.calls = 0

    def reserve(self, tokens: int, max_tokens: int | None) -> Grant:
        self.calls += 1
        return self.book.reserve(tokens + self.book.completion_estimate(max_tokens), time.monotonic())

    def settle(self, grant_id: int, prompt_tokens: int, completion_tokens: int) -> None:
        self.book.settle(grant_id, prompt_tokens + completion_tokens, completion_tokens)

    def cancel(self, grant_id: int) -> None:
        self.book.cancel(grant_id)

    def throttled(self, retry_after_s: float | None, grant_id: int | None) -> None:
        self.book.throttled(retry_after_s, time.monotonic(), grant_id)

    def stats(self) -> dict[str, Any]:
        return {"reserves": self.calls, "throttles": self.book.throttles, "learned_requests": self.book.learned_requests,
                "requests": self.book.requests, "tokens": self.book.tokens}


def limiter_actor(model: str, api_base: str | None, requests: int | None, tokens: int | None, window_s: float,
                  **options: Any) -> Any:
    """The endpoint's LimiterActor, created by the driver (so it lives as long as the driver, not as long as
    one policy actor) and named after the endpoint, so that every run of this driver that calls the same model
    at the same address shares it (the first creates it, with its settings)."""
    return LimiterActor.options(  # type: ignore[attr-defined]
        name=f"limit-{endpoint_key(model, api_base)}", namespace=NAMESPACE, get_if_exists=True, **options,
    ).remote(requests, tokens, window_s)


class RayLimiter:
    """A planner's or coder's handle on its endpoint's LimiterActor (`policies.llm.ratelimit.Limiter`)."""

    def __init__(self, actor: Any):
        self.actor = actor

    async def reserve(self, prompt_tokens: int, max_tokens: int | None) -> Grant:
        grant: Grant = await self.actor.reserve.remote(prompt_tokens, max_tokens)
        return grant

    async def settle(self, grant_id: int, prompt_tokens: int, completion_tokens: int) -> None:
        await self.actor.settle.remote(grant_id, prompt_tokens, completion_tokens)

    async def cancel(self, grant_id: int) -> None:
        await self.actor.cancel.remote(grant_id)

    async def throttled(self, retry_after_s: float | None, grant_id: int | None) -> None:
        await self.actor.throttled.remote(retry_after_s, grant_id)
