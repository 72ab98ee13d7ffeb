"""WorldModelActor: owns a run's tree, applies changes atomically, snapshots every version."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ray

from ksearch_ray.store import RunStore
from ksearch_ray.worldmodel.state import WorldModelState
from ksearch_ray.worldmodel.tree import Tree


@ray.remote(num_cpus=0)
class WorldModelActor:
    """Calls are serialised by the actor (max_concurrency 1), which makes each one atomic."""

    def __init__(self, run_dir: str, tree_json: str):
        self.store = RunStore(Path(run_dir))
        self.state = WorldModelState(Tree.model_validate_json(tree_json), self.store.has_solution)
        self._snapshot()

    def _snapshot(self) -> None:
        self.store.write_snapshot(self.state.tree.version, self.state.tree.model_dump_json(indent=1))

    def call(self, name: str, args: dict[str, Any]) -> Any:
        before = self.state.tree.version
        result = self.state.call(name, args)
        if self.state.tree.version != before:
            self._snapshot()
        return result

    def tree_json(self) -> str:
        return self.state.tree.model_dump_json()
