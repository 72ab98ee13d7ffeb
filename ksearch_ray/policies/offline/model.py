"""The offline policy's learned model: observations, the per-change effect fit, and ranking.

See `ksearch_ray.policies.offline.offline_policy` for the whole design.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ksearch_ray.models import Solution
from ksearch_ray.policies.contract import Attempt
from ksearch_ray.policies.offline.configs import _Candidate, _diff, _Space
from ksearch_ray.worldmodel.tree import ROOT_ID, ActionNode, NodeStatus, RootNode, Tree, solution_speedup

PRIOR_LOG_GAIN = math.log(1.02)
"""What an unmeasured change is expected to give: a little, so untried steps beat known losers."""
PRIOR_WEIGHT = 0.5
"""Pseudo-observations of the prior in every effect: one lucky measurement should not dominate."""
FAILURE_LOG_GAIN = math.log(0.5)
"""A failed attempt counts as if it had halved the speed: its change should rank below any slowdown."""
SCORE_SCALE = 0.1
"""Log-speedup difference that moves a score from 0.5 to about 0.73."""


# -------------------------------------------------------------------------------- the learned model


@dataclass(frozen=True)
class _Observation:
    label: str  # where it was measured: a node id, or an attempt
    changes: tuple[str, ...]
    log_ratio: float | None  # None: the attempt failed
    failure: str = ""
    reverse: tuple[str, ...] = ()  # the changes that would undo this step, back to the parent's values

    def evidence(self, change: str) -> str:
        others = f" (with {len(self.changes) - 1} other change(s))" if len(self.changes) > 1 else ""
        if self.log_ratio is None:
            return f"{change} failed in {self.label} ({self.failure}){others}"
        if change in self.reverse:
            return f"{change} undoes a step measured {math.exp(self.log_ratio):.2f}× in {self.label}"
        return f"{change} measured {math.exp(self.log_ratio):.2f}× over its parent in {self.label}{others}"


@dataclass(frozen=True)
class _Effect:
    log_gain: float
    evidence: tuple[str, ...]


@dataclass(frozen=True)
class _Prediction:
    log_gain: float
    rationale: str

    @property
    def expected(self) -> float:
        return max(round(math.exp(self.log_gain), 4), 0.01)


def _fit(observations: Iterable[_Observation]) -> dict[str, _Effect]:
    sums: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    evidence: dict[str, list[str]] = defaultdict(list)
    for obs in observations:
        shares = [
            (c, (FAILURE_LOG_GAIN if obs.log_ratio is None else obs.log_ratio) / len(obs.changes))
            for c in obs.changes
        ]
        if obs.log_ratio is not None:
            # A measured step is evidence about its opposite too: 64 → 128 paying 1.3x says 128 → 64 costs it.
            shares += [(c, -obs.log_ratio / len(obs.reverse)) for c in obs.reverse]
        for change, share in shares:
            sums[change] += share
            counts[change] += 1
            evidence[change].append(obs.evidence(change))
    return {
        c: _Effect((sums[c] + PRIOR_WEIGHT * PRIOR_LOG_GAIN) / (counts[c] + PRIOR_WEIGHT), tuple(evidence[c]))
        for c in sums
    }


def _predict(effects: Mapping[str, _Effect], changes: tuple[str, ...]) -> _Prediction:
    total, parts = 0.0, []
    for change in changes:
        effect = effects.get(change)
        if effect is None:
            total += PRIOR_LOG_GAIN
            parts.append(f"{change}: not measured yet, neutral prior {math.exp(PRIOR_LOG_GAIN):.2f}×")
            continue
        total += effect.log_gain
        shown = "; ".join(effect.evidence[:3]) + ("; ..." if len(effect.evidence) > 3 else "")
        parts.append(f"{shown} -> model {math.exp(effect.log_gain):.2f}×")
    head = f"offline model (regularized mean log-speedup per change) predicts {math.exp(total):.2f}× over the parent"
    return _Prediction(total, f"{head}. " + ". ".join(parts))


def _observations(
    space: _Space, attempts: Iterable[Attempt], speedups: Mapping[str, float]
) -> list[_Observation]:
    """Attempts first (each against its nearest measured ancestor), then what the tree itself records."""
    out, seen = [], set()
    for attempt in attempts:
        solution = space.solutions.get(attempt.solution_id or "")
        ancestor = _measured_ancestor(solution, space, speedups) if solution else None
        if solution is None or ancestor is None or attempt.result is None or solution.id in seen:
            continue
        before, after = space.solution_config(ancestor), space.solution_config(solution)
        seen.add(solution.id)
        if before is None or after is None:
            continue
        changes = _diff(before, after)
        label = f"attempt {attempt.round} ({solution.name})"
        if changes and attempt.passed and attempt.speedup:
            ratio = math.log(attempt.speedup / speedups[ancestor.id])
            out.append(_Observation(label, changes, ratio, reverse=_diff(after, before)))
        elif changes and not attempt.passed:
            out.append(_Observation(label, changes, None, str(attempt.result.status)))
    for node in sorted(space.tree.nodes.values(), key=lambda n: n.seq):
        parent = space.tree.get(node.parent)
        before = space.node_config(node.parent)
        if node.parent == ROOT_ID and not space.root_is_searchable():
            continue  # the root's measurement belongs to a solution that is not the config we start from
        if node.status is NodeStatus.TOO_HARD:
            after = space.intended_config(node)
            if before and after and _diff(before, after):
                out.append(_Observation(node.id, _diff(before, after), None, "marked too hard"))
            continue
        mine, theirs = solution_speedup(node), solution_speedup(parent) if parent else None
        after = space.node_config(node.id)
        if node.solution is None or node.solution.solution_id in seen or not (mine and theirs):
            continue
        if before and after and _diff(before, after):
            out.append(
                _Observation(
                    node.id, _diff(before, after), math.log(mine / theirs), reverse=_diff(after, before)
                )
            )
    return out


def _measured_ancestor(solution: Solution, space: _Space, speedups: Mapping[str, float]) -> Solution | None:
    current, visited = solution.parent_id, set()
    while current is not None and current not in visited:
        visited.add(current)
        found = space.find_solution(current)
        if found is None:
            return None
        if current in speedups:
            return found
        current = found.parent_id
    return None


def _tree_speedups(tree: Tree) -> dict[str, float]:
    holders: list[ActionNode | RootNode] = [tree.root, *tree.nodes.values()]
    return {h.solution.solution_id: s for h in holders if h.solution and (s := solution_speedup(h))}


def _attempt_speedups(attempts: Iterable[Attempt]) -> dict[str, float]:
    return {a.solution_id: a.speedup for a in attempts if a.solution_id and a.passed and a.speedup}


# --------------------------------------------------------------------------------------- ranking


@dataclass(frozen=True)
class _Ranked:
    candidate: _Candidate
    prediction: _Prediction
    score: float


class _Ranker:
    """Scores by predicted absolute speedup against the best known, so steps from the best come first."""

    def __init__(
        self, space: _Space, effects: Mapping[str, _Effect], extra_speedups: Mapping[str, float] | None = None
    ):
        self.space, self.effects, self.extra = space, effects, dict(extra_speedups or {})
        known = list(_tree_speedups(space.tree).values()) + list(self.extra.values())
        self.best = max(known, default=1.0)

    def parent_speedup(self, node_id: str) -> float:
        node = self.space.tree.get(node_id)
        measured = solution_speedup(node) if node else None
        if measured is None:
            # An unmeasured parent: the baseline for a seedless root (as `parent_speedup` has it), else neutral.
            measured = self.extra.get(node_id, 1.0 if node_id == ROOT_ID else self.best)
        return measured

    def seq(self, node_id: str) -> int:
        node = self.space.tree.nodes.get(node_id)
        return node.seq if node else 0

    def rate(self, candidate: _Candidate) -> _Ranked:
        prediction = _predict(self.effects, candidate.changes)
        ahead = (
            math.log(self.parent_speedup(candidate.parent) / self.best) + prediction.log_gain - PRIOR_LOG_GAIN
        )
        z = max(min(ahead / SCORE_SCALE, 50.0), -50.0)  # a logistic; clamped so exp cannot overflow
        return _Ranked(candidate, prediction, round(1.0 / (1.0 + math.exp(-z)), 4))

    def rank(self, candidates: Iterable[_Candidate], tried: set[str]) -> list[_Ranked]:
        rated = [self.rate(c) for c in candidates if c.config.key not in tried]
        rated.sort(
            key=lambda r: (
                -r.score,
                -r.prediction.log_gain,
                r.candidate.difficulty,
                r.candidate.distance,
                self.seq(r.candidate.parent),
                r.candidate.order,
                r.candidate.title,
            )
        )
        out, seen = [], set()
        for r in rated:  # two parents can lead to one config; keep its best-ranked way there
            if r.candidate.config.key not in seen:
                seen.add(r.candidate.config.key)
                out.append(r)
        return out


def _insert_op(r: _Ranked) -> dict[str, Any]:
    c = r.candidate
    return {
        "op": "insert",
        "parent": c.parent,
        "title": c.title,
        "description": f"{c.words}\n{c.spec.lines()}",
        "difficulty": c.difficulty,
        "score": r.score,
        "expected_speedup": r.prediction.expected,
        "rationale": r.prediction.rationale,
    }
