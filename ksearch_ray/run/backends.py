"""What a run needs from the world model, the planner, the coder and the evaluators: small interfaces.

`run.engine.Search` and its services (`run.mirror`, `run.llm_calls`, `run.evaluations`) call only
these. `run.local` implements them in this process (the world model's state machine, the policies,
an evaluator pool of threads around `Evaluator`s); `distributed` implements them with Ray actors. The engine never knows which.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from ksearch_ray.evaluation.describe import EvaluatorInfo
from ksearch_ray.evaluation.profiling import ProfileResult
from ksearch_ray.evaluation.retime import RetimeResult
from ksearch_ray.models import EvalResult, Solution
from ksearch_ray.policies.contract import CodeReply, CodeRequest, PlanReply, PlanRequest
from ksearch_ray.worldmodel.api import Command, R
from ksearch_ray.worldmodel.tree import Tree

BUILDER = -1
"""The evaluator index of a verdict that came from a build (a compile error): no evaluator was used."""


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
    """Evaluator index -> seconds spent evaluating this session."""
    in_flight: dict[int, tuple[str, float]]
    """Evaluator index -> (solution name, monotonic start) of what it evaluates now."""

    async def describe_all(self) -> list[EvaluatorInfo]: ...

    async def evaluate(self, solution: Solution, workload_set: str) -> tuple[EvalResult, int]:
        """The verdict from whichever evaluator is free first, and which one it was (BUILDER: a build)."""
        ...

    async def evaluate_on(self, index: int, solution: Solution, workload_set: str) -> EvalResult: ...

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
