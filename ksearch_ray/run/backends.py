"""What a run needs from the world model, the planner, the coder and the evaluators: small interfaces.

`run.engine.Search` and its services (`run.mirror`, `run.llm_calls`, `run.evaluations`) call only
these. `run.local` implements them in this process (the world model's state machine, the policies,
an evaluator pool of threads around `Evaluator`s); `distributed` implements them with Ray actors. The engine never knows which.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from ksearch_ray.evaluation.describe import EvaluatorInfo
from ksearch_ray.evaluation.profiling import ProfileResult
from ksearch_ray.evaluation.retime import RetimeResult
from ksearch_ray.models import EvalResult, Solution
from ksearch_ray.policies.contract import CodeReply, CodeRequest, PlanReply, PlanRequest
from ksearch_ray.worldmodel.api import Command, R
from ksearch_ray.worldmodel.tree import Tree

BUILDER = -1
"""The evaluator index of a verdict that came from a build (a compile error): no evaluator was used."""


class IdleEvaluators:
    """The evaluators free now, first come first served. One that would otherwise idle is lent to spare work (idle
    tuning: `run.idle_tuning`) only while no evaluation waits for an evaluator, so spare work never queues ahead of a
    candidate; it can delay one by at most the spare evaluation that was running when the candidate came."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[int] = asyncio.Queue()
        self.waiting = 0
        """Evaluations waiting for an evaluator now."""
        self.on_free: Callable[[], None] = lambda: None
        """Called whenever an evaluator comes back (idle tuning wakes on it)."""

    def put(self, index: int) -> None:
        self._queue.put_nowait(index)
        self.on_free()

    async def get(self) -> int:
        self.waiting += 1
        try:
            return await self._queue.get()
        finally:
            self.waiting -= 1

    def spare(self) -> int | None:
        """An evaluator no evaluation waits for, taken out of the queue; None if there is none."""
        if self.waiting or self._queue.empty():
            return None
        return self._queue.get_nowait()

    def spare_count(self) -> int:
        return 0 if self.waiting else self._queue.qsize()


def slots(overlap: bool) -> int:
    """Evaluations an evaluator takes at once: two with `evaluation.overlap` (the second waits for its turn on
    the device inside the evaluator), else one."""
    return 2 if overlap else 1


@contextlib.contextmanager
def in_flight_on(in_flight: dict[int, tuple[str, float]], following: dict[int, tuple[str, float]], index: int,
                 label: str) -> Iterator[None]:
    """Work on evaluator `index` in progress, for the progress display: the first in `in_flight`, a second one
    beside it (evaluation.overlap) in `following`, which moves up when the first ends."""
    entry = (label, time.monotonic())
    mine = following if index in in_flight else in_flight
    mine[index] = entry
    try:
        yield
    finally:
        if in_flight.get(index) is entry:
            del in_flight[index]
            if index in following:
                in_flight[index] = following.pop(index)
        elif following.get(index) is entry:
            del following[index]


class WorldModelBackend(Protocol):
    async def run(self, command: Command[R]) -> R:
        """Apply one command (`worldmodel.api`) to the authoritative tree; what it returns."""
        ...

    def release(self) -> None: ...


class PolicyBackend(Protocol):
    async def name(self) -> str: ...

    async def plan(self, request: PlanRequest) -> PlanReply: ...

    async def code(self, request: CodeRequest) -> CodeReply: ...

    def release(self) -> None: ...


class EvaluatorBackend(Protocol):
    size: int
    done: int
    """Evaluations finished this session."""
    busy_s: dict[int, float]
    """Evaluator index -> seconds spent evaluating this session (overlapping evaluations counted once)."""
    in_flight: dict[int, tuple[str, float]]
    """Evaluator index -> (solution name, monotonic start) of what it evaluates now."""

    async def describe_all(self) -> list[EvaluatorInfo]: ...

    async def evaluate(self, solution: Solution, workload_set: str, *, screen: bool = False) -> tuple[EvalResult, int]:
        """The verdict from whichever evaluator is free first, and which one it was (BUILDER: a build).
        `screen`: a new candidate, timed by the run's screening rule where it has one (`evaluation.screen`)."""
        ...

    async def evaluate_on(self, index: int, solution: Solution, workload_set: str) -> EvalResult: ...

    idle: IdleEvaluators

    def take_spare(self) -> int | None:
        """An evaluator that would otherwise idle, out of the queue until `evaluate_spare` gives it back; None if every
        evaluator is at work or an evaluation waits for one."""
        ...

    async def prepare(self, solution: Solution, workload_set: str) -> tuple[EvalResult | None, Any]:
        """What a spare evaluation needs before it takes an evaluator (a CUDA/C++ build on the build pool, holding no
        GPU): (the verdict when the build failed, else None; what `evaluate_spare` takes)."""
        ...

    async def build_ahead(self, solution: Solution, workload_set: str) -> None:
        """Build `solution` before its evaluation asks for it, holding no evaluator (a session's starting kernel, while
        the baselines are measured); the evaluation then joins that build. Nothing where no build pool builds."""
        ...

    async def evaluate_spare(self, index: int, solution: Solution, workload_set: str, prepared: Any, *,
                             screen: bool = False) -> EvalResult | None:
        """The verdict of evaluator `index` (from `take_spare`), which then goes back to the queue; None if it died
        meanwhile (spare work is not run again)."""
        ...

    async def retime_on(self, index: int, solution: Solution, primary: EvalResult) -> RetimeResult: ...

    async def profile_on(self, index: int, solution: Solution, measured: EvalResult, timeout_s: float) -> ProfileResult:
        """One call of `solution` profiled by evaluator `index`, on the slowest workload of `measured`, within `timeout_s`."""
        ...

    def release(self) -> None:
        """Give back what the pool holds (actors, GPUs, sandboxes)."""
        ...


@dataclass
class Backends:
    world_model: Callable[[Tree], WorldModelBackend]
    """Builds the world-model backend from the tree it starts with."""
    planner: PolicyBackend
    coder: PolicyBackend
    evaluators: EvaluatorBackend
