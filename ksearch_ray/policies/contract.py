"""The policy interface: who plans the world model and who writes the code.

Two implementations share it: `LLMPolicy` (litellm, prompts in files) and `OfflinePolicy`
(no model: it searches the tunables that seed kernels declare). Ray actors wrap a policy;
the logic never lives in the actor classes. Requests carry everything a policy needs, so a
policy holds no state that a resumed run could not rebuild from the tree and the run log.

There is one request type per call kind (`InitializeTree`, `ProposeActions`, `RefinePlan`,
`TooHard`; `GenerateFromSpec`, `GenerateFromBase`, `Debug`, `Improve`, `Evolve`), each a
`PlanRequest` or `CodeRequest` that fixes its kind and checks, when it is made, that it carries
what its kind needs (a debug call the failing attempt, an improve call the code it improves, a
refine call the cycle's evidence ...); `plan_request(kind, ...)` and `code_request(kind, ...)` make
the right one. Policies read the shared fields; what a kind leaves empty is empty for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from ksearch_ray.evaluation.describe import EvaluatorInfo
from ksearch_ray.evaluation.profiling import ProfileResult
from ksearch_ray.models import EvalResult, Solution
from ksearch_ray.policies.llm_call import LLMCall
from ksearch_ray.taskspec.spec import TaskDefinition
from ksearch_ray.worldmodel.tree import Tree

PlanKind = Literal["initialize_tree", "propose_actions", "refine", "too_hard"]
CodeKind = Literal["generate_from_spec", "generate_from_base", "debug", "improve", "evolve"]


@dataclass
class Attempt:
    """One code generation inside an action cycle, and what became of it."""

    round: int
    kind: CodeKind
    solution_id: str | None = None
    error: str | None = None  # why no code came back (unparseable reply, LLM failure)
    result: EvalResult | None = None
    speedup: float | None = None
    evaluator: int | None = None  # which evaluator measured it (speedups are against its baseline)
    reply_start: str = ""  # the start of a reply that held no code

    @property
    def passed(self) -> bool:
        return self.result is not None and self.result.passed


@dataclass
class WorkloadTime:
    workload: str
    ms: float
    parent_ms: float | None
    baseline_ms: float | None


@dataclass
class WorkloadShape:
    """One workload candidates are scored on: its axes and generator parameters, and the least work a
    call of it must do (task.json's `cost`), from which a time becomes a place on the roofline."""

    name: str
    axes: dict[str, int]
    params: dict[str, Any] = field(default_factory=dict)
    flops: float | None = None
    bytes: float | None = None


@dataclass
class Facts:
    """What every prompt states of where and how candidates are measured: the device, its peaks and
    software, the timing method, that inputs are regenerated, every workload's shapes."""

    device: EvaluatorInfo | None = None
    workload_set: str = ""
    workloads: list[WorkloadShape] = field(default_factory=list)
    timing_rule: str = ""
    fresh_inputs: bool = True


@dataclass
class FailedAttempt:
    """The attempt before this call, which failed: its code (None when the reply held none) and why."""

    round: int
    kind: CodeKind
    solution: Solution | None
    result: EvalResult | None  # its evaluation (None: there was no code to evaluate)
    error: str | None = None  # why no code came back
    reply_start: str = ""  # what the reply said instead


@dataclass
class Inspiration:
    """Another program of an evolutionary search's database, shown beside the parent (`evolve`)."""

    solution: Solution
    speedup: float | None  # over the baseline; None when it did not pass
    status: str  # its evaluation's Status value
    why: str  # why it was picked, in words: "the island's best", "a different kind of program"


@dataclass
class AttemptEvidence:
    """One attempt of a finished cycle, as the planner is told about it."""

    round: int
    kind: CodeKind
    status: str  # an evaluation Status value, or NO_CODE when the coder gave none
    change: str  # the coder's own words on what it changed
    error: str  # the decisive lines of the failure; '' when it passed
    speedup: float | None  # over the baseline
    over_parent: float | None
    times: list[WorkloadTime] = field(default_factory=list)


@dataclass(kw_only=True)
class PlanRequest:
    kind: PlanKind
    task: TaskDefinition
    tree: Tree
    hardware: str
    language: str
    node_id: str | None = None  # the node to expand (propose_actions) or just implemented (refine, too_hard)
    attempts: list[Attempt] = field(default_factory=list)  # the finished cycle's, for refine / too_hard
    evidence: list[AttemptEvidence] = field(default_factory=list)  # the same attempts, as the planner reads them
    solutions: dict[str, Solution] = field(default_factory=dict)
    """Code by id: every attached solution and attempt for a policy that reads them all (the offline policy's
    configurations), else those the prompt can show (`shown_plan_code`)."""
    seeds: dict[str, Solution] = field(default_factory=dict)  # the task's seed kernels, by name
    seed_times: list[WorkloadTime] = field(default_factory=list)  # the seed's measured times (initialize_tree)
    max_actions: int = 6  # new actions this reply may add (K-Search: 3; more for the first plan)
    noise: float | None = None  # relative spread of repeated measurements of one kernel
    prompt_budget_tokens: int | None = None  # None: what the model's context window allows
    facts: Facts | None = None
    rejected: list[str] = field(default_factory=list)  # edits of the planner's earlier replies that were not applied, and why
    empty_before: bool = False  # this very question got an empty plan; an empty one again ends the search
    profiles: dict[str, ProfileResult] = field(default_factory=dict)  # role -> Nsight Compute profile (the best's, the seed's)


@dataclass
class PlanReply:
    ops: list[dict] = field(default_factory=list)  # raw edit ops; apply_ops validates them
    calls: list[LLMCall] = field(default_factory=list)
    error: str | None = None  # nothing usable came back: why
    notes: list[str] = field(default_factory=list)  # how the reply was read (aliases, re-asks), for the log
    source: tuple[str, int] | None = None  # (request hash, sample) of the cached reply the ops were read from
    failed_call: LLMCall | None = None  # the call whose failure left nothing to use (the run decides: wait, stop, go on)


@dataclass(kw_only=True)
class CodeRequest:
    kind: CodeKind
    task: TaskDefinition
    tree: Tree
    node_id: str
    hardware: str
    language: str
    base: Solution | None = None  # the parent's solution (attempt 1) or None: write from the spec
    base_speedup: float | None = None
    base_times: list[WorkloadTime] = field(default_factory=list)  # the base solution's times
    current: Solution | None = None  # the code to debug or improve (attempts 2..N)
    current_result: EvalResult | None = None
    current_speedup: float | None = None  # of exactly `current`, over the baseline
    current_times: list[WorkloadTime] = field(default_factory=list)
    history: list[Attempt] = field(default_factory=list)  # the cycle's latest settled attempts, oldest first
    earlier_attempts: int = 0  # the cycle's settled attempts before `history`, not carried (a wide cycle has hundreds)
    solutions: dict[str, Solution] = field(default_factory=dict)  # the solutions of `history`, the current and the best
    seeds: dict[str, Solution] = field(default_factory=dict)
    noise: float | None = None
    prompt_budget_tokens: int | None = None  # None: what the model's context window allows
    facts: Facts | None = None
    failure: FailedAttempt | None = None  # the previous attempt, when it failed: its code and its evidence
    passed: Solution | None = None  # the last code that passed (the cycle's best, else the parent's)
    passed_speedup: float | None = None
    reference: str = ""  # the task's reference implementation, for writing from the specification
    action_text: str | None = None
    """The instruction in words when it is not a node of the tree (the refine method's standing one)."""
    inspirations: list[Inspiration] = field(default_factory=list)  # evolve: other programs beside the parent


@dataclass
class CodeReply:
    solution: Solution | None = None
    calls: list[LLMCall] = field(default_factory=list)
    error: str | None = None  # one line: why there is no solution
    reply_start: str = ""  # the start of a reply that held no code, as the model wrote it
    failed_call: LLMCall | None = None  # the call whose failure left no reply (the run decides: wait, stop, go on)


class Policy(Protocol):
    name: str
    """Shown in every output: 'offline policy (tunable search, no LLM)' or 'llm: <model>'."""

    async def plan(self, request: PlanRequest) -> PlanReply: ...

    async def code(self, request: CodeRequest) -> CodeReply: ...


# --- one request type per call kind ------------------------------------------------------------------


class RequestError(ValueError):
    """A request that lacks what its call kind needs: a bug in the method that made it."""


def _require(request: Any, *names: str) -> None:
    missing = [n for n in names if getattr(request, n) in (None, [], "")]
    if missing:
        raise RequestError(f"the {request.kind} request needs {', '.join(missing)}")


@dataclass(kw_only=True)
class InitializeTree(PlanRequest):
    """The first plan: the seed (its measured times, when there is one) and the task."""

    kind: Literal["initialize_tree"] = "initialize_tree"


@dataclass(kw_only=True)
class ProposeActions(PlanRequest):
    """More actions under a node (the best's), when the frontier runs low."""

    kind: Literal["propose_actions"] = "propose_actions"

    def __post_init__(self) -> None:
        _require(self, "node_id")


@dataclass(kw_only=True)
class RefinePlan(PlanRequest):
    """After a cycle that passed: what it taught, against the tree."""

    kind: Literal["refine"] = "refine"

    def __post_init__(self) -> None:
        _require(self, "node_id", "attempts", "evidence")


@dataclass(kw_only=True)
class TooHard(PlanRequest):
    """After a cycle with no passing attempt: the obstacle, and smaller steps."""

    kind: Literal["too_hard"] = "too_hard"

    def __post_init__(self) -> None:
        _require(self, "node_id", "attempts", "evidence")


@dataclass(kw_only=True)
class GenerateFromSpec(CodeRequest):
    """A first kernel from the specification (and the task's reference), no base code."""

    kind: Literal["generate_from_spec"] = "generate_from_spec"

    def __post_init__(self) -> None:
        if self.base is not None:
            raise RequestError("a generate_from_spec request writes from the specification: it has no base")


@dataclass(kw_only=True)
class GenerateFromBase(CodeRequest):
    """Attempt 1 of a cycle: the action applied to its parent's code."""

    kind: Literal["generate_from_base"] = "generate_from_base"

    def __post_init__(self) -> None:
        _require(self, "base")


@dataclass(kw_only=True)
class Debug(CodeRequest):
    """After a failed attempt with nothing passing yet: that attempt (its code, or the reply that held
    none) and its evidence, or the code to fix."""

    kind: Literal["debug"] = "debug"

    def __post_init__(self) -> None:
        if self.failure is None and self.current is None:
            raise RequestError("a debug request needs the failed attempt or the code to fix")


@dataclass(kw_only=True)
class Improve(CodeRequest):
    """After a passing attempt: the code to make faster, with its measured times."""

    kind: Literal["improve"] = "improve"

    def __post_init__(self) -> None:
        _require(self, "current")


@dataclass(kw_only=True)
class Evolve(CodeRequest):
    """evolve's mutation: a parent from the program database and other programs beside it."""

    kind: Literal["evolve"] = "evolve"


PLAN_REQUESTS: dict[str, type[PlanRequest]] = {
    "initialize_tree": InitializeTree, "propose_actions": ProposeActions, "refine": RefinePlan, "too_hard": TooHard,
}
CODE_REQUESTS: dict[str, type[CodeRequest]] = {
    "generate_from_spec": GenerateFromSpec, "generate_from_base": GenerateFromBase, "debug": Debug, "improve": Improve,
    "evolve": Evolve,
}


def shown_plan_code(tree: Tree, node_id: str | None, attempts: list[Attempt]) -> set[str]:
    """The kernels an LLM planner's prompt can show (`LLMPolicy._seed_text`, `_code_text`): the root's (the seed), the
    cycle's last attempt with code (too_hard), its best passing attempt, and the node's own solution."""
    ids = {tree.root.solution.solution_id} if tree.root.solution else set()
    last = next((a for a in reversed(attempts) if a.solution_id), None)
    best = max((a for a in attempts if a.passed), key=lambda a: a.speedup or 0.0, default=None)
    node = tree.nodes.get(node_id or "")
    for solution_id in (last and last.solution_id, best and best.solution_id, node and node.solution and node.solution.solution_id):
        if solution_id:
            ids.add(solution_id)
    return ids


def plan_request(kind: str, **fields: Any) -> PlanRequest:
    """The request type of a planner call kind, made and checked."""
    if kind not in PLAN_REQUESTS:
        raise RequestError(f"no planner call kind {kind!r}")
    return PLAN_REQUESTS[kind](**fields)


def code_request(kind: str, **fields: Any) -> CodeRequest:
    """The request type of a coder call kind, made and checked."""
    if kind not in CODE_REQUESTS:
        raise RequestError(f"no coder call kind {kind!r}")
    return CODE_REQUESTS[kind](**fields)
