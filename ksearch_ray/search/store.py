"""The run directory: the single source of truth for a run.

    runs/<run-id>/
      manifest.json        config, versions, devices, created
      events.jsonl         append-only; every LLM call, candidate, evaluation, world-model call
      solutions/<id>.json  code by content hash (failures included)
      world_model/         v<version>.json snapshots and latest.json
      llm_cache/           replayable LLM responses (content-hash keyed)
      best.json            the best passing solution so far, rewritten as it improves

Events are written by one process (the driver), one JSON line each, flushed and fsynced; a
line cut short by SIGKILL is dropped when the log is reopened. Resume folds the events.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any

from ksearch_ray.models import Solution


class RunDirError(Exception):
    """A run directory that cannot be used; the message is one line."""


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def versions() -> dict[str, str]:
    import ray
    import torch
    import triton

    import ksearch_ray

    return {
        "ksearch_ray": ksearch_ray.__version__, "python": platform.python_version(), "torch": torch.__version__,
        "triton": triton.__version__, "ray": ray.__version__,
    }


class RunStore:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.events_path = self.root / "events.jsonl"
        self.solutions_dir = self.root / "solutions"
        self.snapshots_dir = self.root / "world_model"
        self.cache_dir = self.root / "llm_cache"
        self._seq = 0
        self._fh: Any = None

    # --- creation / opening -----------------------------------------------------------------

    @classmethod
    def create(cls, root: Path, manifest: dict[str, Any]) -> RunStore:
        root = Path(root)
        if (root / "manifest.json").exists():
            raise RunDirError(f"{root} already holds a run; use `ksearch resume {root}`")
        for sub in ("solutions", "world_model", "llm_cache"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        store = cls(root)
        _atomic_write(root / "manifest.json", json.dumps(manifest, indent=2, default=str))
        store._open()
        return store

    @classmethod
    def open(cls, root: Path) -> RunStore:
        root = Path(root)
        if not (root / "manifest.json").is_file():
            raise RunDirError(f"{root} is not a run directory (no manifest.json)")
        store = cls(root)
        store._open()
        return store

    def manifest(self) -> dict[str, Any]:
        return json.loads((self.root / "manifest.json").read_text())

    def _open(self) -> None:
        events = self.read_events(repair=True)
        self._seq = events[-1]["seq"] if events else 0
        self._fh = open(self.events_path, "a", encoding="utf-8")  # noqa: SIM115  (held for the run)

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    # --- events -------------------------------------------------------------------------------

    def append(self, kind: str, **payload: Any) -> dict[str, Any]:
        self._seq += 1
        event = {"seq": self._seq, "t": time.time(), "kind": kind, **payload}
        self._fh.write(json.dumps(event, default=str) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())
        return event

    def read_events(self, *, repair: bool = False) -> list[dict[str, Any]]:
        if not self.events_path.exists():
            return []
        raw = self.events_path.read_bytes()
        events: list[dict[str, Any]] = []
        good_bytes = 0
        for line in raw.splitlines(keepends=True):
            cut_short = not line.endswith(b"\n")  # only the last line can be: a kill mid-write
            try:
                event = json.loads(line)
            except ValueError:
                if not cut_short:
                    raise RunDirError(f"{self.events_path}: corrupt line after event {len(events)}") from None
                break
            if cut_short:
                break
            events.append(event)
            good_bytes += len(line)
        if repair and good_bytes < len(raw):
            with open(self.events_path, "r+b") as f:
                f.truncate(good_bytes)
        return events

    # --- solutions, snapshots, best -------------------------------------------------------------

    def save_solution(self, solution: Solution) -> str:
        path = self.solutions_dir / f"{solution.id}.json"
        if not path.exists():
            _atomic_write(path, solution.model_dump_json(indent=1))
        return solution.id

    def has_solution(self, solution_id: str) -> bool:
        return (self.solutions_dir / f"{solution_id}.json").is_file()

    def load_solution(self, solution_id: str) -> Solution:
        return Solution.model_validate_json((self.solutions_dir / f"{solution_id}.json").read_text())

    def write_snapshot(self, version: int, tree_json: str) -> None:
        _atomic_write(self.snapshots_dir / f"v{version:05d}.json", tree_json)
        _atomic_write(self.snapshots_dir / "latest.json", tree_json)

    def write_best(self, payload: dict[str, Any]) -> None:
        _atomic_write(self.root / "best.json", json.dumps(payload, indent=2, default=str))
