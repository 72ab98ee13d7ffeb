"""A run's budget, counted from its event log: rounds (taken and spent), dollars, tokens, active wall time.

Rounds are spent by `candidate` events; a round taken and not yet recorded is outstanding, so two lanes
never take one number. With a wall budget the method stops early enough for the final re-timing to fit
(`confirm_estimate_s`, from this session's measurements).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from ksearch_ray.config import RunConfig
from ksearch_ray.events import RunView


class Budget:
    def __init__(self, config: RunConfig, view: RunView, gpu_of: Callable[[], list[str]]):
        self.config = config
        self.view = view
        self.gpu_of = gpu_of  # this session's evaluators' GPU names, by index
        self.outstanding: set[int] = set()  # rounds taken and not yet recorded as candidates
        self._round_lock = asyncio.Lock()
        self._lowest_free = 1  # no round below it is free (take_round's search starts there)

    def wall_s(self) -> float:
        """Active running time of the whole run: the log's, plus the time since its last event."""
        last = self.view.last_t
        return self.view.active_s + (max(0.0, time.time() - last) if last is not None else 0.0)

    def wall_left(self) -> float | None:
        b = self.config.budget.max_wall_s
        return None if b is None else b - self.wall_s()

    def left(self) -> str | None:
        """None while the budget lasts, else why it ran out. Spend is counted from the event log."""
        if self.view.rounds_used + len(self.outstanding) >= self.config.budget.rounds:
            return "rounds"
        return self.spend_left()

    def spend_left(self) -> str | None:
        """The budget without the rounds (a call that holds a round waits on these alone)."""
        b, v = self.config.budget, self.view
        if b.max_cost_usd is not None and v.llm_cost_usd >= b.max_cost_usd:
            return "cost"
        if b.max_llm_tokens is not None and v.llm_tokens >= b.max_llm_tokens:
            return "tokens"
        if b.max_wall_s is not None and self.wall_s() + self.confirm_reserve_s() >= b.max_wall_s:
            return "wall clock"
        return None

    def confirm_reserve_s(self) -> float:
        """The wall time the method leaves for the final re-timing when the run has a wall budget."""
        return self.confirm_estimate_s() if self.config.budget.max_wall_s is not None else 0.0

    def confirm_estimate_s(self) -> float:
        """The wall time the final re-timing will need, from this session's measurements, and room for
        one candidate in flight when the method stops (its evaluation and re-timing): the method's wall
        budget ends this much early, so the re-timing fits in the run's."""
        repeats = self.config.search.confirm_repeats
        if repeats <= 0:
            return 0.0
        gpu_of = self.gpu_of()
        seed = self.view.seed.solution_id if self.view.seed else None
        total = 0.0
        for gpu, best in self.view.best_by_gpu.items():
            if gpu not in gpu_of:
                continue
            base = self.view.session_baselines.get(gpu_of.index(gpu))
            kernels = {best.solution_id, seed} - {None}
            seconds = [r.seconds for k in kernels if (r := self.view.results.get(k or "")) is not None]
            total += repeats * ((base.seconds if base else 0.0) + sum(seconds)) + 2 * max(seconds, default=0.0)
        return total

    async def take_round(self) -> int | None:
        async with self._round_lock:
            if self.left():
                return None
            taken = self.view.round_numbers
            while self._lowest_free in taken or self._lowest_free in self.outstanding:
                self._lowest_free += 1
            number = self._lowest_free
            self.outstanding.add(number)
            return number

    def give_back_round(self, round_: int) -> None:
        """A round taken and not spent (the call failed for the provider's reasons): it goes back to the budget."""
        self.outstanding.discard(round_)
        self._lowest_free = min(self._lowest_free, round_)
