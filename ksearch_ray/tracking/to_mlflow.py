"""MLflow as a tracker: one MLflow run per ksearch run, through `MlflowClient` (no global active run,
so several searches in one process each keep their own).

Where: `MLFLOW_TRACKING_URI` when set, else MLflow's SQLite store in the run directory
(`sqlite:///<run_dir>/mlflow.db`, artifacts in `<run_dir>/mlartifacts`; MLflow 3 keeps its file store in
maintenance mode, behind MLFLOW_ALLOW_FILE_STORE, so a new run does not use it); the experiment is
`MLFLOW_EXPERIMENT_NAME` or `ksearch-ray`. A resumed session sets the same run RUNNING again and
logs on; metrics use the round as their step, so the curves of every session are one history.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from ksearch_ray.config import RunConfig
from ksearch_ray.tracking.sink import EVALUATION_COLUMNS

EXPERIMENT = "ksearch-ray"
BATCH = 900  # MLflow takes at most 1000 metrics and 100 params in one batch


class MlflowTracker:
    name = "mlflow"

    def __init__(self, config: RunConfig, root: Path, previous: dict[str, Any] | None):
        own = f"sqlite:///{root / 'mlflow.db'}"
        self.uri = (previous or {}).get("tracking_uri") or os.environ.get("MLFLOW_TRACKING_URI") or own
        if self.uri.startswith("file:") or "://" not in self.uri:
            # A run tracked before the SQLite default (or a user's explicit file store): MLflow 3 opens it
            # only on request.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=self.uri)
        if previous and previous.get("run_id"):
            self.run_id: str = previous["run_id"]
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            name = os.environ.get("MLFLOW_EXPERIMENT_NAME", EXPERIMENT)
            experiment = self.client.get_experiment_by_name(name)
            # In the run's own store the artifacts stay beside it (MLflow would put them under the
            # current directory's ./mlartifacts); a user's tracking server keeps its own default.
            artifacts = (root / "mlartifacts").as_uri() if self.uri == own else None
            experiment_id = experiment.experiment_id if experiment else \
                self.client.create_experiment(name, artifact_location=artifacts)
            run = self.client.create_run(experiment_id, run_name=root.name, tags={
                "ksearch.task": config.task, "ksearch.method": config.search.method, "ksearch.run_dir": str(root)})
            self.run_id = run.info.run_id

    def state(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "tracking_uri": self.uri}

    def params(self, values: dict[str, Any], *, first: bool) -> None:
        values = {k: v if isinstance(v, str) else json.dumps(v) for k, v in values.items()}
        if first:
            items = [Param(k, v[:6000]) for k, v in sorted(values.items())]
            for i in range(0, len(items), 100):
                self.client.log_batch(self.run_id, params=items[i:i + 100])
        else:  # params cannot change in MLflow; a resumed session's budget is a tag
            self.client.log_batch(self.run_id, tags=[RunTag(f"resume.{k}", v) for k, v in sorted(values.items())
                                                     if k.startswith("budget.")])

    def log(self, metrics: dict[str, float], *, round_: int, seq: int, text: dict[str, str]) -> None:
        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, float(v), now, round_) for k, v in metrics.items()])

    def session_end(self, *, seq: int, summary: dict[str, Any], evaluations: list[list[Any]],
                    ledger: dict[str, dict[str, float]], best: dict[str, str] | None) -> None:
        rounds = int(summary["rounds"])
        now = int(time.time() * 1000)
        metrics = [Metric(f"llm.{role}.{field}", float(value), now, rounds)
                   for role, row in sorted(ledger.items()) for field, value in row.items()]
        for i in range(0, len(metrics), BATCH):
            self.client.log_batch(self.run_id, metrics=metrics[i:i + BATCH])
        self.client.log_batch(self.run_id, tags=[RunTag(f"ksearch.{k}", json.dumps(v) if not isinstance(v, str) else v)
                                                 for k, v in summary.items()])
        self.client.log_dict(self.run_id, ledger, "llm_ledger.json")
        self.client.log_dict(self.run_id, {"columns": EVALUATION_COLUMNS, "rows": evaluations}, "evaluations.json")
        self.client.log_dict(self.run_id, summary, "summary.json")
        for name, text in (best or {}).items():
            self.client.log_text(self.run_id, text, f"best/{name}")

    def finish(self, *, ok: bool) -> None:
        self.client.set_terminated(self.run_id, status="FINISHED" if ok else "KILLED")
