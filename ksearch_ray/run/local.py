"""A run in one process, without Ray: `ksearch run --no-ray`, and the tests of the algorithm.

The same `Search` as on Ray, with backends that live here: the world model's state machine (with
the record the WorldModelActor writes), the planner and coder policies, and a pool of evaluators,
each an `Evaluator` (and so its own sandbox) driven from a worker thread so that evaluations run side
by side while the search goes on. Candidate code still runs only in the evaluators' sandboxes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ksearch_ray.config import ConfigError, RunConfig
from ksearch_ray.evaluation.describe import EvaluatorInfo, describe
from ksearch_ray.evaluation.evaluator import Evaluator
from ksearch_ray.evaluation.profiling import ProfileResult
from ksearch_ray.evaluation.retime import RetimeResult
from ksearch_ray.methods.registry import method_for
from ksearch_ray.models import EvalResult, Solution
from ksearch_ray.policies import make_policy
from ksearch_ray.policies.contract import CodeReply, CodeRequest, PlanReply, PlanRequest, Policy
from ksearch_ray.policies.llm.ratelimit import LocalLimiter, RateBook
from ksearch_ray.run.backends import Backends, IdleEvaluators, in_flight_on, slots
from ksearch_ray.run.engine import Search
from ksearch_ray.run.evaluators import build_evaluator
from ksearch_ray.store import RunStore
from ksearch_ray.taskspec.task import Task
from ksearch_ray.tree_record import TreeRecord
from ksearch_ray.worldmodel.api import Command, R
from ksearch_ray.worldmodel.state import WorldModelState
from ksearch_ray.worldmodel.tree import Tree


class LocalWorldModel:
    """The world model's state machine in this process; records every version, as the actor does."""

    def __init__(self, store: RunStore, tree: Tree):
        self.store = store
        self.record = TreeRecord(store.root, tree)
        self.state = WorldModelState(tree, store.has_solution, on_change=self.record.changed)

    async def run(self, command: Command[R]) -> R:
        return self.state.run(command)

    def release(self) -> None:
        """The record's last checkpoint."""
        self.record.close()


class LocalPolicy:
    """A planner or coder in this process."""

    def __init__(self, policy: Policy):
        self.policy = policy

    async def name(self) -> str:
        return self.policy.name

    async def plan(self, request: PlanRequest) -> PlanReply:
        return await self.policy.plan(request)

    async def code(self, request: CodeRequest) -> CodeReply:
        return await self.policy.code(request)

    def release(self) -> None:
        """Nothing held."""


class LocalEvaluatorPool:
    """Evaluators of this machine, one measurement at a time each, driven from worker threads."""

    def __init__(self, config: RunConfig, task: Task, make: Callable[[int], Evaluator] | None = None, *,
                 secret: int | None = None):
        """`secret`: the run's input secret (RunStore.seed_secret), shared by its evaluators."""
        device = config.evaluation.device or "cpu"
        size = config.evaluation.evaluators or 1
        if device == "cuda" and size > 1:
            raise ConfigError("without Ray a run has one evaluator on the GPU (--evaluators 1); "
                              "run on Ray for one evaluator per GPU")
        self.config, self.task, self.device, self.size = config, task, device, size
        self._make = make or (lambda _index: build_evaluator(config.evaluation, device, secret_names=[config.llm.api_key_env],
                                                             secret=secret))
        self.evaluators: list[Evaluator] = []
        self.done = 0
        self.busy_s: dict[int, float] = {}
        self.in_flight: dict[int, tuple[str, float]] = {}
        self.in_flight_next: dict[int, tuple[str, float]] = {}  # a second evaluation beside the first (overlap)
        self.idle = IdleEvaluators()
        self.slots = slots(config.evaluation.overlap)
        self._locks = [asyncio.Semaphore(self.slots) for _ in range(size)]
        self._active = [0] * size
        self._busy_since = [0.0] * size

    async def describe_all(self) -> list[EvaluatorInfo]:
        if not self.evaluators:
            self.evaluators = [self._make(i) for i in range(self.size)]
            for _ in range(self.slots):
                for i in range(self.size):
                    self.idle.put(i)
        return list(await asyncio.gather(*(asyncio.to_thread(describe, ev) for ev in self.evaluators)))

    async def _on(self, index: int, solution: Solution, label: str, work: Callable[[Evaluator], Any]) -> Any:
        async with self._locks[index]:
            if not self._active[index]:
                self._busy_since[index] = time.monotonic()
            self._active[index] += 1
            try:
                with in_flight_on(self.in_flight, self.in_flight_next, index, label):
                    return await asyncio.to_thread(work, self.evaluators[index])
            finally:
                self._active[index] -= 1
                if not self._active[index]:  # busy while any work is in progress: overlapping work counts once
                    self.busy_s[index] = self.busy_s.get(index, 0.0) + time.monotonic() - self._busy_since[index]

    def _evaluate(self, solution: Solution, workload_set: str, screen: bool = False) -> Callable[[Evaluator], EvalResult]:
        mode = self.config.evaluation.mode
        return lambda ev: ev.evaluate(self.task, solution, workload_set=workload_set, mode=mode, screen=screen)

    async def evaluate(self, solution: Solution, workload_set: str, *, screen: bool = False) -> tuple[EvalResult, int]:
        index = await self.idle.get()
        result = await self.evaluate_spare(index, solution, workload_set, None, screen=screen)
        assert result is not None  # (a local evaluator does not die away)
        return result, index

    def take_spare(self) -> int | None:
        return self.idle.spare()

    async def prepare(self, solution: Solution, workload_set: str) -> tuple[EvalResult | None, Any]:
        return None, None  # each evaluator builds in its own sandbox

    async def build_ahead(self, solution: Solution, workload_set: str) -> None:
        return None  # each evaluator builds in its own sandbox, when it evaluates

    async def evaluate_spare(self, index: int, solution: Solution, workload_set: str, prepared: Any, *,
                             screen: bool = False) -> EvalResult | None:
        """Also the body of `evaluate`, once it has an evaluator: measure on `index`, then give it back."""
        try:
            result: EvalResult = await self._on(index, solution, solution.name, self._evaluate(solution, workload_set, screen))
        finally:
            self.idle.put(index)
        self.done += 1
        return result

    async def evaluate_on(self, index: int, solution: Solution, workload_set: str) -> EvalResult:
        result: EvalResult = await self._on(index, solution, solution.name, self._evaluate(solution, workload_set))
        self.done += 1
        return result

    async def retime_on(self, index: int, solution: Solution, primary: EvalResult) -> RetimeResult:
        result: RetimeResult = await self._on(index, solution, f"{solution.name} (re-timing)",
                                              lambda ev: ev.retime(self.task, solution, primary))
        return result

    async def profile_on(self, index: int, solution: Solution, measured: EvalResult, timeout_s: float) -> ProfileResult:
        result: ProfileResult = await self._on(index, solution, f"{solution.name} (profiling)",
                                               lambda ev: ev.profile(self.task, solution, measured, timeout_s=timeout_s))
        return result

    def release(self) -> None:
        for evaluator in self.evaluators:
            with contextlib.suppress(OSError):
                evaluator.close()
        self.evaluators = []


def local_backends(config: RunConfig, task: Task, store: RunStore, *, planner: Any = None, coder: Any = None,
                   evaluators: Any = None) -> Backends:
    """Backends in this process; tests may give their own planner, coder or evaluator pool."""
    cache = Path(store.cache_dir)
    llm = config.llm
    # The planner and the coder call one endpoint: they share its limit.
    limiter = LocalLimiter(RateBook(llm.requests_per_min, llm.tokens_per_min, llm.limit_window_s))
    return Backends(
        world_model=lambda tree: LocalWorldModel(store, tree),
        planner=planner or LocalPolicy(make_policy(llm, cache, limiter=limiter)),
        coder=coder or LocalPolicy(make_policy(llm, cache, limiter=limiter)),
        evaluators=evaluators or LocalEvaluatorPool(config, task, secret=store.seed_secret()),
    )


def local_search(config: RunConfig, task: Task, store: RunStore, **options: Any) -> Search:
    """A search whose world model, planner, coder and evaluators are all in this process."""
    backends = local_backends(config, task, store)
    return Search(config, task, store, backends, method_for(config, store.load_solution), **options)
