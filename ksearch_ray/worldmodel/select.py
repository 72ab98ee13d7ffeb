"""Which action runs next: the open frontier, the deterministic selection policy, and leases.

The frontier is every open action whose parent already has a solution (or is the root): the only
actions a cycle can start, because an action is implemented on top of its parent's code.

Leases make parallel cycles safe: a selected node is leased to one cycle (status `leased`, an entry
in `Tree.leases`), which takes it off the frontier until the cycle attaches a solution, marks it
too hard, releases it, or dies and lets the lease expire. `select_and_lease` does both steps in one
function so the actor cannot hand one node to two cycles.

Leasing, releasing and expiring bump the tree version, like an edit batch: the actor records every
version (`tree_record`). Renewing a lease does not: it only moves an expiry time, happens after every
attempt of every cycle, and would otherwise add a record each time (the next version's carries it).

When every frontier action is above the difficulty limit, selection does what the reference
implementation does: it takes the best of them anyway (the gate orders work, it must not stop the
search).
"""

from __future__ import annotations

from collections.abc import Iterable

from ksearch_ray.worldmodel.tree import (
    ROOT_ID,
    ActionNode,
    Lease,
    NodeStatus,
    Tree,
    WorldModelError,
    best_speedup,
)

DEFAULT_MAX_DIFFICULTY = 4
DEFAULT_RELAX_AT_SPEEDUP = 1.5


class LeaseError(WorldModelError):
    """A lease request the actor should never make: the node is taken, missing, or not on the frontier."""


def _rank_key(node: ActionNode) -> tuple[float, int, bool, float, int]:
    # Score desc, difficulty asc, rating desc (unrated last), then creation order for determinism.
    return (-node.score, node.difficulty, node.rating is None, -(node.rating or 0.0), node.seq)


def _is_frontier(tree: Tree, node: ActionNode) -> bool:
    if node.status is not NodeStatus.OPEN or node.solution is not None:
        return False
    parent = tree.get(node.parent)
    return node.parent == ROOT_ID or (isinstance(parent, ActionNode) and parent.status is NodeStatus.DONE)


def frontier(tree: Tree) -> list[ActionNode]:
    """The whole open frontier, best first, before difficulty gating."""
    return sorted((n for n in tree.nodes.values() if _is_frontier(tree, n)), key=_rank_key)


def difficulty_limit(
    tree: Tree,
    *,
    max_difficulty: int = DEFAULT_MAX_DIFFICULTY,
    relax_when_speedup_at_least: float | None = DEFAULT_RELAX_AT_SPEEDUP,
) -> int:
    """The hardest difficulty selection may return now.

    Hard actions wait until the search has a good solution to build on: early on, a cheap win
    teaches the planner more than a long shot. `None` never relaxes the gate.
    """
    best = best_speedup(tree)
    if relax_when_speedup_at_least is not None and best is not None and best >= relax_when_speedup_at_least:
        return 5
    return max_difficulty


def select_frontier(
    tree: Tree,
    k: int,
    *,
    max_difficulty: int = DEFAULT_MAX_DIFFICULTY,
    relax_when_speedup_at_least: float | None = DEFAULT_RELAX_AT_SPEEDUP,
) -> list[str]:
    """Ids of the best `k` frontier actions that pass the difficulty gate, best first; if none
    passes it, the best `k` of the whole frontier."""
    limit = difficulty_limit(
        tree, max_difficulty=max_difficulty, relax_when_speedup_at_least=relax_when_speedup_at_least
    )
    open_nodes = frontier(tree)
    gated = [n.id for n in open_nodes if n.difficulty <= limit]
    return (gated or [n.id for n in open_nodes])[: max(k, 0)]


def lease(tree: Tree, node_ids: Iterable[str], holder: str, now: float, ttl: float) -> Tree:
    """Lease frontier nodes to `holder` until `now + ttl`. Raises LeaseError if any cannot be leased."""
    ids = _unique(node_ids)
    if ttl <= 0:
        raise ValueError(f"lease ttl must be positive, got {ttl}")
    if not holder:
        raise ValueError("a lease needs a holder")
    out = _shallow(tree)
    for node_id in ids:
        node = out.nodes.get(node_id)
        if node is None:
            raise LeaseError(f"no node {node_id}")
        if node.status is NodeStatus.LEASED:
            raise LeaseError(f"{node_id} is already leased to {out.leases[node_id].holder}")
        if not _is_frontier(out, node):
            raise LeaseError(f"{node_id} is not on the frontier (status {node.status}, parent {node.parent})")
        out.nodes[node_id] = node.model_copy(update={"status": NodeStatus.LEASED, "changed_at_version": tree.version + 1})
        out.leases[node_id] = Lease(node_id=node_id, holder=holder, granted_at=now, expires_at=now + ttl)
    return _bumped(out, tree, changed=bool(ids))


def select_and_lease(
    tree: Tree,
    k: int,
    holder: str,
    now: float,
    ttl: float,
    *,
    max_difficulty: int = DEFAULT_MAX_DIFFICULTY,
    relax_when_speedup_at_least: float | None = DEFAULT_RELAX_AT_SPEEDUP,
) -> tuple[Tree, list[str]]:
    """Select up to `k` actions and lease them to `holder` in one step; returns the tree and the ids."""
    ids = select_frontier(
        tree, k, max_difficulty=max_difficulty, relax_when_speedup_at_least=relax_when_speedup_at_least
    )
    return lease(tree, ids, holder, now, ttl), ids


def renew(tree: Tree, node_ids: Iterable[str], holder: str, now: float, ttl: float) -> Tree:
    """Extend `holder`'s leases to `now + ttl`: the heartbeat of a long cycle. The version stays."""
    ids = _unique(node_ids)
    if ttl <= 0:
        raise ValueError(f"lease ttl must be positive, got {ttl}")
    out = tree.model_copy(update={"leases": dict(tree.leases)})
    for node_id in ids:
        current = _held(out, node_id, holder)
        out.leases[node_id] = current.model_copy(update={"expires_at": max(current.expires_at, now + ttl)})
    return out


def release(tree: Tree, node_ids: Iterable[str], holder: str) -> Tree:
    """Give `holder`'s leases back: the nodes return to the frontier untouched.

    Raises LeaseError for a lease `holder` does not hold, e.g. one that expired and went to
    another cycle: releasing it would take the node from under that cycle.
    """
    ids = _unique(node_ids)
    out = _shallow(tree)
    for node_id in ids:
        _held(out, node_id, holder)
        del out.leases[node_id]
        out.nodes[node_id] = out.nodes[node_id].model_copy(update={"status": NodeStatus.OPEN,
                                                                   "changed_at_version": tree.version + 1})
    return _bumped(out, tree, changed=bool(ids))


def expire_leases(tree: Tree, now: float) -> tuple[Tree, list[str]]:
    """Return every node whose lease expired at or before `now` to the frontier; returns the tree and their ids.

    An expired lease means its cycle died or stopped reporting; the action itself is still worth trying.
    """
    expired = sorted(
        (i for i, held in tree.leases.items() if held.expires_at <= now), key=lambda i: tree.nodes[i].seq
    )
    out = _shallow(tree)
    for node_id in expired:
        del out.leases[node_id]
        out.nodes[node_id] = out.nodes[node_id].model_copy(update={"status": NodeStatus.OPEN,
                                                                   "changed_at_version": tree.version + 1})
    return _bumped(out, tree, changed=bool(expired)), expired


def held_by(tree: Tree, node_ids: Iterable[str], holder: str) -> tuple[list[str], list[str]]:
    """(ids `holder` still holds, ids it does not: expired, or leased to another cycle since)."""
    held: list[str] = []
    lost: list[str] = []
    for node_id in _unique(node_ids):
        current = tree.leases.get(node_id)
        (held if current is not None and current.holder == holder else lost).append(node_id)
    return held, lost


def leases_of(tree: Tree, holder: str) -> list[str]:
    return sorted(
        (i for i, held in tree.leases.items() if held.holder == holder), key=lambda i: tree.nodes[i].seq
    )


def _held(tree: Tree, node_id: str, holder: str) -> Lease:
    current = tree.leases.get(node_id)
    if current is None:
        raise LeaseError(f"{node_id} is not leased")
    if current.holder != holder:
        raise LeaseError(f"{node_id} is leased to {current.holder}, not {holder}")
    return current


def _unique(node_ids: Iterable[str]) -> list[str]:
    ids = list(node_ids)
    if len(set(ids)) != len(ids):
        raise LeaseError(f"node ids repeat in one lease request: {ids}")
    return ids


def _shallow(tree: Tree) -> Tree:
    """A copy that shares its nodes: these functions replace the nodes they change, never edit them."""
    return tree.model_copy(update={"nodes": dict(tree.nodes), "leases": dict(tree.leases)})


def _bumped(new: Tree, old: Tree, *, changed: bool) -> Tree:
    if changed:
        new.version = old.version + 1
    return new
