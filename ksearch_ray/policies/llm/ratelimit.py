"""One rate limit per LLM endpoint, shared by every planner and coder that calls it.

A provider limits requests and tokens per minute and answers a 429 (with a Retry-After) past them.
At a width of hundreds of cycles, clients that each find the limit by hitting it turn it into a storm
of 429s: every refused request is a wasted round trip and a retry that arrives with the next wave.
Instead, each request first takes a slot from the endpoint's one `RateBook`: the earliest moment at
which the limit admits it, given every request granted before it. The caller waits that long on its
own clock and then sends; the book only does arithmetic.

The book counts as a provider does: a sliding window (`window_s`, 60 s) holding at most
`requests` requests and `tokens` tokens, a request's tokens being its prompt and the completion it
may write (the estimate is corrected by `settle` once the reply says what it used). Slots are granted
in order (first come, first served), so a request never overtakes one that waits.

Learned limits: a 429 holds every caller until its Retry-After has passed (`throttled`); where no
request limit is set, the requests granted in the last window before a 429 become the limit (the
provider refused the next one; only from LEARN_MIN_REQUESTS up), so a run without settings stops finding the
limit over and over.

On Ray the book lives in one small actor per endpoint (`actors.limiter`), asked once per request,
never per token or chunk; in a single process it is called directly (`LocalLimiter`).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

DEFAULT_COMPLETION_TOKENS = 1_000
"""Tokens a reply is assumed to write before any reply has said (and when no max_tokens is set)."""
LEARN_MIN_REQUESTS = 10
"""A 429 teaches a request limit only when at least this many requests were admitted in the window before it: a
429 after a few requests says nothing of a limit (a learnt limit of 1 a minute would stall a run for good)."""
SLACK = 0.02
SLACK_MIN_S = 0.25
"""The window is kept this much longer than the provider's (a share of it, at least SLACK_MIN_S): a request
leaves a little after its slot and takes its flight time to arrive, and one granted at the edge of a window
must not land inside the provider's previous one."""


@dataclass
class Grant:
    """One request's slot: its id (for `settle`) and how long the caller waits before sending it; `late_s`:
    how late the caller may send it (the window's slack) before it must ask for a new slot."""

    id: int
    wait_s: float
    late_s: float = 0.0


@dataclass
class RateBook:
    """The sliding-window arithmetic of one endpoint's limits. Times are seconds on one clock (the caller's)."""

    requests: int | None = None
    """Requests per window; None: not limited (until a 429 teaches one)."""
    tokens: int | None = None
    """Tokens (prompt and completion) per window; None: not limited."""
    window_s: float = 60.0
    _granted: deque[list[float]] = field(default_factory=deque)  # [time, tokens, id], in time order
    _by_id: dict[int, list[float]] = field(default_factory=dict)
    _held_until: float = 0.0
    _next_id: int = 0
    completion_mean: float = DEFAULT_COMPLETION_TOKENS
    """Tokens replies wrote, on average (what a request without max_tokens is assumed to write)."""
    _replies: int = 0
    throttles: int = 0
    """429s reported to this book."""
    learned_requests: int | None = None
    """The request limit a 429 taught, when none was set."""

    def _slack(self) -> float:
        return max(self.window_s * SLACK, SLACK_MIN_S)

    def _window(self) -> float:
        return self.window_s + self._slack()

    def reserve(self, tokens: int, now: float) -> Grant:
        """The earliest moment, not before `now` nor before any earlier grant, at which the window admits a
        request of `tokens`; recorded as granted then."""
        w = self._window()
        t = max(now, self._held_until, self._granted[-1][0] if self._granted else now)
        while self._granted and self._granted[0][0] + w <= now:
            self._by_id.pop(int(self._granted.popleft()[2]), None)
        limit = self.requests if self.requests is not None else self.learned_requests
        if self.tokens is not None:
            tokens = min(tokens, self.tokens)  # a request larger than the window's tokens waits for an empty window
        entries = list(self._granted)
        while True:
            inside = [e for e in entries if e[0] + w > t]  # (t = e + w exactly leaves e out)
            moved = False
            if limit is not None and len(inside) >= limit:
                t = max(t, inside[len(inside) - limit][0] + w)
                moved = True
            used = sum(e[1] for e in inside if e[0] + w > t)
            if self.tokens is not None and used + tokens > self.tokens:
                # the earliest time enough of the window's tokens have left it
                need, freed = used + tokens - self.tokens, 0.0
                for e in inside:
                    if e[0] + w <= t:
                        continue
                    freed += e[1]
                    if freed >= need:
                        t = max(t, e[0] + w)
                        moved = True
                        break
            if not moved:
                break
        self._next_id += 1
        entry = [t, float(tokens), float(self._next_id)]
        self._granted.append(entry)
        self._by_id[self._next_id] = entry
        return Grant(self._next_id, max(0.0, t - now), self._slack())

    def settle(self, grant_id: int, tokens: int, completion_tokens: int | None = None) -> None:
        """What the request used, once its reply said: the grant's tokens are corrected."""
        entry = self._by_id.get(grant_id)
        if entry is not None:
            entry[1] = float(tokens)
        if completion_tokens is not None:
            self._replies += 1
            self.completion_mean += (completion_tokens - self.completion_mean) / min(self._replies, 50)

    def cancel(self, grant_id: int) -> None:
        """A grant its caller did not use in time (its process stalled past its slot): it frees its slot."""
        entry = self._by_id.pop(grant_id, None)
        if entry is not None:
            self._granted.remove(entry)

    def throttled(self, retry_after_s: float | None, now: float, grant_id: int | None = None) -> None:
        """The provider answered a 429 to the request of `grant_id`: it used nothing of the window; nobody sends
        before the Retry-After (a second without one); with no request limit set, the requests the provider
        admitted in the last window become the limit."""
        self.throttles += 1
        refused = self._by_id.pop(grant_id, None) if grant_id is not None else None
        if refused is not None:
            self._granted.remove(refused)
        self._held_until = max(self._held_until, now + (retry_after_s if retry_after_s is not None else 1.0))
        if self.requests is None:
            # What the provider had admitted when it refused: the grants of the window that ended at the refused
            # request's slot (those refused too are taken out as their 429s arrive: the least count is the limit).
            at = refused[0] if refused is not None else now
            admitted = sum(1 for e in self._granted if at - self._window() < e[0] <= at)
            if admitted >= LEARN_MIN_REQUESTS:  # fewer: a passing 429 (a burst, another tenant), waited out only
                self.learned_requests = admitted if self.learned_requests is None else min(self.learned_requests,
                                                                                           admitted)

    def completion_estimate(self, max_tokens: int | None) -> int:
        return max_tokens if max_tokens is not None else int(self.completion_mean)


class Limiter(Protocol):
    """What an LLM client asks before each request it sends, and tells after."""

    async def reserve(self, prompt_tokens: int, max_tokens: int | None) -> Grant: ...

    async def settle(self, grant_id: int, prompt_tokens: int, completion_tokens: int) -> None: ...

    async def cancel(self, grant_id: int) -> None: ...

    async def throttled(self, retry_after_s: float | None, grant_id: int | None) -> None: ...


class LocalLimiter:
    """The book in this process (one run without Ray: its planner and coder share it)."""

    def __init__(self, book: RateBook, clock: object = time.monotonic):
        self.book = book
        self.clock = clock

    def _now(self) -> float:
        return float(self.clock())  # type: ignore[operator]

    async def reserve(self, prompt_tokens: int, max_tokens: int | None) -> Grant:
        return self.book.reserve(prompt_tokens + self.book.completion_estimate(max_tokens), self._now())

    async def settle(self, grant_id: int, prompt_tokens: int, completion_tokens: int) -> None:
        self.book.settle(grant_id, prompt_tokens + completion_tokens, completion_tokens)

    async def cancel(self, grant_id: int) -> None:
        self.book.cancel(grant_id)

    async def throttled(self, retry_after_s: float | None, grant_id: int | None) -> None:
        self.book.throttled(retry_after_s, self._now(), grant_id)


def endpoint_key(model: str, api_base: str | None) -> str:
    """The one book per endpoint: the provider's limit is per key and model, so per (model, api base)."""
    return hashlib.sha256(f"{model}|{api_base or ''}".encode()).hexdigest()[:16]


async def take_slot(limiter: Limiter, prompt_tokens: int, max_tokens: int | None) -> Grant:
    """Reserve a slot and wait for it. A caller that wakes later than the slot's slack (its event loop was busy:
    a first call's imports, a stalled process) gives the slot back and asks again, rather than send beside the
    next slot's requests."""
    loop = asyncio.get_running_loop()
    while True:
        grant = await limiter.reserve(prompt_tokens, max_tokens)
        due = loop.time() + grant.wait_s
        if grant.wait_s > 0:
            await asyncio.sleep(grant.wait_s)
        if loop.time() - due <= grant.late_s:
            return grant
        await limiter.cancel(grant.id)
