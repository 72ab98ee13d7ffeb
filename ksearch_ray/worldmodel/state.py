"""The world model as an event-sourced state machine.

Every change to a run's tree is one typed command (`worldmodel.api`, the clock included), so the
WorldModelActor and a resumed driver replaying events.jsonl compute exactly the same trees from the
same pure functions in worldmodel/ops.py and worldmodel/select.py.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ksearch_ray.worldmodel import select
from ksearch_ray.worldmodel.api import LeaseIds, RawOp, WorldModelApi
from ksearch_ray.worldmodel.ops import ApplyReport, EditOp, apply_ops
from ksearch_ray.worldmodel.tree import Tree


class WorldModelState(WorldModelApi):
    """The tree and the commands that change it. `on_change(tree, call)` hears of every command that ran
    (the actor records each new version with it)."""

    def __init__(self, tree: Tree, solution_exists: Callable[[str], bool],
                 on_change: Callable[[Tree, str], None] | None = None):
        self.tree = tree
        self.solution_exists = solution_exists
        self.on_change = on_change

    def _now(self, tree: Tree, call: str) -> None:
        self.tree = tree
        if self.on_change is not None:
            self.on_change(tree, call)

    def apply_ops(self, ops: Sequence[EditOp | RawOp], *, system: bool = True, base_version: int | None = None,
                  max_new: int | None = None) -> ApplyReport:
        tree, report = apply_ops(self.tree, ops, solution_exists=self.solution_exists, system=system,
                                 base_version=base_version, max_new=max_new)
        self._now(tree, "apply")
        return report

    def select_and_lease(self, k: int, holder: str, now: float, ttl: float, *, max_difficulty: int,
                         relax_at: float | None) -> LeaseIds:
        tree, ids = select.select_and_lease(self.tree, k, holder, now, ttl, max_difficulty=max_difficulty,
                                            relax_when_speedup_at_least=relax_at)
        self._now(tree, "select_and_lease")
        return ids

    def renew(self, ids: Sequence[str], holder: str, now: float, ttl: float) -> LeaseIds:
        # A lease that expired (and perhaps went to another cycle) is not renewed: the caller learns
        # which it lost instead of crashing on it.
        held, lost = select.held_by(self.tree, ids, holder)
        self._now(select.renew(self.tree, held, holder, now, ttl), "renew")
        return lost

    def release(self, ids: Sequence[str], holder: str) -> LeaseIds:
        held, lost = select.held_by(self.tree, ids, holder)
        self._now(select.release(self.tree, held, holder), "release")
        return lost

    def expire(self, now: float) -> LeaseIds:
        tree, expired = select.expire_leases(self.tree, now)
        self._now(tree, "expire")
        return expired
