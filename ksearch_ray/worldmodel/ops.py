"""The edit-op language: the only way a planner changes the world model.

A planner (an LLM, or the offline policy) replies with a list of ops as JSON objects, each tagged
by "op". `apply_ops` validates and applies them in order. A malformed op, or one that names a node
that does not exist or is in the wrong state, is rejected with a one-line reason the planner can
read on its next call; the rest of the batch still applies, because one typo should not throw away
a whole reply.

Placeholders let one reply build a subtree: an insert (or a split alternative) may carry
`"ref": "a"`, and any later op of the same batch may name that node as `"$a"`.

Split, by choice: the open node is retired with status `split` (kept, not pruned, so the tree
still says that the planner found it too coarse) and its alternatives are inserted as its siblings,
each with `split_from` pointing back at it. Only an open node without children can be split: a
leased one is being worked on, a done one has a solution, and children would be stranded under a
retired node.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from ksearch_ray.models import Status
from ksearch_ray.worldmodel.tree import (
    ActionFields,
    ActionNode,
    Difficulty,
    EvalSummary,
    NodeStatus,
    Note,
    NoteKind,
    Rating,
    RootNode,
    SolutionRef,
    Speedup,
    Tree,
    Unit,
    check_invariants,
    measured_over_parent,
    subtree_ids,
)

NodeRef = Annotated[
    str, Field(min_length=1, description="A node id ('n7'), 'root', or a placeholder ('$a').")
]
RefName = Annotated[
    str, Field(pattern=r"^\$?[A-Za-z0-9_-]{1,32}$", description="Placeholder name, e.g. 'a'.")
]


class NewAction(ActionFields):
    """An action to create; `ref` names it for later ops of the same batch."""

    ref: RefName | None = None


class InsertOp(NewAction):
    """Add an open action under `parent`."""

    op: Literal["insert"]
    parent: NodeRef


class UpdateOp(BaseModel):
    """Change some of a node's planner-written fields; omitted fields keep their value.

    `status` may only be "open", to reopen a too_hard node with new insight; everything else about
    status goes through the other ops, and id and parent never change.
    """

    model_config = ConfigDict(extra="forbid")

    op: Literal["update"]
    node: NodeRef
    title: str | None = Field(default=None, min_length=1, max_length=200)
    description: str | None = None
    difficulty: Difficulty | None = None
    score: Unit | None = None
    expected_speedup: Speedup | None = None
    rationale: str | None = None
    rating: Rating | None = None
    confidence: Unit | None = None
    status: Literal["open"] | None = None
    note: str | None = Field(
        default=None, min_length=1, description="Evidence to append to the node's notes."
    )


class SplitOp(BaseModel):
    """Replace an open action by two or more finer alternatives (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")

    op: Literal["split"]
    node: NodeRef
    alternatives: list[NewAction] = Field(min_length=2)
    reason: str = ""


class MarkTooHardOp(BaseModel):
    """Record that an action could not be implemented, and why."""

    model_config = ConfigDict(extra="forbid")

    op: Literal["mark_too_hard"]
    node: NodeRef
    reason: str = Field(min_length=1)


class AttachSolutionOp(BaseModel):
    """Attach a passing solution to an action (which becomes done) or, as the seed, to the root."""

    model_config = ConfigDict(extra="forbid")

    op: Literal["attach_solution"]
    node: NodeRef
    solution_id: str = Field(min_length=1)
    evaluation: EvalSummary


class PruneOp(BaseModel):
    """Remove a subtree of untried ideas; solutions, running work and failure evidence are never pruned."""

    model_config = ConfigDict(extra="forbid")

    op: Literal["prune"]
    node: NodeRef


EditOp = Annotated[
    InsertOp | UpdateOp | SplitOp | MarkTooHardOp | AttachSolutionOp | PruneOp, Field(discriminator="op")
]
_EDIT_OP: TypeAdapter[EditOp] = TypeAdapter(EditOp)
_OP_NAMES = {"insert", "update", "split", "mark_too_hard", "attach_solution", "prune"}


class OpResult(BaseModel):
    """The fate of one op of a batch."""

    index: int = Field(description="Position of the op in the batch, from 0.")
    op: str = Field(description="The op's tag, or '?' when it had none.")
    ok: bool
    created: list[str] = Field(default_factory=list, description="Ids of the nodes the op created.")
    removed: list[str] = Field(default_factory=list, description="Ids of the nodes the op pruned.")
    reason: str = Field(default="", description="One line saying why the op was rejected.")


class ApplyReport(BaseModel):
    results: list[OpResult]
    refs: dict[str, str] = Field(default_factory=dict, description="Placeholder name -> id it created.")
    version_before: int
    version: int

    @property
    def changed(self) -> bool:
        return self.version != self.version_before

    @property
    def rejected(self) -> list[OpResult]:
        return [r for r in self.results if not r.ok]

    def render(self) -> str:
        """One line per op, for the planner's next prompt."""
        lines = []
        for r in self.results:
            if not r.ok:
                lines.append(f"op {r.index} {r.op}: REJECTED: {r.reason}")
                continue
            detail = ", ".join(
                ([f"created {' '.join(r.created)}"] if r.created else [])
                + ([f"removed {' '.join(r.removed)}"] if r.removed else [])
            )
            lines.append(f"op {r.index} {r.op}: ok" + (f" ({detail})" if detail else ""))
        return "\n".join(lines)


class OpRejected(Exception):
    """A planner's op that cannot apply; the message is the one-line reason it will read."""


@dataclass
class _Batch:
    version: int
    solution_exists: Callable[[str], bool]
    refs: dict[str, str] = field(default_factory=dict)
    dead_refs: dict[str, int] = field(default_factory=dict)
    """Placeholders whose creating op was rejected -> that op's index, so later ops can say so."""


def apply_ops(
    tree: Tree, ops: Sequence[EditOp | Mapping[str, Any]], *, solution_exists: Callable[[str], bool]
) -> tuple[Tree, ApplyReport]:
    """Apply `ops` in order to a copy of `tree`; return the new tree and a per-op report.

    Ops may be models or raw dicts straight from an LLM's JSON. The version goes up by one if any
    op changed the tree. A tree that breaks an invariant before or after the batch is a bug
    elsewhere and raises InvariantError.
    """
    check_invariants(tree)
    work = tree.model_copy(deep=True)
    batch = _Batch(version=tree.version + 1, solution_exists=solution_exists)
    results = []
    for index, raw in enumerate(ops):
        name = _op_name(raw)
        try:
            op = raw if isinstance(raw, BaseModel) else _EDIT_OP.validate_python(raw)
            # Handlers check everything before they change anything, so a rejected op leaves no trace.
            created, removed = _apply_one(work, op, batch)
        except (ValidationError, OpRejected) as exc:
            _bury_refs(raw, index, batch)
            reason = _one_line(exc) if isinstance(exc, ValidationError) else str(exc)
            results.append(OpResult(index=index, op=name, ok=False, reason=reason))
            continue
        results.append(OpResult(index=index, op=name, ok=True, created=created, removed=removed))
    if work != tree:
        work.version = batch.version
    # Handlers keep the invariants by construction; a violation here is their bug, not the
    # planner's, and must stop the run loudly rather than be reported as a rejected op.
    check_invariants(work, solution_exists)
    report = ApplyReport(results=results, refs=batch.refs, version_before=tree.version, version=work.version)
    return work, report


def _apply_one(tree: Tree, op: BaseModel, batch: _Batch) -> tuple[list[str], list[str]]:
    """Apply one validated op in place on the batch's working copy; returns (created, removed)."""
    if isinstance(op, InsertOp):
        return _insert(tree, op, batch), []
    if isinstance(op, UpdateOp):
        _update(tree, op, batch)
    elif isinstance(op, SplitOp):
        return _split(tree, op, batch), []
    elif isinstance(op, MarkTooHardOp):
        _mark_too_hard(tree, op, batch)
    elif isinstance(op, AttachSolutionOp):
        _attach_solution(tree, op, batch)
    elif isinstance(op, PruneOp):
        return [], _prune(tree, op, batch)
    else:
        raise TypeError(f"not an edit op: {type(op).__name__}")
    return [], []


# ------------------------------------------------------------------------------------------ the ops


def _insert(tree: Tree, op: InsertOp, batch: _Batch) -> list[str]:
    parent = _resolve(tree, op.parent, batch)
    if isinstance(parent, ActionNode) and parent.status is NodeStatus.SPLIT:
        raise OpRejected(
            f"{parent.id} was split; insert under {parent.parent} or under one of its alternatives"
        )
    _check_new_refs([op], batch)
    return [_add_node(tree, op, parent.id, batch)]


def _update(tree: Tree, op: UpdateOp, batch: _Batch) -> None:
    node = _resolve_action(tree, op.node, batch)
    changes = op.model_dump(exclude_unset=True, exclude={"op", "node", "note", "status"})
    if not changes and op.note is None and op.status is None:
        raise OpRejected("nothing to update: give at least one field, a note or status")
    if op.status is not None and node.status is not NodeStatus.TOO_HARD:
        raise OpRejected(f"only a too_hard node can be reopened; {node.id} is {node.status}")
    try:
        updated = ActionNode.model_validate({**node.model_dump(), **changes})
    except ValidationError as exc:
        raise OpRejected(_one_line(exc)) from None
    if op.status is not None:
        updated.status = NodeStatus.OPEN
        updated.notes.append(Note(kind=NoteKind.NOTE, text="reopened by the planner", version=batch.version))
    if op.note is not None:
        updated.notes.append(Note(kind=NoteKind.NOTE, text=op.note, version=batch.version))
    tree.nodes[node.id] = updated


def _split(tree: Tree, op: SplitOp, batch: _Batch) -> list[str]:
    node = _resolve_action(tree, op.node, batch)
    if node.status is not NodeStatus.OPEN:
        raise OpRejected(f"only an open node can be split; {node.id} is {node.status}")
    if tree.children(node.id):
        raise OpRejected(f"{node.id} has children; prune or re-plan them before splitting it")
    _check_new_refs(op.alternatives, batch)
    created = [_add_node(tree, alt, node.parent, batch, split_from=node.id) for alt in op.alternatives]
    node.status = NodeStatus.SPLIT
    text = f"split into {', '.join(created)}" + (f": {op.reason}" if op.reason else "")
    node.notes.append(Note(kind=NoteKind.SPLIT, text=text, version=batch.version))
    return created


def _mark_too_hard(tree: Tree, op: MarkTooHardOp, batch: _Batch) -> None:
    node = _resolve_action(tree, op.node, batch)
    if node.status not in (NodeStatus.OPEN, NodeStatus.LEASED):
        raise OpRejected(f"only an open or leased node can be marked too hard; {node.id} is {node.status}")
    node.status = NodeStatus.TOO_HARD
    tree.leases.pop(node.id, None)
    node.notes.append(Note(kind=NoteKind.TOO_HARD, text=op.reason, version=batch.version))


def _attach_solution(tree: Tree, op: AttachSolutionOp, batch: _Batch) -> None:
    target = _resolve(tree, op.node, batch)
    if op.evaluation.status is not Status.PASSED:
        raise OpRejected(
            f"only a PASSED solution can be attached (got {op.evaluation.status}); use mark_too_hard"
        )
    if not batch.solution_exists(op.solution_id):
        raise OpRejected(f"solution {op.solution_id} is not in the solution store")
    ref = SolutionRef(solution_id=op.solution_id, evaluation=op.evaluation)
    if isinstance(target, RootNode):
        target.solution = ref
        return
    if target.status is NodeStatus.SPLIT:
        raise OpRejected(f"{target.id} was split; attach the solution to the alternative it implements")
    if target.solution is not None:
        old = target.solution
        text = f"replaced solution {old.solution_id} ({_fmt_speedup(old.evaluation.speedup)} vs baseline)"
        target.notes.append(Note(kind=NoteKind.NOTE, text=text, version=batch.version))
    target.solution = ref
    target.status = NodeStatus.DONE
    # Whoever held the lease is finished with the node, even if it is not the one reporting.
    tree.leases.pop(target.id, None)
    measured = measured_over_parent(tree, target)
    text = f"predicted {target.expected_speedup:.2f}x over parent, measured {_fmt_speedup(measured)}"
    target.notes.append(Note(kind=NoteKind.MEASURED, text=text, version=batch.version))


def _prune(tree: Tree, op: PruneOp, batch: _Batch) -> list[str]:
    node = _resolve_action(tree, op.node, batch)
    doomed = subtree_ids(tree, node.id)
    for kind, statuses in (
        ("a solution", {NodeStatus.DONE}),
        ("running work", {NodeStatus.LEASED}),
        ("failure evidence", {NodeStatus.TOO_HARD}),
    ):
        hits = [i for i in doomed if tree.nodes[i].status in statuses]
        if hits:
            raise OpRejected(
                f"the subtree of {node.id} holds {kind} ({', '.join(hits)}); it cannot be pruned"
            )
    for node_id in doomed:
        del tree.nodes[node_id]
    return doomed


# ------------------------------------------------------------------------------------------ helpers


def _add_node(
    tree: Tree, action: NewAction, parent: str, batch: _Batch, split_from: str | None = None
) -> str:
    node_id = f"n{tree.next_seq}"
    tree.nodes[node_id] = ActionNode(
        **action.model_dump(include=set(ActionFields.model_fields)),
        id=node_id,
        parent=parent,
        seq=tree.next_seq,
        split_from=split_from,
        created_at_version=batch.version,
    )
    tree.next_seq += 1
    if action.ref is not None:
        batch.refs[action.ref.lstrip("$")] = node_id
    return node_id


def _check_new_refs(actions: Sequence[NewAction], batch: _Batch) -> None:
    names = [a.ref.lstrip("$") for a in actions if a.ref is not None]
    for name in names:
        if name in batch.refs or name in batch.dead_refs or names.count(name) > 1:
            raise OpRejected(f"placeholder ${name} is already used in this batch")


def _resolve(tree: Tree, ref: str, batch: _Batch) -> ActionNode | RootNode:
    if ref.startswith("$"):
        name = ref[1:]
        if name in batch.dead_refs:
            raise OpRejected(f"placeholder {ref} was not created: op {batch.dead_refs[name]} was rejected")
        if name not in batch.refs:
            raise OpRejected(
                f'unknown placeholder {ref}; define it with "ref" on an earlier insert of this batch'
            )
        ref = batch.refs[name]
    node = tree.get(ref)
    if node is None:
        raise OpRejected(f"no node {ref} in the tree")
    return node


def _resolve_action(tree: Tree, ref: str, batch: _Batch) -> ActionNode:
    node = _resolve(tree, ref, batch)
    if isinstance(node, RootNode):
        raise OpRejected("the root is the task itself; this op applies to action nodes only")
    return node


def _bury_refs(raw: object, index: int, batch: _Batch) -> None:
    """Remember the placeholders a rejected op would have defined, to explain later failures."""
    if isinstance(raw, BaseModel):
        raw = raw.model_dump()
    if not isinstance(raw, Mapping):
        return
    wanted = [raw.get("ref")] + [
        a.get("ref") for a in raw.get("alternatives") or [] if isinstance(a, Mapping)
    ]
    for ref in wanted:
        if isinstance(ref, str) and ref.lstrip("$") not in batch.refs:
            batch.dead_refs.setdefault(ref.lstrip("$"), index)


def _op_name(raw: object) -> str:
    tag = raw.get("op") if isinstance(raw, Mapping) else getattr(raw, "op", None)
    return tag if isinstance(tag, str) and tag in _OP_NAMES else "?"


def _one_line(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors(include_url=False):
        loc = [str(x) for x in err["loc"]]
        # A tagged union puts the tag first in the location; the planner already knows which op it wrote.
        if loc and loc[0] in _OP_NAMES:
            loc = loc[1:]
        text = f"{'.'.join(loc)}: {err['msg']}" if loc else err["msg"]
        value = err.get("input")
        if err["type"] != "missing" and isinstance(value, str | int | float | bool):
            text += f" (got {str(value)[:40]!r})" if isinstance(value, str) else f" (got {value!r})"
        parts.append(text)
    return "; ".join(parts).replace("\n", " ")


def _fmt_speedup(value: float | None) -> str:
    return f"{value:.2f}x" if value is not None else "unknown"
