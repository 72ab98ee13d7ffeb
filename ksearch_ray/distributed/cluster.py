"""Starting or attaching to Ray, and where driver-side actors go."""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path
from typing import Any

import ray

from ksearch_ray.config import RunConfig
from ksearch_ray.distributed.stale_agents import sweep_agents
from ksearch_ray.distributed.watchdog import guard
from ksearch_ray.run.errors import SearchError

_STARTED_HERE: str | None = None
"""The node id of the local Ray this process last started (a later ray.init elsewhere in the process may replace it)."""


def started_here() -> bool:
    """Whether this process started the Ray it uses now (a local one, which no autoscaler can grow)."""
    return ray.is_initialized() and ray.get_runtime_context().get_node_id() == _STARTED_HERE


def build_fits(build_cpus: float, build_resource: str | None) -> bool:
    """Whether a node of the cluster, alive now, could ever take a build task (by its total resources, not its
    free ones: a busy node's builds wait their turn)."""
    for node in ray.nodes():
        have = node.get("Resources", {}) if node.get("Alive") else {}
        if have.get("CPU", 0) >= build_cpus and (not build_resource or have.get(build_resource, 0) > 0):
            return True
    return False


def attaching(config: RunConfig) -> bool:
    """Whether `init_ray` will attach to a running cluster rather than start one here."""
    return ray.is_initialized() or bool(config.cluster.address or os.environ.get("RAY_ADDRESS"))


def local_cpus(config: RunConfig, cpu_count: int) -> int:
    """The CPUs a local Ray declares: this machine's, and never fewer than an evaluator and one build task ask
    for together. On a 2-core machine an evaluator (1 CPU) and a build task (2 CPUs) could otherwise never run
    at once, and the build would wait for ever; Ray's CPUs are what it schedules by, so the build runs, slower."""
    evaluators = config.evaluation.evaluators or 1
    needed = math.ceil(evaluators * config.evaluation.evaluator_cpus + config.cluster.build_cpus)
    return max(cpu_count, needed)


def init_ray(config: RunConfig) -> None:
    """Attach to a cluster (--ray-address, RAY_ADDRESS, or inside `ray job submit`) or start one here."""
    global _STARTED_HERE
    if ray.is_initialized():
        return
    address = config.cluster.address or os.environ.get("RAY_ADDRESS")
    try:
        if address:
            ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
            return
        # An embedded single-machine cluster: nothing to authenticate against (Ray 2.60 turns token
        # auth on by default; set RAY_AUTH_MODE yourself to keep it).
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        sweep_agents()  # agents an earlier cluster left behind (its driver killed with SIGKILL)
        package_parent = str(Path(__file__).resolve().parents[2])
        pythonpath = os.pathsep.join(p for p in (package_parent, os.environ.get("PYTHONPATH", "")) if p)
        # address="local": always a new cluster of our own. Without it ray.init() attaches to whatever
        # Ray another program left running on this machine, and dies with it. Workers' own output goes
        # to Ray's log files, not into the run's output (log_to_driver=False).
        ray.init(address="local", include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False,
                 num_cpus=local_cpus(config, os.cpu_count() or 1),
                 runtime_env={"env_vars": {"PYTHONPATH": pythonpath, "RAY_AUTH_MODE": os.environ["RAY_AUTH_MODE"]}})
        _STARTED_HERE = ray.get_runtime_context().get_node_id()
    except (ConnectionError, RuntimeError, TimeoutError, ValueError) as exc:
        # Ray's own start-up and connection failures (a raylet that did not come up, a wrong
        # address, an auth token missing): one line, not Ray's traceback.
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        where = f"the Ray cluster at {address}" if address else "a local Ray"
        raise SearchError(f"could not start or reach {where}: {first[:300]}") from None
    guard()  # the cluster dies with this driver, a `kill -9` included (distributed/watchdog.py)


def cluster_gpus() -> int:
    return int(ray.cluster_resources().get("GPU", 0))


def pinned() -> dict[str, Any]:
    """Driver-side actors live on the driver's node: they read and write the run directory."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    node = ray.get_runtime_context().get_node_id()
    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id=node, soft=False)}


def resources() -> dict[str, Any]:
    return dict(ray.cluster_resources())
