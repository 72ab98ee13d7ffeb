"""Experiment trackers as optional sinks of a run's events (`--track wandb`, `--track mlflow`).

A tracker is fed by `Search.record`, the one place events are appended and applied, so a live
session and a resumed one go through the same path; it never reads or writes events of its own.
Nothing of W&B or MLflow is imported unless the run asks for it (each is an extra of the
package), and a tracker that fails never stops the search (`sink.TrackingSink`).
"""

from __future__ import annotations

import importlib.util
import netrc
import os
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlparse

from ksearch_ray.config import ConfigError, RunConfig
from ksearch_ray.store import RunStore
from ksearch_ray.tracking.sink import TrackerFactory, TrackingSink

MODULE = {"wandb": "wandb", "mlflow": "mlflow"}
"""The module each tracker needs (mlflow-skinny provides `mlflow` too)."""


def check_trackers(config: RunConfig) -> None:
    """A tracker whose package is missing fails in one line, before Ray or a sandbox starts
    (an unknown name is refused by the configuration itself)."""
    for name in config.track:
        if importlib.util.find_spec(MODULE[name]) is None:
            raise ConfigError(f"--track {name} needs {install_hint(name)}")
    if "wandb" in config.track and not _wandb_can_start():
        raise ConfigError("--track wandb: not logged in to W&B (`wandb login`, WANDB_API_KEY) and not offline "
                          "(WANDB_MODE=offline keeps the run under RUN_DIR/wandb)")


def install_hint(extra: str) -> str:
    """How to add an extra where this package lives: from a checkout, the checkout itself
    (`ksearch-ray[...]` would fetch a release instead); else the released package."""
    package = Path(__file__).resolve().parents[1]
    if (package.parent / "pyproject.toml").is_file() and not (package / "bundled_tasks").is_dir():
        return f"`pip install '.[{extra}]'` (in {package.parent})"
    return f"`pip install 'ksearch-ray[{extra}]'`"


def _wandb_can_start() -> bool:
    """Online W&B without a key would ask for one on the terminal, in the middle of the run's live view."""
    if os.environ.get("WANDB_MODE", "").lower() in ("offline", "disabled", "dryrun") or os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"
    try:
        return netrc.netrc(os.environ.get("NETRC") or str(Path.home() / ".netrc")).authenticators(host) is not None
    except FileNotFoundError:
        return False
    except (netrc.NetrcParseError, OSError):
        return True  # cannot tell: W&B will say for itself


def open_trackers(config: RunConfig, store: RunStore, say: Callable[[str], None]) -> list[TrackingSink]:
    """The run's trackers, opened (or reopened, on resume, as the same tracked run)."""
    sinks = []
    for name in config.track:
        factory: TrackerFactory
        if name == "mlflow":
            from ksearch_ray.tracking.to_mlflow import MlflowTracker

            factory = MlflowTracker
        else:
            from ksearch_ray.tracking.to_wandb import WandbTracker

            factory = WandbTracker
        sinks.append(TrackingSink.open(name, factory, config, store, say))
    return sinks
