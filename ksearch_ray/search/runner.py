"""Starting and resuming a search: run directory, Ray, pre-flight checks, the progress view."""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import ray

from ksearch_ray.config import ConfigError, RunConfig
from ksearch_ray.search.driver import Search
from ksearch_ray.search.evaluators import evaluator_count
from ksearch_ray.search.progress import ProgressView
from ksearch_ray.search.runstate import RunState
from ksearch_ray.search.store import RunStore, versions
from ksearch_ray.taskspec.task import Task, find_task


def init_ray(config: RunConfig) -> None:
    """Attach to a cluster (--ray-address, RAY_ADDRESS, or inside `ray job submit`) or start one here."""
    if ray.is_initialized():
        return
    address = config.ray_address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, logging_level=logging.WARNING)
        return
    # An embedded single-machine cluster: nothing to authenticate against (Ray 2.60 turns token
    # auth on by default; set RAY_AUTH_MODE yourself to keep it).
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    package_parent = str(Path(__file__).resolve().parents[2])
    pythonpath = os.pathsep.join(p for p in (package_parent, os.environ.get("PYTHONPATH", "")) if p)
    ray.init(include_dashboard=False, logging_level=logging.WARNING,
             runtime_env={"env_vars": {"PYTHONPATH": pythonpath, "RAY_AUTH_MODE": os.environ["RAY_AUTH_MODE"]}})


def check_model(config: RunConfig) -> None:
    """Fail before any work when the model cannot possibly answer."""
    if config.model is None:
        return
    if config.api_base:
        url = config.api_base.rstrip("/") + "/models"
        try:
            with urllib.request.urlopen(url, timeout=10):
                pass
        except urllib.error.HTTPError:
            pass  # the server answered: reachable (some servers have no /models)
        except (urllib.error.URLError, OSError) as exc:
            raise ConfigError(f"cannot reach the model endpoint {config.api_base}: {getattr(exc, 'reason', exc)}") from None
        return
    if config.api_key_env and not os.environ.get(config.api_key_env):
        raise ConfigError(f"--api-key-env {config.api_key_env} is not set in the environment")
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    check = litellm.validate_environment(model=config.model)
    if not config.api_key_env and not check.get("keys_in_environment", True):
        missing = ", ".join(check.get("missing_keys", [])) or "its API key"
        raise ConfigError(f"model {config.model} needs {missing} in the environment")


def resolve(config: RunConfig) -> tuple[RunConfig, Task]:
    task = find_task(config.task, config.task_dirs)
    device = config.device
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() or int(ray.cluster_resources().get("GPU", 0)) > 0 else "cpu"
    config = config.model_copy(update={"device": device})
    task.workloads(config.workloads or task.definition.default_workloads, device)  # validates the set name
    if config.from_solution and not Path(config.from_solution).exists():
        if config.from_solution not in task.solution_names(include_unavailable=True):
            raise ConfigError(f"--from-solution: no solution of {task.name} or file named {config.from_solution}")
        task.solution(config.from_solution)  # a TaskError if it needs a module that is not installed
    return config, task


def new_run_dir(config: RunConfig, task: Task) -> Path:
    if config.run_dir:
        return Path(config.run_dir)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{task.name}-{stamp}-{secrets.token_hex(2)}"


def _execute(search: Search, progress: bool) -> RunState:
    async def go() -> RunState:
        return await search.run()

    if not progress or not sys.stderr.isatty():  # a live view is noise in job logs and pipes
        return asyncio.run(go())
    with ProgressView() as view:
        search.on_change = view.update
        return asyncio.run(go())


def start(config: RunConfig, *, progress: bool = True) -> tuple[Path, RunState]:
    find_task(config.task, config.task_dirs)  # an unknown task fails before anything starts
    if config.run_dir and (Path(config.run_dir) / "manifest.json").exists():
        raise ConfigError(f"{config.run_dir} already holds a run; use `ksearch resume {config.run_dir}`")
    check_model(config)
    init_ray(config)
    config, task = resolve(config)
    evaluator_count(config)  # no evaluator resources: say so before the run directory exists
    run_dir = new_run_dir(config, task)
    store = RunStore.create(run_dir, {
        "run_id": run_dir.name, "created": time.time(), "config": config.model_dump(mode="json"),
        "versions": versions(), "task_root": str(task.root), "ray": {"resources": ray.cluster_resources()},
    })
    try:
        return run_dir, _execute(Search(config, task, store), progress)
    finally:
        store.close()


def resume(run_dir: Path, *, progress: bool = True) -> RunState:
    store = RunStore.open(run_dir)
    try:
        config = RunConfig.model_validate(store.manifest()["config"])
        check_model(config)
        init_ray(config)
        task = find_task(config.task, config.task_dirs)
        return _execute(Search(config, task, store), progress)
    finally:
        store.close()
