"""EvaluatorActor: one per GPU (num_gpus=1), one measurement at a time, through its own sandbox."""

from __future__ import annotations

import os
from pathlib import Path

import ray

from ksearch_ray.evaluation.buildcache import BuildRecord, default_scratch_dir
from ksearch_ray.evaluation.evaluator import Evaluator, Limits
from ksearch_ray.models import EvalResult, Solution
from ksearch_ray.taskspec.task import Task, find_task


@ray.remote(max_restarts=0)
class EvaluatorActor:
    def __init__(self, device: str, work_root: str, idle_timeout_s: float = 180.0, *, driver_node: str | None = None,
                 local_work_root: str | None = None, scratch_dir: str | None = None):
        """`work_root` is used on the driver's node; elsewhere `local_work_root`, relative to the node's scratch
        directory, so that the run directory exists on the driver's node only."""
        from ksearch_ray.actors.builder import node_cache

        self.device = device
        self.node = ray.get_runtime_context().get_node_id()
        root = Path(work_root)
        if driver_node is not None and self.node != driver_node and local_work_root is not None:
            root = Path(scratch_dir or default_scratch_dir()) / local_work_root
        self.evaluator = Evaluator(device, root, limits=Limits(idle=idle_timeout_s))
        self.cache = node_cache(scratch_dir)
        self.busy_s = 0.0
        self._tasks: dict[tuple[str, tuple[str, ...]], Task] = {}  # loaded once: reference code included

    def describe(self) -> dict:
        import torch

        info = {"device": self.device, "pid": os.getpid(), "node": self.node,
                "gpu_ids": [str(g) for g in ray.get_gpu_ids()], "compute_capability": None}
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

    def evaluate(self, task_name: str, task_dirs: list[str], solution: Solution, workload_set: str,
                 mode: str, build: BuildRecord | None = None, library: bytes | None = None) -> EvalResult:
        """`build`/`library`: the candidate built ahead of time on a CPU worker; loaded here, not compiled."""
        key = (task_name, tuple(task_dirs))
        if key not in self._tasks:
            self._tasks[key] = find_task(task_name, task_dirs)
        task = self._tasks[key]
        prebuilt = None
        if build is not None and library is not None:
            self.cache.put(build, library)  # fills this node's cache from wherever it was built (no-op if present)
            prebuilt = (build, library)
        result = self.evaluator.evaluate(task, solution, workload_set=workload_set, mode=mode,  # type: ignore[arg-type]
                                         prebuilt=prebuilt)
        self.busy_s += result.seconds
        return result

    def busy_seconds(self) -> float:
        return self.busy_s

    def shutdown(self) -> None:
        self.evaluator.close()
