"""In-process backends for `run.engine.Search` whose behaviour a test scripts: the run logic without Ray.

The world model is the real state machine (`run.local.LocalWorldModel`); planners and coders are the
test's own scripts; the evaluator pool is a fake whose verdicts a test chooses (the behaviour under test
is the engine's, not the sandbox's, which has tests of its own). `settings` lets a test name settings
by their last part (`rounds=3`, `stagnation_window=2`) when that part is unique.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ksearch_ray.config import RunConfig, field_paths, set_path, validate_config
from ksearch_ray.evaluation.describe import EvaluatorInfo
from ksearch_ray.evaluation.retime import RetimeResult
from ksearch_ray.methods.registry import method_for
from ksearch_ray.models import EvalResult, Solution, Status, Timing, WorkloadResult
from ksearch_ray.policies.contract import CodeReply, CodeRequest, PlanReply, PlanRequest
from ksearch_ray.policies.llm_call import LLMCall
from ksearch_ray.run.engine import Search
from ksearch_ray.run.local import local_backends
from ksearch_ray.store import RunStore
from ksearch_ray.taskspec.task import find_task

DATA = Path(__file__).parent / "data"


def settings(**values: Any) -> RunConfig:
    """A RunConfig from settings named by dotted path (as keyword: search__width) or by a unique last part."""
    paths = list(field_paths())
    data: dict[str, Any] = {}
    for key, value in values.items():
        dotted = key.replace("__", ".")
        if dotted not in paths:
            matches = [p for p in paths if p.split(".")[-1] == dotted]
            assert len(matches) == 1, f"setting {key}: {matches or 'no such setting'}"
            dotted = matches[0]
        set_path(data, dotted, value)
    return validate_config(data)


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

    def release(self) -> None:
        pass


def toy_kernel(tag: str) -> Solution:
    """A toy_axpy kernel named `tag` (fake evaluators judge it by name), its code its own per tag."""
    return Solution(name=tag, task="toy_axpy", language="python", entry_file="k.py", entry_point="run",
                    sources={"k.py": f"# {tag}\ndef run(x, a, b):\n    return a * x + b\n"})


def idea_planner(calls: Callable[[], list[LLMCall]] = list) -> ScriptedPolicy:
    """A planner that proposes one new idea under the node it is asked about, each reply with `calls()`."""
    def plan(request: PlanRequest) -> PlanReply:
        return PlanReply(ops=[{"op": "insert", "parent": request.node_id or "root", "title": f"idea {len(request.tree.nodes)}",
                               "difficulty": 1, "score": 0.5, "expected_speedup": 1.2}], calls=calls())
    return ScriptedPolicy(plan=plan)


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
        self.screened: list[Solution] = []  # evaluated by the screening rule (a search's new candidates)
        self.retime_agrees: Callable[[Solution], bool] = lambda _solution: True
        self.released = False

    async def describe_all(self) -> list[EvaluatorInfo]:
        return [EvaluatorInfo(device="cpu", name="fake", hardware="a fake evaluator") for _ in range(self.size)]

    async def evaluate(self, solution: Solution, workload_set: str, *, screen: bool = False) -> tuple[EvalResult, int]:
        if screen:
            self.screened.append(solution)
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

    def release(self) -> None:
        self.released = True


def local_search(tmp_path: Path, planner: ScriptedPolicy, coder: ScriptedPolicy, evaluators: Any,
                 clock: Callable[[], float] = time.time, run_dir: Path | None = None, **config: Any) -> Search:
    """A search of the toy task in this process, with the test's planner, coder and evaluators."""
    defaults = {"task": "toy_axpy", "task_dirs": [str(DATA)], "device": "cpu", "width": 1, "rounds": 6,
                "noise_repeats": 1, "noise_share": 0.0, "confirm_repeats": 0, "warmup": False,
                "screen": None}  # the fakes' figures are scripted per measurement: screening's tests turn it on
    cfg = settings(**(defaults | config))
    root = run_dir or tmp_path / "run"
    store = RunStore.open(root) if (root / "manifest.json").exists() else RunStore.create(
        root, {"run_id": root.name, "config": cfg.model_dump(mode="json")})
    backends = local_backends(cfg, find_task(cfg.task, cfg.task_dirs), store, planner=planner, coder=coder,
                              evaluators=evaluators)
    return Search(cfg, find_task(cfg.task, cfg.task_dirs), store, backends, method_for(cfg, store.load_solution), clock=clock)
