"""WorldModelActor: owns a run's tree, applies changes atomically, records every version (`tree_record`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ray

from ksearch_ray.store import RunStore
from ksearch_ray.tree_record import TreeRecord
from ksearch_ray.worldmodel.state import WorldModelState
from ksearch_ray.worldmodel.tree import Tree


@ray.remote(num_cpus=0)
class WorldModelActor:
    """Calls are serialised by the actor (max_concurrency 1), which makes each one atomic."""

    def __init__(self, run_dir: str, tree_json: str):
        self.store = RunStore(Path(run_dir))
        self.state = WorldModelState(Tree.model_validate_json(tree_json), self.store.has_solution)
        self.record = TreeRecord(self.store.root, self.state.tree)

    def call(self, name: str, args: dict[str, Any]) -> Any:
        result = self.state.call(name, args)
        self.record.changed(self.state.tree, name)
        return result

    def close(self) -> None:
        """The record's last checkpoint; the driver calls it before it lets the actor go."""
        self.record.close()

    def tree_json(self) -> str:
        return self.state.tree.model_dump_json()
