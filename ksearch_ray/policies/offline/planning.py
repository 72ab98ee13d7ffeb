"""The offline policy as planner: initialize, propose, refine and too-hard replies.

See `ksearch_ray.policies.offline.offline_policy` for the whole design.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ksearch_ray.policies.contract import Attempt, PlanRequest
from ksearch_ray.policies.offline.configs import (
    ActionSpec,
    _Candidate,
    _diff,
    _neighbours,
    _Space,
    parse_action,
)
from ksearch_ray.policies.offline.model import (
    _attempt_speedups,
    _Effect,
    _fit,
    _insert_op,
    _Observation,
    _observations,
    _Ranker,
    _tree_speedups,
)
from ksearch_ray.worldmodel.tree import ROOT_ID, ActionNode, NodeStatus

REFINE_CHILDREN = 3


# ---------------------------------------------------------------------------------------- planning


def _plan_ops(request: PlanRequest) -> tuple[list[dict[str, Any]], str | None]:
    space = _Space(request.tree, request.solutions, request.seeds)
    if not space.seeds:
        return [], "no seed kernel declares tunables; the offline policy has nothing to search"
    speedups = _tree_speedups(request.tree) | _attempt_speedups(request.attempts)
    effects = _fit(_observations(space, request.attempts, speedups))
    tried = space.tree_tried() | {
        c.key
        for a in request.attempts
        if (s := space.solutions.get(a.solution_id or ""))
        if (c := space.solution_config(s))
    }
    if request.kind == "initialize_tree":
        return _initialize(space, effects, tried, request.max_actions), None
    if request.kind == "propose_actions":
        return _propose(space, effects, tried, request.max_actions), None
    if request.node_id is None or request.node_id not in request.tree.nodes:
        raise ValueError(f"{request.kind} needs the id of an action node, got {request.node_id!r}")
    if request.kind == "refine":
        return _refine(space, effects, tried, request), None
    if request.kind == "too_hard":
        return _too_hard(space, request, speedups), None
    raise ValueError(f"unknown plan kind {request.kind!r}")


def _initialize(
    space: _Space, effects: Mapping[str, _Effect], tried: set[str], max_actions: int
) -> list[dict]:
    start = space.node_config(ROOT_ID)
    assert start is not None  # space.seeds is not empty
    ranked = _Ranker(space, effects).rank(
        _neighbours(space, ROOT_ID, start, seed_line=not space.root_is_searchable()), tried
    )
    limit = max(max_actions, 1)  # as many as the request allows, like any planner
    # Every seed switch goes in: another seed is another region of the space, and ranking alone would
    # queue it behind a dozen neighbouring tile sizes that all share the same neutral prior.
    switches = [r for r in ranked if r.candidate.is_switch][:limit]
    steps = [r for r in ranked if not r.candidate.is_switch][: limit - len(switches)]
    chosen = {id(r) for r in switches + steps}
    return [_insert_op(r) for r in ranked if id(r) in chosen]


def _propose(space: _Space, effects: Mapping[str, _Effect], tried: set[str], max_actions: int) -> list[dict]:
    parents = [ROOT_ID] + [
        n.id for n in sorted(space.tree.nodes.values(), key=lambda n: n.seq) if n.status is NodeStatus.DONE
    ]
    candidates = []
    for parent in parents:
        config = space.node_config(parent)
        if config is not None and config.seed is not None:
            seed_line = parent == ROOT_ID and not space.root_is_searchable()
            candidates += _neighbours(space, parent, config, seed_line=seed_line)
    return [_insert_op(r) for r in _Ranker(space, effects).rank(candidates, tried)[: max(max_actions, 0)]]


def _refine(
    space: _Space, effects: Mapping[str, _Effect], tried: set[str], request: PlanRequest
) -> list[dict]:
    node_id = request.node_id
    assert node_id is not None
    passing = [a for a in request.attempts if a.passed and a.solution_id in space.solutions]
    best = max(passing, key=lambda a: (a.speedup or 0.0, -a.round), default=None)
    extra = {node_id: best.speedup} if best and best.speedup else {}
    ranker = _Ranker(space, effects, extra)
    ops = _rescore(space, ranker, lambda node: True)
    config = space.own_config(space.tree.nodes[node_id])
    if config is None and best is not None:
        config = space.solution_config(space.solutions[best.solution_id or ""])
    if config is None or config.seed is None:
        return ops
    children = ranker.rank(_neighbours(space, node_id, config, seed_line=False), tried)
    return ops + [_insert_op(r) for r in children[: min(REFINE_CHILDREN, max(request.max_actions, 0))]]


def _too_hard(space: _Space, request: PlanRequest, speedups: Mapping[str, float]) -> list[dict]:
    node = space.tree.nodes[request.node_id or ""]
    ops: list[dict[str, Any]] = []
    observations = _observations(space, request.attempts, speedups)
    before, after = space.node_config(node.parent), space.intended_config(node)
    failed = _diff(before, after) if before and after else ()
    if node.status in (NodeStatus.OPEN, NodeStatus.LEASED):
        ops.append({"op": "mark_too_hard", "node": node.id, "reason": _failure_reason(request.attempts)})
        if failed:  # the tree does not record the failure yet; the model must see it now
            observations.append(_Observation(node.id, failed, None, "marked too hard"))
    if not failed:
        return ops
    ranker = _Ranker(space, _fit(observations))
    for op in _rescore(
        space, ranker, lambda other: other.id != node.id and bool(set(_changes(space, other)) & set(failed))
    ):
        if op["score"] < space.tree.nodes[op["node"]].score:
            ops.append(op | {"note": f"lowered: {', '.join(failed)} failed in {node.id}"})
    return ops


def _changes(space: _Space, node: ActionNode) -> tuple[str, ...]:
    before, after = space.node_config(node.parent), space.intended_config(node)
    return _diff(before, after) if before and after else ()


def _rescore(space: _Space, ranker: _Ranker, wanted: Callable[[ActionNode], bool]) -> list[dict[str, Any]]:
    """Update ops for open actions whose model estimate moved."""
    ops = []
    for node in sorted(space.tree.nodes.values(), key=lambda n: n.seq):
        after = space.intended_config(node)
        changes = _changes(space, node)
        if node.status is not NodeStatus.OPEN or after is None or not changes or not wanted(node):
            continue
        spec = parse_action(node.description) or ActionSpec(None)
        rated = ranker.rate(_Candidate(node.parent, after, changes, spec, node.title, node.difficulty, 0, 0))
        if rated.score != node.score or rated.prediction.expected != node.expected_speedup:
            ops.append(
                {
                    "op": "update",
                    "node": node.id,
                    "score": rated.score,
                    "expected_speedup": rated.prediction.expected,
                    "rationale": rated.prediction.rationale,
                }
            )
    return ops


def _failure_reason(attempts: list[Attempt]) -> str:
    parts = []
    for a in attempts:
        outcome = str(a.result.status) if a.result else "no code"
        detail = (a.result.message if a.result else a.error) or ""
        parts.append(f"attempt {a.round}: {outcome}" + (f" ({detail[:80]})" if detail else ""))
    return "offline-policy: no attempt passed" + (": " + "; ".join(parts) if parts else "")
