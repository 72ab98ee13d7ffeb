"""EvaluatorActor: one per GPU (num_gpus=1), one measurement at a time, through its own sandbox."""

from __future__ import annotations

import os
from pathlib import Path

import ray

from ksearch_ray.evaluation.buildcache import BuildRecord
from ksearch_ray.evaluation.evaluator import Evaluator, Limits
from ksearch_ray.evaluation.retime import RetimeResult
from ksearch_ray.evaluation.sandbox.isolation import Isolation
from ksearch_ray.models import EvalResult, Solution
from ksearch_ray.taskspec.task import Task, find_task


@ray.remote(max_restarts=0)
class EvaluatorActor:
    def __init__(self, device: str, work_root: str | None, idle_timeout_s: float = 180.0,
                 isolation: str = Isolation.BEST_EFFORT.value, *, scratch_dir: str | None = None):
        """No `work_root`: a private folder on this actor's node, outside any run directory (the run
        directory exists on the driver's node only)."""
        from ksearch_ray.actors.builder import node_cache

        self.device = device
        self.node = ray.get_runtime_context().get_node_id()
        self.isolation = Isolation(isolation)
        self.evaluator = Evaluator(device, Path(work_root) if work_root else None, limits=Limits(idle=idle_timeout_s),
                                   isolation=self.isolation, start=False)
        self.cache = node_cache(scratch_dir)
        self.busy_s = 0.0
        self._tasks: dict[tuple[str, tuple[str, ...]], Task] = {}  # loaded once: reference code included

    def describe(self) -> dict:
        """Starts the sandbox (a SandboxError here when isolation is required and missing)."""
        import torch

        report = self.evaluator.sandbox.ensure_started()
        info = {"device": self.device, "pid": os.getpid(), "node": self.node, "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
                "compute_capability": None, "isolated": report.isolated,
                "isolation_warnings": report.warnings(self.isolation)}
        if self.device == "cuda":
            props = torch.cuda.get_device_properties(0)
            info["name"] = props.name
            info["compute_capability"] = f"{props.major}.{props.minor}"
            info["hardware"] = (f"{props.name} (compute capability {props.major}.{props.minor}, "
                                f"{props.multi_processor_count} SMs, {props.total_memory / 2**30:.0f} GiB)")
        else:
            info["name"] = "cpu"
            info["hardware"] = ("no GPU: candidates run on the CPU in Triton's interpreter (TRITON_INTERPRET=1) "
                                "on reduced workloads; timings are host wall-clock")
        return info

    def _task(self, task_name: str, task_dirs: list[str]) -> Task:
        key = (task_name, tuple(task_dirs))
        if key not in self._tasks:
            self._tasks[key] = find_task(task_name, task_dirs)
        return self._tasks[key]

    def evaluate(self, task_name: str, task_dirs: list[str], solution: Solution, workload_set: str,
                 mode: str, build: BuildRecord | None = None, library: bytes | None = None) -> EvalResult:
        """`build`/`library`: the candidate built ahead of time on a CPU worker; loaded here, not compiled."""
        prebuilt = None
        if build is not None and library is not None:
            self.cache.put(build, library)  # fills this node's cache from wherever it was built (no-op if present)
            prebuilt = (build, library)
        result = self.evaluator.evaluate(self._task(task_name, task_dirs), solution, workload_set=workload_set,
                                         mode=mode, prebuilt=prebuilt)  # type: ignore[arg-type]
        self.busy_s += result.seconds
        return result

    def retime(self, task_name: str, task_dirs: list[str], solution: Solution, primary: EvalResult) -> RetimeResult:
        """A second, independent measurement of `primary` in a fresh worker (see evaluation/retime.py)."""
        result = self.evaluator.retime(self._task(task_name, task_dirs), solution, primary)
        return result

    def busy_seconds(self) -> float:
        return self.busy_s

    def shutdown(self) -> None:
        self.evaluator.close()
