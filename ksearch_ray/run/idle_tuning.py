"""Idle tuning (`search.tune_when_idle`): evaluators that would otherwise idle tune the fastest passed candidates.

A search's GPUs wait on the LLM: a reply takes tens of seconds, an evaluation a few, and a wide search's candidates
come in bursts. `--autotune N` spends a fixed N evaluations on every passed candidate, in the cycle's own time;
idle tuning spends exactly the evaluator time nobody else wants, and none of the cycles' time:

* **Only spare evaluators.** An evaluator is lent only when it is free and no evaluation waits for one
  (`run.backends.IdleEvaluators`): tuning never queues ahead of a candidate, and delays one by at most the variant
  that was being measured when it came. A CUDA/C++ variant is built on the build pool first, holding no GPU.
* **Climbs.** Each passed candidate that declares tunables (`taskspec/tunables.py`) starts a climb at its values,
  the fastest `CLIMBS_PER_EVALUATOR` per evaluator kept. A free evaluator measures the untried point nearest to the
  fastest climb's point: its neighbours first (one tunable one choice up or down: `methods.tuner.neighbours`), then
  theirs, outward, so a climb stuck on a local optimum goes on looking farther while evaluators would idle. A
  variant faster than its climb's point by more than the measured noise moves the climb there; a climb ends when its
  grid is tried. With `--autotune` the climb starts where the tuner left the candidate.
* **What it records.** Each variant is a `tune` event with `idle: true`: an evaluation, not a round. It changes no
  attempt and no world-model node (the method has moved on); a variant that moves its climb is offered as a best
  (`Evaluations.note_best`: beyond the best's noise, then re-timed), and the run's best reaches the world model
  as every best does. The live view lets go of each variant's result once it is settled.
* **When.** While the method runs and the budget other than rounds lasts (a wall budget ends it as it ends the
  method). At the end it takes no evaluator and waits for the variants being measured (one evaluation each).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ksearch_ray.events import Evaluation, Event, Tune, Tuned
from ksearch_ray.methods.context import RunRecord
from ksearch_ray.methods.tuner import neighbours, tunable_values, variant
from ksearch_ray.models import EvalResult, Solution
from ksearch_ray.run.backends import BUILDER
from ksearch_ray.run.errors import SearchError
from ksearch_ray.run.evaluations import Evaluations
from ksearch_ray.text import clip

CLIMBS_PER_EVALUATOR = 2
"""Climbs kept per evaluator (at least 16 in all): the fastest passed candidates' (a slower one is let go)."""


def _key(values: dict[str, Any]) -> str:
    return repr(sorted(values.items()))


def _nearest_first(solution: Solution, point: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every other point of the tunables' grid, nearest to `point` first: its neighbours (one tunable one choice up or
    down: `methods.tuner.neighbours`), then theirs, outward until the grid is covered."""
    seen, layer = {_key(point)}, [point]
    while layer:
        outer = []
        for inner in layer:
            for values in neighbours(solution, inner):
                if _key(values) not in seen:
                    seen.add(_key(values))
                    outer.append(values)
                    yield values
        layer = outer


@dataclass(eq=False)
class Climb:
    solution: Solution
    """The passed candidate tuned from; its declared values are `start`."""
    start: dict[str, Any]
    point: dict[str, Any]
    """The fastest values found so far."""
    speedup: float
    """The point's speedup."""
    round: int
    node: str | None
    method: str | None
    tried: set[str] = field(default_factory=set)
    measuring: int = 0
    order: Iterator[dict[str, Any]] | None = None
    """The grid from `point` outward (`_nearest_first`), where the last pick left it; anew when the point moves."""


@dataclass
class _Ready:
    climb: Climb
    values: dict[str, Any]
    solution: Solution
    prepared: Any


class IdleTuning:
    def __init__(self, run: RunRecord, evals: Evaluations):
        self.run = run
        self.evals = evals
        self.pool = evals.pool
        self.climbs: dict[str, Climb] = {}
        self.ready: list[_Ready] = []
        self.preparing = 0
        self.tasks: set[asyncio.Task[None]] = set()
        self.preparing_tasks: set[asyncio.Task[None]] = set()
        self.stopping = False
        self.variants = 0
        """Variants measured this session."""
        self.faster = 0
        """Variants that moved their climb (faster than its point beyond the noise)."""
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.Task[None] | None = None

    @property
    def cap(self) -> int:
        return max(16, CLIMBS_PER_EVALUATOR * self.pool.size)

    # --- what it hears -----------------------------------------------------------------------------

    def observe(self, event: Event) -> None:
        """A passed candidate starts a climb: as judged, or, with --autotune, as the tuner left it."""
        autotuned = self.run.config.search.autotune_variants > 0
        if isinstance(event, Tuned if autotuned else Evaluation) and not self.stopping and event.speedup is not None:
            self._add(event.solution_id, event.speedup, event)

    def _add(self, solution_id: str, speedup: float, event: Evaluation | Tuned) -> None:
        if solution_id in self.climbs:
            return
        solution = self.evals.solution(solution_id)
        start = tunable_values(solution)
        if not start:
            return
        if len(self.climbs) >= self.cap:
            slowest = min((c for c in self.climbs.values() if not c.measuring), key=lambda c: c.speedup, default=None)
            if slowest is None or slowest.speedup >= speedup:
                return
            del self.climbs[slowest.solution.id]
        self.climbs[solution_id] = Climb(solution, start, dict(start), speedup, event.round, event.node, event.method,
                                         {_key(start)})
        self._nudge()

    # --- its life ------------------------------------------------------------------------------------

    def start(self) -> None:
        self._wake = asyncio.Event()
        self.pool.idle.on_free = self._nudge
        self._loop = asyncio.create_task(self._run())

    async def stop(self) -> None:
        """Take no more evaluators; wait for the variants being measured (a build still running is not waited for)."""
        self._halt()
        for task in self.preparing_tasks:
            task.cancel()
        while self.tasks:
            await asyncio.gather(*list(self.tasks), return_exceptions=True)
        if self.variants:
            self.run.say(f"idle tuning: {self.variants} variant(s) measured by evaluators that would have idled, "
                         f"{self.faster} faster than their candidate beyond the noise")

    def cancel(self) -> None:
        self._halt()
        for task in self.tasks:
            task.cancel()

    def _halt(self) -> None:
        self.stopping = True
        self.ready.clear()
        self.pool.idle.on_free = lambda: None
        if self._loop is not None:
            self._loop.cancel()

    def _nudge(self) -> None:
        if self._wake is not None:
            self._wake.set()

    async def _run(self) -> None:
        assert self._wake is not None
        while True:
            self._fill()
            await self._wake.wait()
            self._wake.clear()

    def _fill(self) -> None:
        if self.stopping or self.run.budget_left() not in (None, "rounds"):
            return
        while self.ready and (index := self.pool.take_spare()) is not None:
            self._spawn(self._measure(index, self.ready.pop(0)))
        wanted = self.pool.idle.spare_count() - len(self.ready) - self.preparing
        while wanted > 0 and (choice := self._next()) is not None:
            wanted -= 1
            self.preparing += 1
            self.preparing_tasks.add(self._spawn(self._prepare(*choice)))

    def _spawn(self, work: Any) -> asyncio.Task[None]:
        task = asyncio.create_task(work)
        self.tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        self.preparing_tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None and not self.stopping:
            self._halt()
            reason = str(exc) if isinstance(exc, SearchError) else f"{type(exc).__name__}: {exc}"
            self.run.say(f"WARNING: idle tuning stopped ({clip(reason, 200)}); the search goes on without it")
        self._nudge()

    # --- the climbs ---------------------------------------------------------------------------------

    def _next(self) -> tuple[Climb, dict[str, Any], Solution] | None:
        """The nearest untried point to the fastest climb's point that this run has not judged; climbs with none
        left end."""
        for climb in sorted(self.climbs.values(), key=lambda c: c.speedup, reverse=True):
            if climb.order is None:
                climb.order = _nearest_first(climb.solution, climb.point)
            for values in climb.order:
                if _key(values) in climb.tried:
                    continue
                climb.tried.add(_key(values))
                changed = {k: v for k, v in values.items() if climb.start[k] != v}
                solution = variant(climb.solution, values, changed)
                if self.run.view.verdict(solution.id) is not None:
                    continue  # judged already (by the tuner, or by another climb)
                climb.measuring += 1
                return climb, values, solution
            if not climb.measuring:
                del self.climbs[climb.solution.id]
        return None

    async def _prepare(self, climb: Climb, values: dict[str, Any], solution: Solution) -> None:
        try:
            self.evals.save_solution(solution)
            verdict, prepared = await self.pool.prepare(solution, self.evals.workload_set)
        except BaseException:
            climb.measuring -= 1
            raise
        finally:
            self.preparing -= 1
        if verdict is not None:  # a build that failed: a verdict without an evaluator
            await self._settle(climb, values, solution, verdict, BUILDER, None)
        elif self.stopping:
            climb.measuring -= 1
        else:
            self.ready.append(_Ready(climb, values, solution, prepared))
        self._nudge()

    async def _measure(self, index: int, ready: _Ready) -> None:
        try:
            measured = await self.evals.measure_spare(index, ready.solution, ready.prepared)
        except BaseException:
            ready.climb.measuring -= 1
            raise
        if measured is None:  # the evaluator died meanwhile; spare work is not run again
            ready.climb.measuring -= 1
            return
        result, value = measured
        await self._settle(ready.climb, ready.values, ready.solution, result, index, value)

    async def _settle(self, climb: Climb, values: dict[str, Any], solution: Solution, result: EvalResult,
                      evaluator: int, value: float | None) -> None:
        climb.measuring -= 1
        self.variants += 1
        changed = {k: v for k, v in values.items() if climb.start[k] != v}
        self.run.record(Tune(round=climb.round, original=climb.solution.id, solution_id=solution.id, values=changed,
                             evaluator=evaluator, gpu=self.evals.gpu_name(evaluator), result=result, speedup=value,
                             node=climb.node, method=climb.method, idle=True))
        noise = self.evals.noise(evaluator)
        if value is not None and value > climb.speedup * (1.0 + (noise.value if noise else 0.0)):
            before, climb.point, climb.speedup, climb.order = climb.speedup, values, value, None
            self.faster += 1
            label = ", ".join(f"{k}={v!r}" for k, v in changed.items())
            self.run.say(f"idle tuning: {climb.solution.name} of round {climb.round} with {label}: "
                         f"{before:.3g}x -> {value:.3g}x")
            await self.evals.note_best(solution.id, value, climb.node or climb.method or "", climb.round, evaluator)
        self.run.view.let_go([solution.id])
        self.evals.uncache([solution.id])

