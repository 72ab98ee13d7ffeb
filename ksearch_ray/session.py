"""Starting and resuming a run's sessions: pre-flight checks, the run directory, Ray or not, the view.

A session runs on Ray (`distributed`: a local Ray of its own, or the cluster of `--ray-address`,
`RAY_ADDRESS` or `ray job submit`) unless the configuration says `cluster.ray: false`
(`ksearch run --no-ray`), which runs the same search in this process (`run.local`). Everything a
user can get wrong is checked before anything starts, and fails in one line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ksearch_ray.config import BUDGET_KEYS, ConfigError, RunConfig, validate_config
from ksearch_ray.evaluation.sandbox.handle import SandboxError
from ksearch_ray.events import Stopped
from ksearch_ray.run.engine import Search
from ksearch_ray.run.errors import RunInterrupted, RunStopped, SearchError
from ksearch_ray.run.progress import Reporter, make_reporter
from ksearch_ray.store import RunStore, versions
from ksearch_ray.taskspec.task import Task, find_task
from ksearch_ray.text import Redactor
from ksearch_ray.tracking import check_trackers, open_trackers


def check_model(config: RunConfig) -> None:
    """Fail before any work when the model cannot possibly answer."""
    llm = config.llm
    if llm.model is None:
        return
    if llm.api_base:
        url = llm.api_base.rstrip("/") + "/models"
        try:
            with urllib.request.urlopen(url, timeout=10):
                pass
        except urllib.error.HTTPError:
            pass  # the server answered: reachable (some servers have no /models)
        except (urllib.error.URLError, OSError) as exc:
            raise ConfigError(f"cannot reach the model endpoint {llm.api_base}: {getattr(exc, 'reason', exc)}") from None
        return
    if llm.api_key_env and not os.environ.get(llm.api_key_env):
        raise ConfigError(f"--api-key-env {llm.api_key_env} is not set in the environment")
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    check = litellm.validate_environment(model=llm.model)
    if not llm.api_key_env and not check.get("keys_in_environment", True):
        missing = ", ".join(check.get("missing_keys", [])) or "its API key"
        raise ConfigError(f"model {llm.model} needs {missing} in the environment")


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
    model = config.llm.model
    if model is None or config.llm.price_per_mtok is not None or price_known(model):
        return
    if config.budget.max_cost_usd is not None and config.budget.max_llm_tokens is None:
        raise ConfigError(f"--max-cost-usd needs a price for {model}, which litellm does not know: "
                          "give --price-per-mtok IN,OUT (USD per million tokens), or cap tokens with --max-llm-tokens")
    say(f"model {model} has no known price: its calls count $0 (give --price-per-mtok IN,OUT to count them)")


def check_inputs(config: RunConfig) -> Task:
    """What can be checked before Ray or a sandbox starts: the task, its workload set, the seed."""
    task = find_task(config.task, config.task_dirs)
    run_dir = config.run_dir
    check_job_run_dir(run_dir)
    if run_dir:
        where = Path(run_dir)
        if where.exists() and not where.is_dir():
            raise ConfigError(f"--run-dir {where}: exists and is not a directory")
        if (where / "manifest.json").exists():
            raise ConfigError(f"{where} already holds a run; use `ksearch resume {where}`")
    name = config.search.from_solution
    if name and not Path(name).exists():
        if name not in task.solution_names(include_unavailable=True):
            raise ConfigError(f"--from-solution: no solution of {task.name} or file named {name}")
        task.solution(name)  # a TaskError if it needs a module that is not installed
    if name and config.search.start == "spec":
        raise ConfigError("--from-solution and --start spec contradict each other: a run from the specification has no seed")
    device = config.evaluation.device or "cpu"
    task.workloads(config.evaluation.workloads or task.definition.default_workloads, device)  # validates the set name
    return task


RAY_JOB_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"
"""Set by Ray's job supervisor in the environment of a `ray job submit` entrypoint."""


def check_job_run_dir(run_dir: str | None) -> None:
    """A Ray job runs in a temporary copy of its working directory, which Ray deletes: a run directory
    there (the default `runs/...`, or any relative path) would vanish with the job, so it is refused."""
    if RAY_JOB_ENV not in os.environ:
        return
    here = Path.cwd().resolve()
    where = Path(run_dir).expanduser().resolve() if run_dir else None
    if where is None or where == here or here in where.parents:
        named = f"--run-dir {run_dir} is" if run_dir else "the default run directory (runs/ here) is"
        raise ConfigError(f"running as a Ray job, {named} inside the job's temporary working directory ({here}), which "
                          "Ray deletes: give --run-dir an absolute path on a disk the head node keeps "
                          "(e.g. --run-dir /home/ray/runs/NAME, or a shared file system)")


def absolute_paths(config: RunConfig) -> RunConfig:
    """Every path of the configuration made absolute against the current directory, once, here.

    Evaluators, sandboxes and later `ksearch resume`s run in other working directories: a relative
    path that reached them would name something else (or nothing).
    """
    def absolute(path: str) -> str:
        return str(Path(path).expanduser().resolve())

    settings: dict[str, Any] = {"task_dirs": [absolute(d) for d in config.task_dirs]}
    if config.run_dir:
        settings["run_dir"] = absolute(config.run_dir)
    if (Path(config.task) / "task.json").is_file():
        settings["task"] = absolute(config.task)
    if config.search.from_solution and Path(config.search.from_solution).exists():
        settings["search.from_solution"] = absolute(config.search.from_solution)
    return config.with_settings(settings)


def new_run_dir(config: RunConfig, task: Task) -> Path:
    if config.run_dir:
        return Path(config.run_dir)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return (Path("runs") / f"{task.name}-{stamp}-{secrets.token_hex(2)}").resolve()


class _Backend:
    """Ray or this process: how a session gets its cluster and its search."""

    def __init__(self, config: RunConfig):
        self.ray = config.cluster.ray
        self.started_ray = False

    def start(self, config: RunConfig, reporter: Reporter) -> None:
        if not self.ray:
            reporter.phase("running in this process (no Ray)")
            return
        from ksearch_ray.distributed.cluster import attaching, init_ray

        attach = attaching(config)
        reporter.phase("attaching to Ray" if attach else "starting Ray")
        init_ray(config)
        self.started_ray = not attach

    def stop(self) -> None:
        """A Ray this session started ends with it (a caller that lives on must not inherit it)."""
        if self.started_ray:
            from ksearch_ray.distributed.jobs import stop_ray

            stop_ray()

    def device(self, config: RunConfig) -> str:
        if config.evaluation.device == "cpu":
            return "cpu"
        import torch

        if not torch.cuda.is_available():
            from ksearch_ray.evaluation.gpu_driver import check

            check()  # a driver here that this torch cannot use: one line, before the run directory exists
        if config.evaluation.device:
            return config.evaluation.device
        if torch.cuda.is_available():
            return "cuda"
        if self.ray:
            from ksearch_ray.distributed.cluster import cluster_gpus

            return "cuda" if cluster_gpus() > 0 else "cpu"
        return "cpu"

    def check_evaluators(self, config: RunConfig) -> None:
        if self.ray:
            from ksearch_ray.distributed.pool import evaluator_count

            evaluator_count(config)  # no evaluator resources: say so before the run directory exists

    def facts(self) -> dict[str, Any]:
        if not self.ray:
            return {"ray": None}
        from ksearch_ray.distributed.cluster import resources

        return {"ray": {"resources": resources()}}

    def search(self, config: RunConfig, task: Task, store: RunStore, **options: Any) -> Search:
        if self.ray:
            from ksearch_ray.distributed.ray_backends import ray_search

            return ray_search(config, task, store, **options)
        from ksearch_ray.run.local import local_search

        return local_search(config, task, store, **options)


@contextlib.contextmanager
def _log_to(run_dir: Path) -> Iterator[None]:
    """The package's log lines (retries, provider errors, lost actors) go to RUN_DIR/driver.log, not to
    the terminal: the run's output is its own plain lines and live view."""
    handler = logging.FileHandler(run_dir / "driver.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger("ksearch_ray")
    before = logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = before
        handler.close()


def _execute(make_search: Callable[..., Search], config: RunConfig, store: RunStore, reporter: Reporter,
             **options: Any) -> Search:
    """Run the search to its end; an error or Ctrl-C is logged and leaves the run resumable. The run's
    trackers (`--track`) hear its events from the first recorded one and are closed however it ends."""
    store.redact = Redactor.from_environment([config.llm.api_key_env])
    with _log_to(store.root):
        trackers = open_trackers(config, store, reporter.line)
        ok = False
        try:
            search = _run(make_search(config, store, observers=trackers, **options), reporter)
            ok = search.view.finished is not None
            return search
        finally:
            for tracker in trackers:
                tracker.close(ok=ok)


def _run(search: Search, reporter: Reporter) -> Search:
    search.on_line = reporter.line
    reporter.attach(search)
    # `kill PID` (and a background job, where the shell ignores Ctrl-C) stops a run like Ctrl-C:
    # the run is left resumable and says how to resume it.
    # (Only the main thread may set a handler; a search started from another thread keeps Python's.)
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _interrupt) if main_thread else None
    try:
        asyncio.run(search.run())
        return search
    except KeyboardInterrupt:
        search.record(Stopped(reason="interrupted"))
        raise RunInterrupted(search.store.root) from None
    except (SearchError, SandboxError) as exc:
        message = str(getattr(exc, "cause", None) or exc)  # Ray wraps an actor's exception; keep its one line
        search.record(Stopped(reason=message))
        raise RunStopped(message, search.store.root) from None
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def start(config: RunConfig, *, progress: bool = True) -> Search:
    """A new run: checks, the run directory, then the search to its end (or an error, resumable)."""
    config = absolute_paths(config)
    check_inputs(config)  # an unknown task, set or seed fails before anything starts
    check_trackers(config)  # so does --track with a tracker that is not installed
    check_price(config, lambda text: None)  # a dollar budget without a price is refused before anything starts
    backend = _Backend(config)
    reporter = make_reporter(progress)
    try:
        check_model(config)
        check_price(config, reporter.line)
        backend.start(config, reporter)
        config = config.with_settings({"evaluation.device": backend.device(config)})
        task = check_inputs(config)
        backend.check_evaluators(config)
        run_dir = new_run_dir(config, task)
        config = config.with_settings({"run_dir": str(run_dir)})
        store = RunStore.create(run_dir, {
            "run_id": run_dir.name, "created": time.time(), "config": config.model_dump(mode="json"),
            "versions": versions(), "task_root": str(task.root), **backend.facts(),
        })
        reporter.phase(f"run directory {run_dir}")
        try:
            return _execute(lambda c, s, **o: backend.search(c, task, s, **o), config, store, reporter)
        finally:
            store.close()
    finally:
        backend.stop()
        reporter.close()


def resume(run_dir: Path, *, progress: bool = True, budget: dict[str, Any] | None = None) -> Search:
    """Continue a run where its event log stops; `budget` extends (or cuts) its budget from now on."""
    change = {k: v for k, v in (budget or {}).items() if v is not None}
    unknown = set(change) - set(BUDGET_KEYS)
    if unknown:
        raise ConfigError(f"resume can change only the budget ({', '.join(BUDGET_KEYS)}), not {', '.join(sorted(unknown))}")
    store = RunStore.open(Path(run_dir).resolve())
    reporter = make_reporter(progress)
    if store.repaired:
        reporter.line(store.repaired)
    try:
        from ksearch_ray.events import RunView

        view = RunView.of(store.read_events(), store.has_solution)
        manifest_config = dict(store.manifest().get("config") or {})
        manifest_config["budget"] = {**(manifest_config.get("budget") or {}), **view.budget, **change}
        config = validate_config(manifest_config, f"{store.root / 'manifest.json'}")
        if view.no_stream is not None:  # the endpoint was found not to stream: it is not asked to again
            config = config.with_settings({"llm.stream": False})
        check_trackers(config)
        check_model(config)
        check_price(config, reporter.line)
        backend = _Backend(config)
        try:
            backend.start(config, reporter)
            task = find_task(config.task, config.task_dirs)
            return _execute(lambda c, s, **o: backend.search(c, task, s, **o), config, store, reporter,
                            budget_change=change)
        finally:
            backend.stop()
    finally:
        store.close()
        reporter.close()
