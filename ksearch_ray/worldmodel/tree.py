"""The world model: a tree of optimization actions for one kernel task (K-Search's intrinsic world model).

Pure data and queries; no Ray and no I/O beyond JSON. The world model is more than a list of
actions: beside the action tree it holds what the search has learned about the kernel, as the
paper's planner keeps it in its head:

* a **kernel summary** on the root: what the current best solution does (planner-written) and
  where its time goes, workload by workload (measured, written by the system);
* **hypotheses** about bottlenecks, each with the evidence for and against it, and a status;
* **open questions** the planner wants answered, and their answers;
* on every action, its **observed outcome**: the attempts' statuses, the best speedup over the
  parent and over the baseline, and a short digest of why attempts failed.

The parts:

* this module: the records (`Tree`, `RootNode`, `ActionNode`, `Hypothesis`, ...), the
  invariants, and queries (`best_solution`, `path_to`, `measured_over_parent`);
* `ops`: the edit-op language and `apply_ops`, the only way a planner changes the tree;
* `select`: the open frontier, the deterministic selection policy, and leases;
* `render`: plain-text views for prompts (within a size budget) and `ksearch show`.

Every function takes a tree and returns a new one, leaving its input untouched, so the actor that
holds the state can snapshot any version and replay edits from the event log.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from enum import StrEnum
from typing import Annotated, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ksearch_ray.models import Status

ROOT_ID: Final = "root"
LOG_LIMIT = 600
"""Characters of evaluation log kept in the tree; the full log lives in the run directory."""

Difficulty = Annotated[
    int, Field(ge=1, le=5, description="1 = a one-line change ... 5 = a research project.")
]
Unit = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]
Speedup = Annotated[float, Field(gt=0.0, allow_inf_nan=False)]
Rating = Annotated[float, Field(ge=0.0, le=10.0, allow_inf_nan=False)]

DEFAULT_DIFFICULTY = 3
DEFAULT_SCORE = 0.5
DEFAULT_EXPECTED_SPEEDUP = 1.1
"""What an action gets for an estimate its planner left out (the op says so in its report)."""


class WorldModelError(Exception):
    """Misuse of the world model by the program (not by the planner: its mistakes become rejected ops)."""


class InvariantError(WorldModelError):
    """A tree that breaks a structural rule; the message lists every problem found."""


class NodeStatus(StrEnum):
    OPEN = "open"
    """Waiting to be picked by the selection policy."""
    LEASED = "leased"
    """A running action cycle is implementing it; see `Tree.leases`."""
    DONE = "done"
    """Holds a passing solution."""
    TOO_HARD = "too_hard"
    """A cycle ended without a passing attempt; the notes say why."""
    SPLIT = "split"
    """Replaced by finer alternatives (its siblings with `split_from` set); kept as a record."""
    CLOSED = "closed"
    """Withdrawn by the planner as not worth trying; kept, with the reason, so it is not proposed again."""


class NoteKind(StrEnum):
    NOTE = "note"
    TOO_HARD = "too_hard"
    MEASURED = "measured"
    SPLIT = "split"
    CLOSED = "closed"


class Note(BaseModel):
    """One piece of evidence attached to a node."""

    model_config = ConfigDict(extra="forbid")

    kind: NoteKind
    text: str = Field(description="One or two sentences; shown to the planner.")
    version: int = Field(description="Tree version that recorded it.")


class EvalSummary(BaseModel):
    """What the planner needs to know about an evaluation; the full record is in the run directory."""

    model_config = ConfigDict(extra="forbid")

    status: Status
    score: float | None = Field(default=None, description="Task score, in the task's own unit.")
    latency_ms: float | None = Field(default=None, description="Representative latency (ms), if timed.")
    speedup: Speedup | None = Field(default=None, description="Speedup over the task's baseline solution.")
    log: str = Field(default="", description=f"Tail of the evaluation log, at most {LOG_LIMIT} characters.")

    @field_validator("log")
    @classmethod
    def _keep_tail(cls, log: str) -> str:
        # Errors and summaries sit at the end of a log, so the tail is the part worth keeping.
        return log if len(log) <= LOG_LIMIT else "..." + log[-(LOG_LIMIT - 3) :]


class SolutionRef(BaseModel):
    """A pointer into the solution store plus the evaluation that justified attaching it."""

    model_config = ConfigDict(extra="forbid")

    solution_id: str = Field(min_length=1, description="Content hash of the solution (`Solution.id`).")
    evaluation: EvalSummary


class ActionFields(BaseModel):
    """The part of an action the planner writes."""

    model_config = ConfigDict(extra="forbid")

    title: str = Field(min_length=1, max_length=200, description="A few words naming the optimization.")
    description: str = Field(default="", description="What to change in the code, concretely.")
    # Defaults, so that a planner that leaves out an estimate loses the estimate, not the action.
    difficulty: Difficulty = DEFAULT_DIFFICULTY
    score: Unit = Field(default=DEFAULT_SCORE, description="Planner's estimate of how promising the action is, 0..1.")
    expected_speedup: Speedup = Field(default=DEFAULT_EXPECTED_SPEEDUP, description="Predicted speedup over the parent's solution.")
    rationale: str = Field(default="", description="Why the planner expects it to help.")
    rating: Rating | None = Field(default=None, description="Planner's 0-10 rating, if it gave one.")
    confidence: Unit | None = Field(default=None, description="Planner's confidence in its estimate, 0..1.")


class ActionNode(ActionFields):
    """An optimization action: a child of the root or of another action."""

    id: str = Field(description="Allocated by the tree: 'n' + seq.")
    parent: str = Field(description="Id of the parent node ('root' or an action id).")
    seq: int = Field(ge=1, description="Creation order; the last tie-break of selection.")
    status: NodeStatus = NodeStatus.OPEN
    solution: SolutionRef | None = Field(default=None, description="Set exactly when status is done.")
    notes: list[Note] = Field(default_factory=list, description="Evidence: reasons, predicted vs measured.")
    split_from: str | None = Field(default=None, description="Id of the split node this one replaces.")
    created_at_version: int = Field(ge=0, description="Tree version whose batch created the node.")
    changed_at_version: int = Field(
        default=0, ge=0, description="Tree version of the last change to its status or planner-written fields: a "
        "planner batch written against an older version may not edit it.")
    outcome: Outcome | None = Field(default=None, description="What the cycles on this action observed.")
    author: str = Field(default="planner", description="'planner', or 'system' for actions the driver added itself.")


class Outcome(BaseModel):
    """What happened when cycles implemented an action: written by the system, read by the planner."""

    model_config = ConfigDict(extra="forbid")

    attempts: int = Field(default=0, ge=0, description="Code generations spent on this action, over all its cycles.")
    statuses: dict[str, int] = Field(default_factory=dict, description="Evaluation status -> count; 'NO_CODE' for replies without code.")
    best_speedup: Speedup | None = Field(default=None, description="Best passing attempt, over the baseline.")
    over_parent: Speedup | None = Field(default=None, description="Best passing attempt, over the parent's solution.")
    failures: str = Field(default="", description=f"Digest of why attempts failed, at most {LOG_LIMIT} characters.")
    budget_cut: bool = Field(default=False, description="The last cycle ended because the budget ran out, not on its merits.")
    cycles: list[str] = Field(default_factory=list, description="Cycles that worked on this action.")

    @field_validator("failures")
    @classmethod
    def _keep_head(cls, text: str) -> str:
        return text if len(text) <= LOG_LIMIT else text[: LOG_LIMIT - 3] + "..."


class KernelSummary(BaseModel):
    """The current best kernel, in words and in measured time."""

    model_config = ConfigDict(extra="forbid")

    text: str = Field(default="", description="Planner-written: what the best solution does and why it is fast or slow.")
    solution_id: str | None = Field(default=None, description="The solution the timings below are of.")
    speedup: Speedup | None = Field(default=None, description="That solution's speedup over the baseline.")
    time_ms: dict[str, float] = Field(default_factory=dict, description="Workload -> mean latency of that solution.")
    baseline_ms: dict[str, float] = Field(default_factory=dict, description="Workload -> mean latency of the baseline.")


class Evidence(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: str = Field(min_length=1)
    version: int


HypothesisStatus = Literal["open", "supported", "refuted", "closed"]
QuestionStatus = Literal["open", "answered", "closed"]


class Hypothesis(BaseModel):
    """A belief about where the kernel's time goes or what limits it, with the evidence both ways."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=r"^h[0-9]+$", description="'h' + number, allocated by the tree.")
    text: str = Field(min_length=1)
    status: HypothesisStatus = "open"
    evidence_for: list[Evidence] = Field(default_factory=list)
    evidence_against: list[Evidence] = Field(default_factory=list)
    actions: list[str] = Field(default_factory=list, description="Action nodes that test or exploit it.")
    created_at_version: int = 0
    changed_at_version: int = Field(default=0, description="Tree version of its last change of status.")


class Question(BaseModel):
    """Something the planner wants measured or tried before it commits."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=r"^q[0-9]+$", description="'q' + number, allocated by the tree.")
    text: str = Field(min_length=1)
    status: QuestionStatus = "open"
    answer: str = ""
    created_at_version: int = 0
    changed_at_version: int = Field(default=0, description="Tree version of its last change of status.")


class RootNode(BaseModel):
    """The task itself; its solution, if any, is the seed the first actions start from."""

    model_config = ConfigDict(extra="forbid")

    id: Literal["root"] = ROOT_ID
    title: str = Field(description="Task name.")
    description: str = Field(default="", description="The task specification, as prompts show it.")
    solution: SolutionRef | None = Field(default=None, description="The seed kernel, if the search has one.")
    notes: list[Note] = Field(default_factory=list)
    summary: KernelSummary = Field(default_factory=KernelSummary, description="The current best kernel, summarised.")
    changed_at_version: int = Field(default=0, description="Tree version of the last rewrite of the summary's text.")


class Lease(BaseModel):
    """A claim by one running cycle on one node; times are on the caller's clock, in seconds."""

    model_config = ConfigDict(extra="forbid")

    node_id: str
    holder: str = Field(min_length=1, description="Who runs the cycle, e.g. 'cycle-12'.")
    granted_at: float
    expires_at: float


class Tree(BaseModel):
    """The whole world model of one run. Edit it only through `worldmodel.ops` and `worldmodel.select`."""

    model_config = ConfigDict(extra="forbid")

    root: RootNode
    nodes: dict[str, ActionNode] = Field(default_factory=dict, description="Action nodes by id.")
    leases: dict[str, Lease] = Field(default_factory=dict, description="Live leases by node id.")
    hypotheses: dict[str, Hypothesis] = Field(default_factory=dict, description="Bottleneck hypotheses by id.")
    questions: dict[str, Question] = Field(default_factory=dict, description="Open and answered questions by id.")
    next_item: int = Field(default=1, ge=1, description="Counter for hypothesis and question ids.")
    version: int = Field(default=0, ge=0, description="Incremented once per call that changed the tree.")
    next_seq: int = Field(
        default=1, ge=1, description="Counter for node ids; never reused, even after a prune."
    )

    def get(self, node_id: str) -> ActionNode | RootNode | None:
        return self.root if node_id == ROOT_ID else self.nodes.get(node_id)

    def children(self, node_id: str) -> list[ActionNode]:
        return sorted((n for n in self.nodes.values() if n.parent == node_id), key=lambda n: n.seq)


def new_tree(title: str, description: str = "", seed: SolutionRef | None = None) -> Tree:
    return Tree(root=RootNode(title=title, description=description, solution=seed))


# ----------------------------------------------------------------------------------------- invariants


def invariant_problems(tree: Tree, solution_exists: Callable[[str], bool] | None = None,
                       only: set[str] | None = None) -> list[str]:
    """Every broken rule, one line each; solution ids are checked only when `solution_exists` is given.

    `only`: the ids a batch touched. An edit batch changes nothing else, so checking those (and the
    counters) is enough, and it keeps a batch's cost independent of the size of the tree."""
    problems: list[str] = []
    nodes = tree.nodes if only is None else {k: tree.nodes[k] for k in only if k in tree.nodes}
    for key, node in nodes.items():
        if key != node.id or node.id != f"n{node.seq}":
            problems.append(f"node stored as {key!r} has id {node.id!r} and seq {node.seq}")
        if node.seq >= tree.next_seq:
            problems.append(f"{node.id}: seq {node.seq} not below the id counter {tree.next_seq}")
        if tree.get(node.parent) is None:
            problems.append(f"{node.id}: parent {node.parent} does not exist")
        if (node.status is NodeStatus.DONE) != (node.solution is not None):
            problems.append(
                f"{node.id}: status {node.status} but solution is {'set' if node.solution else 'missing'}"
            )
        if (node.status is NodeStatus.LEASED) != (node.id in tree.leases):
            problems.append(f"{node.id}: status {node.status} disagrees with the lease table")
    problems += _cycle_problems(tree, nodes.values())
    for table in (tree.hypotheses, tree.questions):
        for key, item in table.items():
            if key != item.id:
                problems.append(f"item stored as {key!r} has id {item.id!r}")
            if int(item.id[1:]) >= tree.next_item:
                problems.append(f"{item.id}: number not below the item counter {tree.next_item}")
    leases = tree.leases if only is None else {k: tree.leases[k] for k in only if k in tree.leases}
    for node_id, lease in leases.items():
        if node_id != lease.node_id or node_id not in tree.nodes:
            problems.append(f"lease on {node_id!r} names a missing node or the wrong one")
    holders: list[ActionNode | RootNode] = [tree.root, *nodes.values()]
    for holder in holders:
        if holder.solution is None:
            continue
        if holder.solution.evaluation.status is not Status.PASSED:
            problems.append(
                f"{holder.id}: attached solution did not pass ({holder.solution.evaluation.status})"
            )
        if solution_exists is not None and not solution_exists(holder.solution.solution_id):
            problems.append(f"{holder.id}: solution {holder.solution.solution_id} is not in the store")
    return problems


def _cycle_problems(tree: Tree, starts: Iterable[ActionNode]) -> list[str]:
    problems = []
    for start in starts:
        seen = {start.id}
        parent = start.parent
        while parent in tree.nodes:
            if parent in seen:
                problems.append(f"{start.id}: its ancestors form a cycle through {parent}")
                break
            seen.add(parent)
            parent = tree.nodes[parent].parent
    return problems


def check_invariants(tree: Tree, solution_exists: Callable[[str], bool] | None = None,
                     only: set[str] | None = None) -> None:
    problems = invariant_problems(tree, solution_exists, only)
    if problems:
        raise InvariantError("; ".join(problems))


# -------------------------------------------------------------------------------------------- queries


def path_to(tree: Tree, node_id: str) -> list[ActionNode | RootNode]:
    """Root first, `node_id` last. Raises KeyError for a missing node."""
    node = tree.get(node_id)
    if node is None:
        raise KeyError(node_id)
    path: list[ActionNode | RootNode] = [node]
    while isinstance(node, ActionNode):
        node = tree.get(node.parent)
        if node is None or any(node.id == seen.id for seen in path):
            raise InvariantError(f"the path from {node_id} does not reach the root")
        path.append(node)
    return path[::-1]


def subtree_ids(tree: Tree, node_id: str) -> list[str]:
    """`node_id` and all its descendants, parents before children."""
    out = [node_id]
    for current in out:  # the list grows while we walk it: a breadth-first traversal
        out += [child.id for child in tree.children(current)]
    return out


def solution_speedup(node: ActionNode | RootNode) -> float | None:
    """Measured speedup over the baseline of the node's solution, if both exist."""
    return node.solution.evaluation.speedup if node.solution else None


def parent_speedup(tree: Tree, node: ActionNode) -> float | None:
    """Speedup over the baseline that `node.expected_speedup` multiplies.

    A root without a seed means the actions start from the baseline itself, hence 1.0.
    """
    parent = tree.get(node.parent)
    if parent is None:
        return None
    if isinstance(parent, RootNode) and parent.solution is None:
        return 1.0
    return solution_speedup(parent)


def measured_over_parent(tree: Tree, node: ActionNode) -> float | None:
    """The measured counterpart of `expected_speedup`, when both speedups are known."""
    mine, theirs = solution_speedup(node), parent_speedup(tree, node)
    return mine / theirs if mine is not None and theirs is not None else None


def best_solution(tree: Tree) -> ActionNode | None:
    """The done action with the highest speedup over the baseline; the oldest wins a tie.

    Solutions whose evaluation carries no speedup cannot be ranked and are skipped.
    """
    ranked = [n for n in tree.nodes.values() if solution_speedup(n) is not None]
    return min(ranked, key=lambda n: (-(solution_speedup(n) or 0.0), n.seq), default=None)


def best_speedup(tree: Tree) -> float | None:
    best = best_solution(tree)
    return solution_speedup(best) if best else None
