"""The policy interface: who plans the world model and who writes the code.

Two implementations share it: `LLMPolicy` (litellm, prompts in files) and `OfflinePolicy`
(no model: it searches the tunables that seed kernels declare). Ray actors wrap a policy;
the logic never lives in the actor classes. Requests carry everything a policy needs, so a
policy holds no state that a resumed run could not rebuild from the tree and the run log.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

from ksearch_ray.llm.client import LLMCall
from ksearch_ray.models import EvalResult, Solution
from ksearch_ray.taskspec.task import TaskDefinition
from ksearch_ray.worldmodel.tree import Tree

PlanKind = Literal["initialize_tree", "propose_actions", "refine", "too_hard"]
CodeKind = Literal["generate_from_spec", "generate_from_base", "debug", "improve"]


@dataclass
class Attempt:
    """One code generation inside an action cycle, and what became of it."""

    round: int
    kind: CodeKind
    solution_id: str | None = None
    error: str | None = None  # why no code came back (unparseable reply, LLM failure)
    result: EvalResult | None = None
    speedup: float | None = None

    @property
    def passed(self) -> bool:
        return self.result is not None and self.result.passed


@dataclass
class PlanRequest:
    kind: PlanKind
    task: TaskDefinition
    tree: Tree
    hardware: str
    language: str
    node_id: str | None = None
    attempts: list[Attempt] = field(default_factory=list)  # the finished cycle's, for refine / too_hard
    solutions: dict[str, Solution] = field(default_factory=dict)  # attached solutions, by id
    seeds: dict[str, Solution] = field(default_factory=dict)  # the task's seed kernels, by name
    max_actions: int = 6


@dataclass
class PlanReply:
    ops: list[dict] = field(default_factory=list)  # raw edit ops; apply_ops validates them
    calls: list[LLMCall] = field(default_factory=list)
    error: str | None = None


@dataclass
class CodeRequest:
    kind: CodeKind
    task: TaskDefinition
    tree: Tree
    node_id: str
    hardware: str
    language: str
    base: Solution | None = None  # the parent's solution (attempt 1) or None: write from the spec
    base_speedup: float | None = None
    current: Solution | None = None  # the code to debug or improve (attempts 2..N)
    current_result: EvalResult | None = None
    history: list[Attempt] = field(default_factory=list)
    solutions: dict[str, Solution] = field(default_factory=dict)  # every solution of this cycle, by id
    seeds: dict[str, Solution] = field(default_factory=dict)


@dataclass
class CodeReply:
    solution: Solution | None = None
    calls: list[LLMCall] = field(default_factory=list)
    error: str | None = None  # one line: why there is no solution


class Policy(Protocol):
    name: str
    """Shown in every output: 'offline-policy (tunable search, no LLM)' or 'llm: <model>'."""

    async def plan(self, request: PlanRequest) -> PlanReply: ...

    async def code(self, request: CodeRequest) -> CodeReply: ...
