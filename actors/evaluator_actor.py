"""EvaluatorActor: one per GPU (num_gpus=1), one measurement at a time, through its own sandbox."""

from __future__ import annotations

import ray

from ksearch_ray.config import EvaluationConfig
from ksearch_ray.evaluation.buildcache import BuildRecord
from ksearch_ray.evaluation.describe import EvaluatorInfo, describe
from ksearch_ray.evaluation.gpu_driver import GpuDriverError
from ksearch_ray.evaluation.profiling import ProfileResult
from ksearch_ray.evaluation.retime import RetimeResult
from ksearch_ray.models import EvalResult, Solution
from ksearch_ray.run.evaluators import build_evaluator
from ksearch_ray.taskspec.task import Task, find_task


@ray.remote(max_restarts=0)
class EvaluatorActor:
    def __init__(self, device: str, settings_json: str, *, scratch_dir: str | None = None,
                 secret_names: list[str | None] | None = None, secret: int | None = None):
        """The sandbox lives in a private folder of this actor's node, outside any run directory (the run
        directory exists on the driver's node only); `close` removes it."""
        from ksearch_ray.actors.build_task import node_cache

        self.device = device
        self.node = ray.get_runtime_context().get_node_id()
        self.start_error: GpuDriverError | None = None
        try:
            self.evaluator = build_evaluator(EvaluationConfig.model_validate_json(settings_json), device,
                                             secret_names=secret_names or (), secret=secret)
        except GpuDriverError as exc:
            # Raised again by `describe`, the pool's first call: an error in __init__ reaches the driver only
            # as "the actor died" (and is retried), this one as its own line naming both versions.
            self.start_error = exc
        self.cache = node_cache(scratch_dir)
        self._tasks: dict[tuple[str, tuple[str, ...]], Task] = {}  # loaded once: reference code included

    def describe(self) -> EvaluatorInfo:
        """Starts the sandbox (a SandboxError here when isolation is required and missing, a GpuDriverError
        when this node's driver is too old for the image's torch)."""
        if self.start_error is not None:
            raise self.start_error
        return describe(self.evaluator, node=self.node, gpu_ids=[str(g) for g in ray.get_gpu_ids()])

    def _task(self, task_name: str, task_dirs: list[str]) -> Task:
        key = (task_name, tuple(task_dirs))
        if key not in self._tasks:
            self._tasks[key] = find_task(task_name, task_dirs)
        return self._tasks[key]

    def evaluate(self, task_name: str, task_dirs: list[str], solution: Solution, workload_set: str,
                 mode: str, build: BuildRecord | None = None, library: bytes | None = None,
                 screen: bool = False) -> EvalResult:
        """`build`/`library`: the candidate built ahead of time on a CPU worker; loaded here, not compiled.
        `screen`: a search's new candidate, timed by the screening rule where the run has one."""
        prebuilt = None
        if build is not None and library is not None:
            self.cache.put(build, library)  # fills this node's cache from wherever it was built (no-op if present)
            prebuilt = (build, library)
        return self.evaluator.evaluate(self._task(task_name, task_dirs), solution, workload_set=workload_set,
                                       mode=mode, prebuilt=prebuilt, screen=screen)  # type: ignore[arg-type]

    def retime(self, task_name: str, task_dirs: list[str], solution: Solution, primary: EvalResult) -> RetimeResult:
        """A second, independent measurement of `primary` in a fresh worker (see evaluation/retime.py)."""
        return self.evaluator.retime(self._task(task_name, task_dirs), solution, primary)

    def profile(self, task_name: str, task_dirs: list[str], solution: Solution, measured: EvalResult,
                timeout_s: float) -> ProfileResult:
        """One call of `solution` under Nsight Compute in a fresh worker, outside any timed measurement."""
        return self.evaluator.profile(self._task(task_name, task_dirs), solution, measured, timeout_s=timeout_s)

    def close(self) -> None:
        """Stop the sandbox and remove its folder; the pool calls it before it kills the actor."""
        self.evaluator.close()
