"""The offline policy: an honest tunable-search optimizer that plays planner and coder without an LLM.

It searches the space that seed kernels declare (`NAME = VALUE  # tunable: [choices]`, see
`tunables`) through the same world model and action cycles as the LLM policy:

* An action is one step in that space, written into its description as machine-readable lines
  that the coder parses back: `tunables: {"BLOCK_M": 128}` (JSON) and/or `seed: <name>` (start
  from that seed's source instead of the parent's solution). The title says it in words.
* A *config* is (seed name, tunable values). A solution's config is read from its sources; its
  seed is the seed whose source, with the same values written in, is identical to it (so the
  root's seed and every offline-written solution are recognized exactly), else the `seed:` line
  of its description, else the first seed declaring the same tunables and choices. A solution
  that matches no seed has no config: the policy does not expand it.
* A node's config is its attached solution's when that solution is known, else its *intended*
  config: the parent's config with the action's change applied.
* The learned model fits, for every change key (`BLOCK_M=128`, `seed=other`), a regularized mean
  of log(speedup over the nearest measured ancestor), the log-ratio shared equally among the
  changes of one observation, failures counting as a fixed penalty, and each measured step also
  counting, negated, for the step that would undo it. A candidate's predicted gain is the sum over
  its changes; an unobserved change gets the neutral prior (1.02x).
* Scores rank by predicted *absolute* speedup against the best known, so the frontier is a
  best-first search over configs: an unmeasured step from the best node scores 0.5.
* Written code sets every tunable in one canonical form (`rewrite_tunables` with the whole
  config), so one config always has one source text and one content hash. The solution's
  description repeats the config as `seed:` / `tunables:` lines, for people and as a fallback.

Stateless by design: every call rebuilds what it knows from the request (tree, solutions,
attempts, seeds), so a resumed run gets the same replies; nothing here is random.
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ksearch_ray.models import Solution
from ksearch_ray.policy import Attempt, CodeReply, CodeRequest, PlanReply, PlanRequest
from ksearch_ray.tunables import Tunable, TunableError, read_tunables, rewrite_tunables
from ksearch_ray.world_model import ROOT_ID, ActionNode, NodeStatus, RootNode, Tree, solution_speedup

POLICY_NAME = "offline-policy (tunable search, no LLM)"
AUTHOR = "offline-policy"

PRIOR_LOG_GAIN = math.log(1.02)
"""What an unmeasured change is expected to give: a little, so untried steps beat known losers."""
PRIOR_WEIGHT = 0.5
"""Pseudo-observations of the prior in every effect: one lucky measurement should not dominate."""
FAILURE_LOG_GAIN = math.log(0.5)
"""A failed attempt counts as if it had halved the speed: its change should rank below any slowdown."""
SCORE_SCALE = 0.1
"""Log-speedup difference that moves a score from 0.5 to about 0.73."""
INIT_MIN_ACTIONS = 12
REFINE_CHILDREN = 3

_TUNABLES_LINE = re.compile(r"^tunables:\s*(\{.*\})\s*$", re.MULTILINE)
_SEED_LINE = re.compile(r"^seed:\s*(\S+)\s*$", re.MULTILINE)


# ------------------------------------------------------------------------------ configs and actions


@dataclass(frozen=True)
class Config:
    seed: str | None
    values: tuple[tuple[str, Any], ...]  # sorted by name

    @classmethod
    def of(cls, seed: str | None, values: Mapping[str, Any]) -> Config:
        return cls(seed, tuple(sorted(values.items())))

    def as_dict(self) -> dict[str, Any]:
        return dict(self.values)

    @property
    def key(self) -> str:
        # JSON tells True from 1 and "1" from 1, which tuple equality would not.
        return json.dumps([self.seed, self.values])


@dataclass(frozen=True)
class ActionSpec:
    """What an action's machine-readable lines say."""

    seed: str | None
    tunables: dict[str, Any] = field(default_factory=dict)

    def lines(self) -> str:
        out = [f"seed: {self.seed}"] if self.seed else []
        return "\n".join(out + ([f"tunables: {json.dumps(self.tunables)}"] if self.tunables else []))


def parse_action(description: str) -> ActionSpec | None:
    """The change an action's description asks for, or None if it carries no machine-readable line."""
    seed_match, tunables_match = _SEED_LINE.search(description), _TUNABLES_LINE.search(description)
    tunables: Any = {}
    if tunables_match:
        try:
            tunables = json.loads(tunables_match[1])
        except json.JSONDecodeError:
            return None
    if not isinstance(tunables, dict) or (seed_match is None and not tunables):
        return None
    return ActionSpec(seed_match[1] if seed_match else None, tunables)


def change_key(name: str, value: Any) -> str:
    return f"{name}={json.dumps(value)}"


def declared_tunables(solution: Solution) -> dict[str, Tunable]:
    """Tunables across all source files, in file-name then line order; the first declaration wins."""
    out: dict[str, Tunable] = {}
    for _, text in sorted(solution.sources.items()):
        for name, tunable in read_tunables(text).items():
            out.setdefault(name, tunable)
    return out


def with_values(solution: Solution, values: Mapping[str, Any]) -> dict[str, str]:
    """The solution's sources with every named tunable set, in each file that declares it."""
    out = {}
    for name, text in solution.sources.items():
        mine = {k: v for k, v in values.items() if k in read_tunables(text)}
        out[name] = rewrite_tunables(text, mine) if mine else text
    return out


def _fmt(value: Any) -> str:
    return value if isinstance(value, str) else repr(value)


def _diff(before: Config, after: Config) -> tuple[str, ...]:
    """Change keys from one config to another; a seed switch is one change, whatever it carries."""
    if before.seed != after.seed:
        return (f"seed={after.seed}",)
    old = before.as_dict()
    return tuple(change_key(n, v) for n, v in after.values if n not in old or old[n] != v)


def _is_numeric(values: Iterable[Any]) -> bool:
    return all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)


# ------------------------------------------------------------------------------- the search space


class _Space:
    """Configs of the solutions and nodes of one request. Caches live only as long as the request."""

    def __init__(self, tree: Tree, solutions: Mapping[str, Solution], seeds: Mapping[str, Solution]):
        self.tree = tree
        self.solutions = dict(solutions)
        self.seeds: dict[str, tuple[Solution, dict[str, Tunable]]] = {}
        for name, seed in sorted(seeds.items()):
            try:
                decl = declared_tunables(seed)
            except TunableError:
                continue  # a seed whose markers do not parse cannot be searched; the others still can
            if decl:
                self.seeds[name] = (seed, decl)
        self._solution_configs: dict[str, Config | None] = {}
        self._node_configs: dict[str, Config | None] = {}

    def seed_config(self, name: str) -> Config:
        return Config.of(name, {n: t.value for n, t in self.seeds[name][1].items()})

    def solution_config(self, solution: Solution) -> Config | None:
        if solution.id not in self._solution_configs:
            self._solution_configs[solution.id] = self._read_config(solution)
        return self._solution_configs[solution.id]

    def _read_config(self, solution: Solution) -> Config | None:
        try:
            decl = declared_tunables(solution)
        except TunableError:
            return None
        if not decl:
            return None
        values = {n: t.value for n, t in decl.items()}
        signature = [(n, t.choices) for n, t in decl.items()]
        same = [n for n, (_, d) in self.seeds.items() if [(k, t.choices) for k, t in d.items()] == signature]
        mine = with_values(solution, values)
        seed = next((n for n in same if with_values(self.seeds[n][0], values) == mine), None)
        if seed is None:
            line = _SEED_LINE.search(solution.description)
            seed = line[1] if line and line[1] in same else (same[0] if same else None)
        return Config.of(seed, values)

    def find_solution(self, solution_id: str) -> Solution | None:
        if solution_id in self.solutions:
            return self.solutions[solution_id]
        return next((s for s, _ in self.seeds.values() if s.id == solution_id), None)

    def root_is_searchable(self) -> bool:
        """Whether the root's own solution has a config; if not, actions start from the first seed."""
        return self.own_config(self.tree.root) is not None

    def own_config(self, node: ActionNode | RootNode) -> Config | None:
        solution = self.find_solution(node.solution.solution_id) if node.solution else None
        config = self.solution_config(solution) if solution else None
        return config if config is not None and config.seed is not None else None

    def node_config(self, node_id: str) -> Config | None:
        if node_id not in self._node_configs:
            node = self.tree.get(node_id)
            if node is None:
                raise KeyError(node_id)
            config = self.own_config(node)
            if config is None and isinstance(node, RootNode):
                config = self.seed_config(next(iter(self.seeds))) if self.seeds else None
            elif config is None and isinstance(node, ActionNode):
                config = self.intended_config(node)
            self._node_configs[node_id] = config
        return self._node_configs[node_id]

    def intended_config(self, node: ActionNode) -> Config | None:
        spec = parse_action(node.description)
        return self.apply(self.node_config(node.parent), spec) if spec else None

    def apply(self, parent: Config | None, spec: ActionSpec) -> Config | None:
        """The config an action leads to, or None if it names an unknown seed, tunable or choice."""
        seed = spec.seed or (parent.seed if parent else None)
        if seed not in self.seeds:
            return None
        start = self.seed_config(seed) if spec.seed or parent is None else parent
        decl = self.seeds[seed][1]
        if any(n not in decl or v not in decl[n].choices for n, v in spec.tunables.items()):
            return None
        return Config.of(seed, start.as_dict() | spec.tunables)

    def tree_tried(self) -> set[str]:
        """Keys of every config the tree holds: measured, planned, running or failed."""
        keys = {c.key for c in [self.node_config(ROOT_ID)] if c}
        for node in self.tree.nodes.values():
            keys |= {c.key for c in (self.intended_config(node), self.node_config(node.id)) if c}
        return keys


@dataclass(frozen=True)
class _Candidate:
    parent: str
    config: Config
    changes: tuple[str, ...]
    spec: ActionSpec
    title: str
    difficulty: int
    distance: int  # choice-list steps from the parent's value: near steps first among equals
    order: int  # declaration order of the tunable
    words: str = ""  # the change in a sentence, for the description

    @property
    def is_switch(self) -> bool:
        return self.changes[0].startswith("seed=")


def _neighbours(space: _Space, parent: str, config: Config, *, seed_line: bool) -> list[_Candidate]:
    """Every single-tunable change of `config`, then a switch to each other seed."""
    assert config.seed is not None
    decl = space.seeds[config.seed][1]
    values = config.as_dict()
    out = []
    for order, (name, tunable) in enumerate(decl.items()):
        current = tunable.choices.index(values[name])
        for index, choice in enumerate(tunable.choices):
            if index == current:
                continue
            out.append(
                _Candidate(
                    parent=parent,
                    config=Config.of(config.seed, values | {name: choice}),
                    changes=(change_key(name, choice),),
                    spec=ActionSpec(config.seed if seed_line else None, {name: choice}),
                    title=f"{name} {_fmt(values[name])} → {_fmt(choice)}",
                    difficulty=1,
                    distance=abs(index - current),
                    order=order,
                    words=(f"Start from seed {config.seed}'s source and set" if seed_line else "Set")
                    + f" {name} from {_fmt(values[name])} to {_fmt(choice)}; nothing else changes.",
                )
            )
    for offset, (other, (_, other_decl)) in enumerate(space.seeds.items()):
        if other == config.seed:
            continue
        # Values the other seed also declares travel along: what was learned on one seed may hold on the other.
        carried = {
            n: v
            for n, v in values.items()
            if n in other_decl and v in other_decl[n].choices and v != other_decl[n].value
        }
        kept = ", ".join(f"{n}={_fmt(v)}" for n, v in carried.items())
        title = f"switch to seed {other}" + (f" keeping {kept}" if kept else "")
        if len(title) > 200:
            title = f"switch to seed {other} keeping {len(carried)} tunables"
        out.append(
            _Candidate(
                parent=parent,
                config=Config.of(other, space.seed_config(other).as_dict() | carried),
                changes=(f"seed={other}",),
                spec=ActionSpec(other, carried),
                title=title,
                difficulty=2,
                distance=1,
                order=len(decl) + offset,
                words=f"Start from seed {other}'s source instead of the parent's solution"
                + (f", carrying over {kept}." if kept else "."),
            )
        )
    return out


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
    limit = max(max_actions, INIT_MIN_ACTIONS)
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


# ------------------------------------------------------------------------------------------ coding


def _cycle_space(request: CodeRequest) -> _Space:
    solutions = dict(request.solutions)
    for extra in (request.base, request.current):
        if extra is not None:
            solutions[extra.id] = extra
    return _Space(request.tree, solutions, request.seeds)


def _cycle_tried(space: _Space, request: CodeRequest) -> set[str]:
    """A config identical to the base counts as tried: measuring it again teaches nothing."""
    sources = [request.base, request.current] + [
        space.solutions.get(a.solution_id or "") for a in request.history
    ]
    return {c.key for s in sources if s is not None and (c := space.solution_config(s)) is not None}


def _build(
    request: CodeRequest, start: Solution, config: Config, parent_id: str | None, what: str
) -> CodeReply:
    attempt = len(request.history) + 1
    if request.current is not None and all(a.solution_id != request.current.id for a in request.history):
        attempt += 1
    values = config.as_dict()
    solution = Solution(
        name=f"offline-{request.node_id}-a{attempt}",
        task=start.task,
        language=start.language,
        entry_file=start.entry_file,
        entry_point=start.entry_point,
        sources=with_values(start, values),
        author=AUTHOR,
        description=f"offline-policy: {what}; seed {config.seed} with {json.dumps(values)}\n"
        + ActionSpec(config.seed, values).lines(),
        parent_id=parent_id,
    )
    return CodeReply(solution=solution)


def _generate(space: _Space, request: CodeRequest) -> CodeReply:
    node = request.tree.nodes[request.node_id]
    spec = parse_action(node.description)
    if spec is None:
        return CodeReply(
            error=f"action {node.id} has no 'tunables:' or 'seed:' line; the offline policy only changes tunables"
        )
    base_config = space.solution_config(request.base) if request.base else None
    if spec.seed is not None:
        if spec.seed not in space.seeds:
            return CodeReply(
                error=f"action {node.id} names seed {spec.seed!r}, which declares no tunables here"
            )
        start = space.seeds[spec.seed][0]
    elif request.base is not None and base_config is not None and base_config.seed is not None:
        start = request.base
    else:
        return CodeReply(
            error=f"action {node.id} changes tunables but its base solution declares none we know"
        )
    config = space.apply(space.solution_config(start), spec)
    if config is None:
        return CodeReply(error=f"action {node.id} asks for tunables or choices its seed does not declare")
    if config.key in _cycle_tried(space, request):
        return CodeReply(error=f"action {node.id} leads to a configuration already measured in this cycle")
    parent_id = request.base.id if request.base else start.id
    return _build(request, start, config, parent_id, f"implements {node.id} ({node.title})")


def _debug(space: _Space, request: CodeRequest) -> CodeReply:
    if request.current is None:
        raise ValueError("debug needs the failing solution as request.current")
    failing = space.solution_config(request.current)
    if failing is None or failing.seed is None:
        return CodeReply(error="the failing solution declares no tunables the offline policy knows")
    tried = _cycle_tried(space, request) | space.tree_tried()
    decl = space.seeds[failing.seed][1]
    values = failing.as_dict()
    base = space.solution_config(request.base) if request.base else None
    base_values = base.as_dict() if base and base.seed == failing.seed else {}
    # First undo part of what this cycle changed (one choice back), then shrink the biggest sizes.
    changed = [n for n in decl if n in base_values and base_values[n] != values[n]]
    sized = sorted(
        (n for n in decl if _is_numeric(decl[n].choices) and len(decl[n].choices) > 1),
        key=lambda n: -sorted(decl[n].choices).index(values[n]) / (len(decl[n].choices) - 1),
    )
    for name in changed + sized:
        step = _safer(decl[name], values[name], base_values.get(name))
        if step is None:
            continue
        config = Config.of(failing.seed, values | {name: step})
        if config.key not in tried:
            what = f"debug: {name} {_fmt(values[name])} → {_fmt(step)} after {request.current_result.status if request.current_result else 'a failure'}"
            return _build(request, request.current, config, request.current.id, what)
    return CodeReply(error="no untried safer configuration")


def _safer(tunable: Tunable, value: Any, base_value: Any) -> Any:
    """One choice towards smaller for sizes; one choice back towards the base value for anything else."""
    if _is_numeric(tunable.choices):
        smaller = [c for c in tunable.choices if c < value]
        return max(smaller) if smaller else None
    if base_value is None or base_value == value:
        return None
    here, there = tunable.choices.index(value), tunable.choices.index(base_value)
    return tunable.choices[here + (1 if there > here else -1)]


def _improve(space: _Space, request: CodeRequest) -> CodeReply:
    passing = [
        (a.speedup or 0.0, -a.round, space.solutions[a.solution_id])
        for a in request.history
        if a.passed and a.solution_id in space.solutions
    ]
    if (
        not passing
        and request.current is not None
        and request.current_result
        and request.current_result.passed
    ):
        passing = [(0.0, 0, request.current)]
    if not passing:
        return CodeReply(error="no passing attempt in this cycle to improve on")
    best = max(passing, key=lambda p: p[:2])[2]
    config = space.solution_config(best)
    if config is None or config.seed is None:
        return CodeReply(error="the best solution declares no tunables the offline policy knows")
    speedups = _tree_speedups(request.tree) | _attempt_speedups(request.history)
    if request.base is not None and request.base_speedup:
        speedups[request.base.id] = request.base_speedup
    effects = _fit(_observations(space, request.history, speedups))
    tried = _cycle_tried(space, request) | space.tree_tried()
    steps = [c for c in _neighbours(space, request.node_id, config, seed_line=False) if not c.is_switch]
    ranked = _Ranker(space, effects).rank(steps, tried)
    if not ranked:
        return CodeReply(error="no untried single-tunable change remains")
    top = ranked[0]
    what = f"improve: {top.candidate.title} on top of {best.name}; {top.prediction.rationale}"
    return _build(request, best, top.candidate.config, best.id, what)


class OfflinePolicy:
    """Planner and coder without an LLM; see the module docstring. Holds no state between calls."""

    name = POLICY_NAME

    async def plan(self, request: PlanRequest) -> PlanReply:
        ops, error = _plan_ops(request)
        return PlanReply(ops=ops, error=error)

    async def code(self, request: CodeRequest) -> CodeReply:
        space = _cycle_space(request)
        if request.kind in ("generate_from_spec", "generate_from_base"):
            return _generate(space, request)
        if request.kind == "debug":
            return _debug(space, request)
        if request.kind == "improve":
            return _improve(space, request)
        raise ValueError(f"unknown code kind {request.kind!r}")
