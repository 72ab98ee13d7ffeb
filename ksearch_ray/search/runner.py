"""Starting and resuming a search: run directory, Ray, pre-flight checks, the progress view."""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import ray
from pydantic import ValidationError

from ksearch_ray.config import ConfigError, RunConfig
from ksearch_ray.evaluation.sandbox.client import SandboxError
from ksearch_ray.search.driver import ray_search
from ksearch_ray.search.engine import Search
from ksearch_ray.search.errors import RunInterrupted, RunStopped, SearchError
from ksearch_ray.search.evaluators import evaluator_count
from ksearch_ray.search.progress import Reporter, make_reporter
from ksearch_ray.search.runstate import RunState, fold
from ksearch_ray.search.store import RunStore, versions
from ksearch_ray.taskspec.task import Task, find_task


def init_ray(config: RunConfig) -> None:
    """Attach to a cluster (--ray-address, RAY_ADDRESS, or inside `ray job submit`) or start one here."""
    if ray.is_initialized():
        return
    address = config.ray_address or os.environ.get("RAY_ADDRESS")
    try:
        if address:
            ray.init(address=address, logging_level=logging.WARNING)
            return
        # An embedded single-machine cluster: nothing to authenticate against (Ray 2.60 turns token
        # auth on by default; set RAY_AUTH_MODE yourself to keep it).
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        package_parent = str(Path(__file__).resolve().parents[2])
        pythonpath = os.pathsep.join(p for p in (package_parent, os.environ.get("PYTHONPATH", "")) if p)
        # address="local": always a new cluster of our own. Without it ray.init() attaches to whatever
        # Ray another program left running on this machine, and dies with it.
        ray.init(address="local", include_dashboard=False, logging_level=logging.WARNING,
                 runtime_env={"env_vars": {"PYTHONPATH": pythonpath, "RAY_AUTH_MODE": os.environ["RAY_AUTH_MODE"]}})
    except (ConnectionError, RuntimeError, TimeoutError, ValueError) as exc:
        # Ray's own start-up and connection failures (a raylet that did not come up, a wrong
        # address, an auth token missing): one line, not Ray's traceback.
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        where = f"the Ray cluster at {address}" if address else "a local Ray"
        raise SearchError(f"could not start or reach {where}: {first[:300]}") from None


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


def price_known(model: str) -> bool:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    try:
        info = litellm.get_model_info(model)
    except Exception:  # noqa: BLE001  (litellm raises for any model it has no entry for)
        return False
    return bool(info.get("input_cost_per_token") or info.get("output_cost_per_token"))


def check_price(config: RunConfig, say: Callable[[str], None]) -> None:
    """A model without a price counts $0 a call: say so at the start, and refuse a dollar budget
    that could never be reached."""
    if config.model is None or config.price_per_mtok is not None or price_known(config.model):
        return
    if config.max_cost_usd is not None and config.max_llm_tokens is None:
        raise ConfigError(f"--max-cost-usd needs a price for {config.model}, which litellm does not know: "
                          "give --price-per-mtok IN,OUT (USD per million tokens), or cap tokens with --max-llm-tokens")
    say(f"model {config.model} has no known price: its calls count $0 (give --price-per-mtok IN,OUT to count them)")


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


def absolute_paths(config: RunConfig) -> RunConfig:
    """Every path of the configuration made absolute against the current directory, once, here.

    Evaluators, sandboxes and later `ksearch resume`s run in other working directories: a
    relative path that reached them would name something else (or nothing).
    """
    def absolute(path: str) -> str:
        return str(Path(path).expanduser().resolve())

    updates: dict[str, object] = {"task_dirs": [absolute(d) for d in config.task_dirs]}
    if config.run_dir:
        updates["run_dir"] = absolute(config.run_dir)
    if (Path(config.task) / "task.json").is_file():
        updates["task"] = absolute(config.task)
    if config.from_solution and Path(config.from_solution).exists():
        updates["from_solution"] = absolute(config.from_solution)
    return config.model_copy(update=updates)


def new_run_dir(config: RunConfig, task: Task) -> Path:
    if config.run_dir:
        return Path(config.run_dir)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return (Path("runs") / f"{task.name}-{stamp}-{secrets.token_hex(2)}").resolve()


def _execute(search: Search, reporter: Reporter) -> RunState:
    """Run the search to its end; an error or Ctrl-C is logged and leaves the run resumable."""
    search.on_line = reporter.line
    reporter.attach(search)
    # `kill PID` (and a background job, where the shell ignores Ctrl-C) stops a run like Ctrl-C:
    # the run is left resumable and says how to resume it.
    # (Only the main thread may set a handler; a search started from another thread keeps Python's.)
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _interrupt) if main_thread else None
    try:
        return asyncio.run(search.run())
    except KeyboardInterrupt:
        search.store.append("stopped", reason="interrupted")
        raise RunInterrupted(search.store.root) from None
    except (SearchError, SandboxError) as exc:
        message = str(getattr(exc, "cause", None) or exc)  # Ray wraps an actor's exception; keep its one line
        search.store.append("stopped", reason=message)
        raise RunStopped(message, search.store.root) from None
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def start(config: RunConfig, *, progress: bool = True) -> tuple[Path, RunState]:
    config = absolute_paths(config)
    find_task(config.task, config.task_dirs)  # an unknown task fails before anything starts
    if config.run_dir:
        where = Path(config.run_dir)
        if where.exists() and not where.is_dir():
            raise ConfigError(f"--run-dir {where}: exists and is not a directory")
        if (where / "manifest.json").exists():
            raise ConfigError(f"{where} already holds a run; use `ksearch resume {where}`")
    check_price(config, lambda text: None)  # a dollar budget without a price is refused before anything starts
    reporter = make_reporter(progress)
    try:
        check_model(config)
        check_price(config, reporter.line)
        reporter.phase("starting Ray" if not ray.is_initialized() else "attaching to Ray")
        init_ray(config)
        config, task = resolve(config)
        evaluator_count(config)  # no evaluator resources: say so before the run directory exists
        run_dir = new_run_dir(config, task)
        config = config.model_copy(update={"run_dir": str(run_dir)})
        store = RunStore.create(run_dir, {
            "run_id": run_dir.name, "created": time.time(), "config": config.model_dump(mode="json"),
            "versions": versions(), "task_root": str(task.root), "ray": {"resources": ray.cluster_resources()},
        })
        reporter.phase(f"run directory {run_dir}")
        try:
            return run_dir, _execute(ray_search(config, task, store), reporter)
        finally:
            store.close()
    finally:
        reporter.close()


BUDGET_KEYS = ("rounds", "max_cost_usd", "max_wall_s")
"""What `ksearch resume` may change: the budget, never what the run searches."""


def resume(run_dir: Path, *, progress: bool = True, budget: dict[str, object] | None = None) -> RunState:
    """Continue a run where its event log stops; `budget` extends (or cuts) its budget from now on."""
    change = {k: v for k, v in (budget or {}).items() if v is not None}
    unknown = set(change) - set(BUDGET_KEYS)
    if unknown:
        raise ConfigError(f"resume can change only {', '.join(BUDGET_KEYS)}, not {', '.join(sorted(unknown))}")
    store = RunStore.open(Path(run_dir).resolve())
    reporter = make_reporter(progress)
    try:
        state = fold(store.read_events(), store.has_solution)
        try:
            config = RunConfig.model_validate({**store.manifest()["config"], **state.budget, **change})
        except ValidationError as exc:
            first = exc.errors()[0]
            raise ConfigError(f"{'.'.join(str(x) for x in first['loc'])}: {first['msg']}") from None
        check_model(config)
        check_price(config, reporter.line)
        reporter.phase("starting Ray" if not ray.is_initialized() else "attaching to Ray")
        init_ray(config)
        task = find_task(config.task, config.task_dirs)
        return _execute(ray_search(config, task, store, budget_change=change), reporter)
    finally:
        store.close()
        reporter.close()
