"""WorldModelActor: owns a run's tree, applies commands atomically, records every version (`tree_record`)."""

from __future__ import annotations

from pathlib import Path

import ray

from ksearch_ray.store import RunStore
from ksearch_ray.tree_record import TreeRecord
from ksearch_ray.worldmodel.state import WorldModelState
from ksearch_ray.worldmodel.tree import Tree


@ray.remote(num_cpus=0)
class WorldModelActor(WorldModelState):
    """The world model's own methods (`worldmodel.api`: `run(command)`, `apply_ops`, `select_and_lease`, ...),
    serialised by the actor (max_concurrency 1), which makes each one atomic."""

    def __init__(self, run_dir: str, tree_json: str):
        store = RunStore(Path(run_dir))
        tree = Tree.model_validate_json(tree_json)
        self.record = TreeRecord(store.root, tree)
        super().__init__(tree, store.has_solution, on_change=self.record.changed)

    def close(self) -> None:
        """The record's last checkpoint; the driver calls it before it lets the actor go."""
        self.record.close()

    def tree_json(self) -> str:
        return self.tree.model_dump_json()
