"""Configs and actions of the offline policy, and the search space of one request.

A config is (seed name, tunable values); an action's description carries it as machine-readable
`seed:` / `tunables:` lines. See `ksearch_ray.policies.offline.offline_policy` for the whole design.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ksearch_ray.models import Solution
from ksearch_ray.taskspec.tunables import Tunable, TunableError, declared_tunables, with_values
from ksearch_ray.worldmodel.tree import ROOT_ID, ActionNode, RootNode, Tree

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
