"""In-process backends for `search.engine.Search`: the run logic without Ray.

The world model is the real state machine; planners and coders are the test's own scripts; the
evaluator is a fake whose verdicts a test chooses (the behaviour under test is the engine's, not
the sandbox's, which has tests of its own).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ksearch_ray.config import RunConfig
from ksearch_ray.evaluation.retime import RetimeResult
from ksearch_ray.models import EvalResult, Solution, Status, Timing, WorkloadResult
from ksearch_ray.search.engine import Backends, Search
from ksearch_ray.search.methods import method_for
from ksearch_ray.search.policy import CodeReply, CodeRequest, PlanReply, PlanRequest
from ksearch_ray.search.store import RunStore
from ksearch_ray.taskspec.task import find_task
from ksearch_ray.worldmodel.state import WorldModelState
from ksearch_ray.worldmodel.tree import Tree

DATA = Path(__file__).parent / "data"


class LocalWorldModel:
    def __init__(self, store: RunStore, tree: Tree):
        self.state = WorldModelState(tree, store.has_solution)

    async def call(self, name: str, args: dict[str, Any]) -> Any:
        return self.state.call(name, args)


class ScriptedPolicy:
    """plan(request) and code(request) are the test's functions."""

    def __init__(self, plan: Callable[[PlanRequest], PlanReply] | None = None,
                 code: Callable[[CodeRequest], CodeReply] | None = None):
        self._plan, self._code = plan, code
        self.plans: list[PlanRequest] = []
        self.codes: list[CodeRequest] = []

    async def name(self) -> str:
        return "scripted"

    async def plan(self, request: PlanRequest) -> PlanReply:
        self.plans.append(request)
        return self._plan(request) if self._plan else PlanReply()

    async def code(self, request: CodeRequest) -> CodeReply:
        self.codes.append(request)
        assert self._code is not None
        return self._code(request)


def result(solution: Solution, ms: float | None, status: Status = Status.PASSED, message: str = "") -> EvalResult:
    """A verdict: PASSED at `ms` per workload, or a failure with `message`."""
    timing = Timing(mean_ms=ms, median_ms=ms, min_ms=ms, std_ms=0.0, count=3, wall_median_ms=ms, clock="host_wall") if ms else None
    return EvalResult(
        solution_id=solution.id, solution_name=solution.name, task=solution.task, status=status, message=message,
        workload_set="benchmarks", mode="fresh", device="cpu", device_name="fake", timed=True,
        workloads=[WorkloadResult(workload="w", status=status, timing=timing)], score=ms if status is Status.PASSED else None,
        score_kind="geomean of mean latency (ms)",
    )


class FakeEvaluators:
    """Verdicts by solution: `judge(solution) -> (ms or None, status, message)`."""

    def __init__(self, judge: Callable[[Solution], tuple[float | None, Status, str]], size: int = 1):
        self.judge = judge
        self.size = size
        self.done = 0
        self.busy_s: dict[int, float] = {}
        self.in_flight: dict[int, tuple[str, float]] = {}
        self.evaluated: list[Solution] = []
        self.retimed: list[Solution] = []
        self.retime_agrees: Callable[[Solution], bool] = lambda _solution: True

    async def describe_all(self) -> list[dict[str, Any]]:
        return [{"name": "fake", "hardware": "a fake evaluator"} for _ in range(self.size)]

    async def evaluate(self, solution: Solution, workload_set: str) -> tuple[EvalResult, int]:
        return await self.evaluate_on(0, solution, workload_set), 0

    async def retime_on(self, index: int, solution: Solution, primary: EvalResult) -> RetimeResult:
        self.retimed.append(solution)
        return RetimeResult(agreed=self.retime_agrees(solution), status=Status.PASSED,
                            message="" if self.retime_agrees(solution) else "primary below the re-timed figure")

    async def evaluate_on(self, index: int, solution: Solution, workload_set: str) -> EvalResult:
        await asyncio.sleep(0)
        self.done += 1
        self.evaluated.append(solution)
        ms, status, message = self.judge(solution)
        return result(solution, ms, status, message)


def local_search(tmp_path: Path, planner: ScriptedPolicy, coder: ScriptedPolicy, evaluators: FakeEvaluators,
                 clock: Callable[[], float] = time.time, **config: Any) -> Search:
    settings = {"task": "toy_axpy", "task_dirs": [str(DATA)], "device": "cpu", "width": 1, "rounds": 6,
                "noise_repeats": 1, "confirm_repeats": 0, "model": None} | config
    cfg = RunConfig.model_validate(settings)
    store = RunStore.create(tmp_path / "run", {"run_id": "run", "config": cfg.model_dump(mode="json")})
    backends = Backends(world_model=lambda tree: LocalWorldModel(store, tree), planner=planner, coder=coder,
                        evaluators=evaluators)
    return Search(cfg, find_task(cfg.task, cfg.task_dirs), store, backends, method_for(cfg), clock=clock)
