"""Weights & Biases as a tracker: one W&B run per ksearch run, its files under `<run_dir>/wandb`.

Online or offline is W&B's own choice (`WANDB_MODE=offline`: nothing leaves the machine; `wandb sync
--id ID <run_dir>/wandb/offline-run-*` uploads the sessions later, in order, into one run). The
project is `WANDB_PROJECT` or `ksearch-ray`. The run's id is kept in tracking.json and a resumed
session asks for it again (`resume="allow"`; offline, W&B starts a new local directory of the same id).
Every log's step is the event's place in events.jsonl, which only grows, across sessions too, so a
resumed session's history follows the first's; `round` is each figure's x-axis (`define_metric`).
W&B's console capture is off: the run's output is its own. W&B's artifact staging, cache and
downloads go under `<run_dir>/wandb/` too (not ~/.cache or ~/.local/share), unless the user set
their variables.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

import wandb

from ksearch_ray.config import RunConfig
from ksearch_ray.events import LEDGER_FIELDS
from ksearch_ray.tracking.sink import EVALUATION_COLUMNS

PROJECT = "ksearch-ray"
# Where W&B writes outside its run directory unless told: staging of artifacts (WANDB_DATA_DIR), the
# artifact cache (WANDB_CACHE_DIR) and downloads (WANDB_ARTIFACT_DIR), all under the home by default.
_PLACES = {"WANDB_DATA_DIR": "staging", "WANDB_CACHE_DIR": "cache", "WANDB_ARTIFACT_DIR": "artifacts"}
_SET_BY_US: dict[str, str] = {}


def _keep_files_in(folder: Path) -> None:
    """W&B's places under `folder` (this run's), except those the user chose."""
    for variable, name in _PLACES.items():
        if variable in os.environ and os.environ[variable] != _SET_BY_US.get(variable):
            continue  # the user's own choice
        path = folder / name
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.environ[variable] = _SET_BY_US[variable] = str(path)


def _after_the_last_session(folder: Path, run_id: str) -> None:
    """Offline, a session's directory is named by the second it began (offline-run-<time>-<id>): a
    session that began in the same second as the last one would write into that one's directory."""
    made = [p.stat().st_mtime for p in folder.glob(f"*-{run_id}") if p.is_dir() and not p.is_symlink()]
    wait = max(made, default=0.0) + 1.1 - time.time()
    if wait > 0:
        time.sleep(wait)


class WandbTracker:
    name = "wandb"

    def __init__(self, config: RunConfig, root: Path, previous: dict[str, Any] | None):
        self.root = root
        run_id = (previous or {}).get("id")  # none: W&B makes one, kept in tracking.json
        if run_id:
            _after_the_last_session(root / "wandb", run_id)
        _keep_files_in(root / "wandb")
        self.run = wandb.init(
            project=(previous or {}).get("project") or os.environ.get("WANDB_PROJECT", PROJECT), dir=str(root),
            id=run_id, resume="allow", name=root.name, tags=[config.task, config.search.method],
            job_type="search", reinit="create_new",
            settings=wandb.Settings(console="off", silent=True, disable_job_creation=True),
        )
        self.run.define_metric("round")
        self.run.define_metric("*", step_metric="round")

    def state(self) -> dict[str, Any]:
        return {"id": self.run.id, "project": self.run.project, "dir": str(Path(self.run.dir).parent)}

    def params(self, values: dict[str, Any], *, first: bool) -> None:
        self.run.config.update(values, allow_val_change=True)  # a resume may change the budget

    def log(self, metrics: dict[str, float], *, round_: int, seq: int, text: dict[str, str]) -> None:
        self.run.log({**metrics, **text, "round": round_}, step=seq)

    def session_end(self, *, seq: int, summary: dict[str, Any], evaluations: list[list[Any]],
                    ledger: dict[str, dict[str, float]], best: dict[str, str] | None) -> None:
        self.run.summary.update({**{k: v for k, v in summary.items() if v is not None}, "llm": ledger})
        rows = [[role, *(row[f] for f in LEDGER_FIELDS)] for role, row in sorted(ledger.items())]
        self.run.log({
            "evaluations": wandb.Table(columns=list[str | int](EVALUATION_COLUMNS), data=evaluations, allow_mixed_types=True),
            "llm_ledger": wandb.Table(columns=list[str | int](["role", *LEDGER_FIELDS]), data=rows, allow_mixed_types=True),
            "round": int(summary["rounds"]),
        }, step=seq)
        if best:
            # The sources as files of the run (synced with it) and as a versioned artifact.
            folder = Path(self.run.dir) / "best"
            folder.mkdir(exist_ok=True)
            artifact = wandb.Artifact(re.sub(r"[^A-Za-z0-9_.-]", "-", f"best-{self.root.name}"), type="code")
            for name, text in best.items():
                (folder / name).write_text(text)
                artifact.add_file(str(folder / name), name=name)
            self.run.log_artifact(artifact)

    def finish(self, *, ok: bool) -> None:
        self.run.finish(exit_code=0 if ok else 1)
