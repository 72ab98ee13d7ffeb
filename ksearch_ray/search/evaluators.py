"""The evaluator pool: GPU-pinned EvaluatorActors, one measurement at a time each.

The driver asks the pool for verdicts and never talks to an evaluator actor itself. The pool
keeps an idle queue (so evaluations in flight never exceed the evaluators), replaces an actor
that dies mid-evaluation and retries the evaluation on the new one (the loss is reported through
`on_lost`, so the run log says which evaluations a failure cost), and counts each evaluator's
busy time.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import RayActorError

from ksearch_ray.config import RunConfig
from ksearch_ray.models import EvalResult, Solution
from ksearch_ray.search.errors import SearchError

log = logging.getLogger(__name__)

ACTOR_RETRIES = 3


class EvaluatorPoolError(SearchError):
    """The pool cannot evaluate (no resources, or an evaluator keeps dying); one line for the user."""


def evaluator_count(config: RunConfig) -> int:
    """--evaluators, or one per GPU the cluster has now (GPU evaluators), or one on the CPU."""
    if config.evaluators:
        return config.evaluators
    if config.device == "cuda" or config.evaluator_gpus:
        gpus = int(ray.cluster_resources().get("GPU", 0))
        if gpus == 0:
            raise EvaluatorPoolError(
                "no evaluator resources: Ray sees no GPUs (use --device cpu, or --evaluators N on an autoscaling cluster)"
            )
        return gpus
    return 1


@dataclass
class EvaluatorPool:
    config: RunConfig
    run_name: str
    sandbox_root: str
    """Parent of each evaluator's sandbox work directory."""
    on_lost: Callable[[int, str], object] = lambda _index, _solution_id: None
    """Called with (evaluator index, solution id) when an evaluator dies mid-evaluation."""
    busy_s: dict[int, float] = field(default_factory=dict)
    """Evaluator index -> seconds spent evaluating in this session."""
    done: int = 0
    """Evaluations finished in this session."""
    in_flight: dict[int, tuple[str, float]] = field(default_factory=dict)
    """Evaluator index -> (solution name, monotonic start) of the evaluation it runs now."""

    def __post_init__(self) -> None:
        self.device = self.config.device or "cpu"
        self.size = evaluator_count(self.config)
        self.actors = [self._make(i) for i in range(self.size)]
        self.idle: asyncio.Queue[int] = asyncio.Queue()
        for i in range(self.size):
            self.idle.put_nowait(i)
        # One measurement at a time per evaluator, whether it came through the idle queue or was
        # addressed to that evaluator (baselines and re-timing are measured on each GPU itself).
        self._locks = [asyncio.Lock() for _ in range(self.size)]

    def _make(self, index: int) -> Any:
        from ksearch_ray.actors.evaluator import EvaluatorActor

        gpus = 1 if self.device == "cuda" or self.config.evaluator_gpus else 0
        return EvaluatorActor.options(
            num_cpus=self.config.evaluator_cpus, num_gpus=gpus, name=f"ksearch-eval-{self.run_name}-{index}-{time.time_ns()}"
        ).remote(self.device, None, self.config.eval_idle_timeout_s, self.config.isolation)  # sandbox: outside the run dir

    async def describe(self, index: int = 0) -> dict[str, Any]:
        """An evaluator's hardware, as prompts and reports name it."""
        for attempt in range(1, ACTOR_RETRIES + 1):
            try:
                info: dict[str, Any] = await self.actors[index].describe.remote()
                return info
            except RayActorError:
                log.warning("evaluator %d died before it described itself; starting a new one (%d/%d)", index, attempt, ACTOR_RETRIES)
                self.actors[index] = self._make(index)
        raise EvaluatorPoolError(f"evaluator {index} died {ACTOR_RETRIES} times in a row while starting")

    async def describe_all(self) -> list[dict[str, Any]]:
        return list(await asyncio.gather(*(self.describe(i) for i in range(self.size))))

    async def evaluate(self, solution: Solution, workload_set: str) -> tuple[EvalResult, int]:
        """The verdict on `solution` from whichever evaluator is free first, and which one it was."""
        index = await self.idle.get()
        try:
            return await self.evaluate_on(index, solution, workload_set), index
        finally:
            self.idle.put_nowait(index)

    async def evaluate_on(self, index: int, solution: Solution, workload_set: str) -> EvalResult:
        """The verdict of evaluator `index` (waits until it is free)."""
        async with self._locks[index]:
            self.in_flight[index] = (solution.name, time.monotonic())
            try:
                return await self._evaluate_locked(index, solution, workload_set)
            finally:
                self.in_flight.pop(index, None)

    async def _evaluate_locked(self, index: int, solution: Solution, workload_set: str) -> EvalResult:
        for attempt in range(1, ACTOR_RETRIES + 1):
            try:
                result: EvalResult = await self.actors[index].evaluate.remote(
                    self.config.task, self.config.task_dirs, solution, workload_set, self.config.mode
                )
            except RayActorError:
                log.warning("evaluator %d died mid-evaluation; starting a new one (%d/%d)", index, attempt, ACTOR_RETRIES)
                self.on_lost(index, solution.id)
                self.actors[index] = self._make(index)
                continue
            self.done += 1
            self.busy_s[index] = self.busy_s.get(index, 0.0) + result.seconds
            return result
        raise EvaluatorPoolError(f"evaluator {index} died {ACTOR_RETRIES} times in a row")
