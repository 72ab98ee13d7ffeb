"""The world model as an event-sourced state machine.

Every change to a run's tree is one named call with JSON arguments (the clock included), so
the WorldModelActor and a resumed driver replaying events.jsonl compute exactly the same trees
from the same pure functions in worldmodel/ops.py and worldmodel/select.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ksearch_ray.worldmodel.ops import apply_ops
from ksearch_ray.worldmodel.select import expire_leases, held_by, release, renew, select_and_lease
from ksearch_ray.worldmodel.tree import Tree


class WorldModelState:
    def __init__(self, tree: Tree, solution_exists: Callable[[str], bool]):
        self.tree = tree
        self.solution_exists = solution_exists

    def call(self, name: str, args: dict[str, Any]) -> Any:
        """Apply one named change; returns what the caller needs (JSON-serialisable)."""
        tree = self.tree
        if name == "apply":
            self.tree, report = apply_ops(tree, args["ops"], solution_exists=self.solution_exists,
                                          system=args.get("system", True), base_version=args.get("base_version"),
                                          max_new=args.get("max_new"))
            return report.model_dump(mode="json")
        if name == "select_and_lease":
            self.tree, ids = select_and_lease(
                tree, args["k"], args["holder"], args["now"], args["ttl"],
                max_difficulty=args["max_difficulty"], relax_when_speedup_at_least=args["relax_at"],
            )
            return ids
        if name == "renew":
            # A lease that expired (and perhaps went to another cycle) is not renewed: the caller learns
            # which it lost instead of crashing on it.
            held, lost = held_by(tree, args["ids"], args["holder"])
            self.tree = renew(tree, held, args["holder"], args["now"], args["ttl"])
            return lost
        if name == "release":
            held, lost = held_by(tree, args["ids"], args["holder"])
            self.tree = release(tree, held, args["holder"])
            return lost
        if name == "expire":
            self.tree, expired = expire_leases(tree, args["now"])
            return expired
        raise ValueError(f"unknown world-model call {name!r}")
