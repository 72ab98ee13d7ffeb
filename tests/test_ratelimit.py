"""The shared provider limit: the rate book's arithmetic, and many clients against one limited provider
(the stand-in, over litellm's real HTTP), with and without the limit they share."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from ksearch_ray.config import LLMConfig
from ksearch_ray.policies.llm.litellm_client import LiteLLMClient
from ksearch_ray.policies.llm.ratelimit import SLACK, LocalLimiter, RateBook
from ksearch_ray.policies.llm_call import LLMError
from ksearch_ray.policies.standin.habits import Habits
from ksearch_ray.policies.standin.server import StandIn

WINDOW = 60 * (1 + SLACK)  # (60 s: the share is more than SLACK_MIN_S)


def in_any_window(times: list[float], window: float) -> int:
    times = sorted(times)
    return max((sum(1 for u in times if t <= u < t + window) for t in times), default=0)


def test_grants_never_put_more_requests_in_a_window_than_the_limit() -> None:
    book = RateBook(requests=10, window_s=60)
    rng = random.Random(1)
    now, starts = 0.0, []
    for _ in range(95):
        now += rng.uniform(0, 3)
        grant = book.reserve(100, now)
        starts.append(now + grant.wait_s)
    assert in_any_window(starts, 60.0) <= 10
    assert starts == sorted(starts)  # first come, first served
    assert max(starts) == pytest.approx(9 * WINDOW, abs=WINDOW)  # and no slower than the limit allows


def test_tokens_limit_spaces_large_requests() -> None:
    book = RateBook(tokens=1000, window_s=60)
    waits = [book.reserve(400, 0.0).wait_s for _ in range(5)]
    assert waits[:2] == [0.0, 0.0]
    assert waits[2] == pytest.approx(WINDOW)  # the third does not fit beside two of 400
    assert waits[4] == pytest.approx(2 * WINDOW)


def test_settle_corrects_a_grants_tokens() -> None:
    book = RateBook(tokens=1000, window_s=60)
    first = book.reserve(900, 0.0)
    book.settle(first.id, 100, 50)
    assert book.reserve(800, 1.0).wait_s == 0.0  # the first used 100, not the 900 it reserved


def test_a_429_holds_every_caller_and_teaches_the_request_limit() -> None:
    book = RateBook(window_s=60)
    grants = [book.reserve(10, i * 0.1) for i in range(13)]
    assert all(g.wait_s == 0.0 for g in grants)
    book.throttled(5.0, 2.0, grants[-1].id)  # the 13th was refused: the provider admits 12 a window
    assert book.learned_requests == 12
    assert book.reserve(10, 2.0).wait_s == pytest.approx(WINDOW - 2.0)  # the first of the twelve must leave first

    few = RateBook(window_s=60)
    grants = [few.reserve(10, 0.0) for _ in range(3)]
    few.throttled(1.0, 0.5, grants[-1].id)
    assert few.learned_requests is None  # a 429 after 2 requests: waited out, no limit of 2 a minute learnt

    held = RateBook(requests=100, window_s=60)
    held.throttled(5.0, 1.0)
    assert held.learned_requests is None  # a limit that was set is kept
    assert held.reserve(10, 2.0).wait_s == pytest.approx(4.0)  # nobody sends before the Retry-After


PROMPT = [{"role": "user", "content": "Write the kernel.\nA tunable: BLOCK = 64"}]


def provider(requests: int, window_s: float) -> StandIn:
    return StandIn(habits=Habits(other_shape=0, prose_only=0, broken_json=0, rate_limit_every=0,
                                 latency_s=(0.05, 0.1), requests_per_min=requests, limit_window_s=window_s))


def clients(server: StandIn, n: int, limiter: Any, **settings: Any) -> list[LiteLLMClient]:
    config = LLMConfig(model="hosted_vllm/standin", api_base=server.api_base, stream=False, timeout_s=10,
                       max_retries=8, backoff_base_s=0.05, backoff_max_s=2.0, **settings)
    return [LiteLLMClient(config, limiter=limiter, rng=random.Random(i)) for i in range(n)]


def warm_up() -> None:
    """litellm's first call in a process blocks its event loop for a while (imports, clients): after a slot's
    wait, so the requests of one slot would leave late, beside the next slot's. Once per process; the
    tests measure the steady state."""
    with StandIn(habits=Habits(rate_limit_every=0)) as server:
        asyncio.run(clients(server, 1, None)[0].complete("code", PROMPT))


async def storm(many: list[LiteLLMClient], calls_each: int) -> list[Any]:
    async def one(client: LiteLLMClient, i: int) -> Any:
        messages = [{"role": "user", "content": f"{PROMPT[0]['content']}\ncall {i}"}]
        try:
            return (await client.complete("code", messages)).call
        except LLMError as error:
            return error.call
    return await asyncio.gather(*(one(c, i) for c in many for i in range(calls_each)))


def test_clients_sharing_one_limit_get_no_429s_where_unshared_ones_storm() -> None:
    """Four clients (as four coder actors) send 24 requests at once to a provider that admits 6 a window
    (1 s here): through one shared book they are paced below the limit; each on its own they hit it."""
    warm_up()
    with provider(6, 1.0) as server:
        window = 1.0
        shared = LocalLimiter(RateBook(requests=6, window_s=window))
        calls = asyncio.run(storm(clients(server, 4, shared, limit_window_s=window), 6))
        assert all(c.error is None for c in calls)
        assert server.throttled == 0
        assert sum(c.attempts for c in calls) == 24

    with provider(6, 1.0) as server:
        calls = asyncio.run(storm(clients(server, 4, None), 6))
        assert server.throttled > 0  # what the shared limit prevents
        assert sum(c.attempts for c in calls) > 24


def test_clients_without_settings_learn_the_limit_from_the_first_429s() -> None:
    """The first storm finds the limit by hitting it; the same clients' second storm is paced by what they learnt."""
    warm_up()
    # A window of 2 s: requests that leave late (a loaded machine) shift what the book counts by less of it.
    with provider(12, 2.0) as server:
        book = RateBook(window_s=2.0)
        many = clients(server, 4, LocalLimiter(book), limit_window_s=2.0)
        first = asyncio.run(storm(many, 8))
        assert all(c.error is None for c in first)
        assert server.throttled > 0
        # The limit learnt is what the book had granted in the window that ended at a refusal: 12 where requests
        # leave when granted; on a loaded machine some leave late, and it counts more (29 of 32 once, two
        # workers on two cores). Below the storm's 32 either way, and the second storm is paced by it.
        assert book.learned_requests is not None and book.learned_requests < 32
        learnt_with = server.throttled
        second = asyncio.run(storm(many, 8))
        assert all(c.error is None for c in second)
        assert server.throttled - learnt_with < learnt_with
