"""build_extension: a Ray task that builds one CUDA/C++ candidate on a CPU worker, on any node;
build_triton: one that compiles a Python candidate's Triton kernels for the evaluators' GPU there.

It asks for CPUs only (the pool sets how many, and optionally a custom resource that only the
cluster's build nodes declare). The Builder, and so its sandbox's zygote, lives as long as the
Ray worker process, which Ray reuses for later builds: only the first build of a worker pays
for the zygote's imports. The library comes back as the second return value, so it stays in
the object store until an evaluator's node fetches it.
"""

from __future__ import annotations

import os
from pathlib import Path

import ray

from ksearch_ray.evaluation.buildcache import BuildCache, BuildRecord, BuildTarget
from ksearch_ray.evaluation.buildcache import scratch_dir as node_scratch_dir
from ksearch_ray.evaluation.builder import Builder
from ksearch_ray.evaluation.sandbox.isolation import Isolation
from ksearch_ray.evaluation.sandbox.protocol import GpuFacts
from ksearch_ray.models import Solution
from ksearch_ray.taskspec.task import find_task

_BUILDERS: dict[tuple[str, float, int, str], Builder] = {}


def node_cache(configured: str | None) -> BuildCache:
    """The build cache of the node this process runs on."""
    return BuildCache(node_scratch_dir(configured) / "build-cache")


def _builder(configured: str | None, timeout_s: float, max_jobs: int, isolation: str) -> Builder:
    root = str(node_scratch_dir(configured))
    key = (root, timeout_s, max_jobs, isolation)
    if key not in _BUILDERS:
        _BUILDERS[key] = Builder(Path(root) / "builders" / str(os.getpid()), node_cache(root), timeout_s=timeout_s,
                                 max_jobs=max_jobs, node=ray.get_runtime_context().get_node_id(),
                                 isolation=Isolation(isolation))
    return _BUILDERS[key]


@ray.remote(max_retries=0)
def warm_builder(scratch_dir: str | None, timeout_s: float, max_jobs: int,
                 isolation: str = "best-effort") -> tuple[int, float, str]:
    """Start this worker process's Builder and its sandbox's zygote (its imports take seconds), so that a build Ray
    gives this process later finds them ready. (pid, seconds the start took, why it failed or ""). It never raises:
    nobody waits for it, and a sandbox that cannot start fails the builds themselves, with their verdicts."""
    import time

    t0 = time.monotonic()
    try:
        _builder(scratch_dir, timeout_s, max_jobs, isolation).sandbox.ensure_started()
    except Exception as exc:  # noqa: BLE001  (reported by the builds, which meet the same sandbox)
        return os.getpid(), time.monotonic() - t0, f"{type(exc).__name__}: {exc}"[:300]
    return os.getpid(), time.monotonic() - t0, ""


@ray.remote(num_returns=2, max_retries=3)
def build_extension(solution: Solution, target: BuildTarget, scratch_dir: str | None, timeout_s: float,
                    max_jobs: int, isolation: str = "best-effort") -> tuple[BuildRecord, bytes | None]:
    """`isolation`: the run's (evaluation.isolation): a build runs the candidate's code too (its compiler
    input, its static initialisers at import)."""
    return _builder(scratch_dir, timeout_s, max_jobs, isolation).build(solution, target)


@ray.remote(num_returns=2, max_retries=3)
def build_triton(solution: Solution, target: BuildTarget, task_name: str, task_dirs: list[str], workload_set: str,
                 scratch_dir: str | None, timeout_s: float, max_jobs: int,
                 isolation: str = "best-effort", gpu: GpuFacts | None = None) -> tuple[BuildRecord, bytes | None]:
    """A Python candidate's Triton kernels compiled for `target` as `workload_set`'s workloads launch them;
    the second value is the pack of its Triton cache (evaluation/tritoncache.py). `max_jobs`: as for
    build_extension, so that both kinds of build share this process's Builder and its sandbox."""
    return _builder(scratch_dir, timeout_s, max_jobs, isolation).build_triton(
        solution, target, find_task(task_name, task_dirs), workload_set, gpu)
