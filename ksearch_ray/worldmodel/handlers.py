"""How each edit op changes the tree (the op language itself is in `ops`).

Every handler works in place on the batch's working tree, checks everything before it changes
anything (so a rejected op leaves no trace), and raises OpRejected with the one line the planner
will read.

Copy on write: the working tree starts as a shallow copy (new dicts, shared items), and an item is
copied the first time an op of the batch resolves it, so the input tree is never changed and a
batch costs what it touches, not the size of the tree.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError

from ksearch_ray.models import Status
from ksearch_ray.worldmodel.tree import (
    ActionFields,
    ActionNode,
    Evidence,
    Hypothesis,
    NodeStatus,
    Note,
    NoteKind,
    Question,
    RootNode,
    SolutionRef,
    Tree,
    measured_over_parent,
    subtree_ids,
)

SYSTEM_OPS = frozenset({"attach_solution", "record_outcome", "set_best", "insert_continuation"})

CONTINUATION_TITLE = "Improve the best solution further"
CONTINUATION_DESCRIPTION = (
    "Find what limits the current best solution most (read its measurements) and change that, "
    "keeping everything that already works."
)


class OpRejected(Exception):
    """A planner's op that cannot apply; the message is the one-line reason it will read."""


@dataclass
class Batch:
    version: int
    solution_exists: Callable[[str], bool]
    base: int | None = None
    """The tree version a planner's batch was written against; None: the current one (no conflicts)."""
    max_new: int | None = None
    """How many new actions the batch may add (inserts and split alternatives); None: no limit."""
    new_nodes: int = 0
    notes: list[str] = field(default_factory=list)
    """What the op being applied did beyond the obvious (defaults filled in, parts skipped): said in its report."""
    refs: dict[str, str] = field(default_factory=dict)
    dead_refs: dict[str, int] = field(default_factory=dict)
    """Placeholders whose creating op was rejected -> that op's index, so later ops can say so."""
    changed: bool = False
    owned: set[str] = field(default_factory=set)
    """Ids of the items this batch has already copied into the working tree."""


def working_copy(tree: Tree) -> Tree:
    """A tree that shares its items with `tree` until a handler resolves (and so copies) them."""
    return tree.model_copy(update={
        "nodes": dict(tree.nodes), "leases": dict(tree.leases), "hypotheses": dict(tree.hypotheses),
        "questions": dict(tree.questions),
    })


Item = ActionNode | RootNode | Hypothesis | Question
Handler = Callable[[Tree, Any, Batch], tuple[list[str], list[str]]]


def handler_for(op: Any) -> Handler:
    return _HANDLERS[op.op]


def _changed(batch: Batch, created: list[str] | None = None, removed: list[str] | None = None) -> tuple[list[str], list[str]]:
    batch.changed = True
    return created or [], removed or []


def _touch(item: Item, batch: Batch) -> None:
    """Mark an item's status or planner-written fields as changed by this batch."""
    item.changed_at_version = batch.version


def _stale(item: Item, batch: Batch) -> bool:
    """Changed by another edit after the version this batch was written against (not by this batch)."""
    return batch.base is not None and batch.base < item.changed_at_version < batch.version


def _check_fresh(item: Item, batch: Batch) -> None:
    if _stale(item, batch):
        now = f", now {item.status}" if hasattr(item, "status") else ""
        raise OpRejected(f"{item.id} was changed (version {item.changed_at_version}{now}) after the version this reply "
                         f"was written for ({batch.base}); not applied: plan it again against the tree as it is now")


def _title_key(title: str) -> str:
    return " ".join(re.sub(r"[^\w]+", " ", title.casefold()).split())


def _check_new_actions(tree: Tree, parent: str, titles: list[str], batch: Batch) -> None:
    """No two actions of one parent with the same title (concurrent planner calls propose the same idea),
    and no more new actions in one batch than it may add."""
    keys = [_title_key(t) for t in titles]
    for key, title in zip(keys, titles, strict=True):
        if keys.count(key) > 1:
            raise OpRejected(f"the title {title!r} is given twice")
        twin = next((n for n in tree.nodes.values() if n.parent == parent and _title_key(n.title) == key), None)
        if twin is not None:
            raise OpRejected(f"{parent} already has this action: {twin.id} {twin.title!r} ({twin.status}); "
                             "update it instead of adding it again")
    if batch.max_new is not None and batch.new_nodes + len(titles) > batch.max_new:
        raise OpRejected(f"a reply may add at most {batch.max_new} new actions, and this op would be number "
                         f"{batch.new_nodes + len(titles)}: not applied (propose it again later if still worth it)")


def _note_defaults(action: BaseModel, batch: Batch, who: str = "") -> None:
    missing = [name for name in ("difficulty", "score", "expected_speedup") if name not in action.model_fields_set]
    if missing:
        values = ", ".join(f"{name} {getattr(action, name):g}" for name in missing)
        batch.notes.append(f"{who}defaults used for what was not given: {values}")


# ------------------------------------------------------------------------------------- planner ops


def _insert(tree: Tree, op: Any, batch: Batch) -> tuple[list[str], list[str]]:
    parent = _resolve_node(tree, op.parent, batch)
    if isinstance(parent, ActionNode) and parent.status in (NodeStatus.SPLIT, NodeStatus.CLOSED):
        raise OpRejected(f"{parent.id} is {parent.status}; insert under {parent.parent} or another action")
    _check_new_refs([op.ref], batch)
    _check_new_actions(tree, parent.id, [op.title], batch)
    _note_defaults(op, batch)
    return _changed(batch, [_add_node(tree, op, parent.id, batch)])


def _update(tree: Tree, op: Any, batch: Batch) -> tuple[list[str], list[str]]:
    node = _resolve_node(tree, op.node, batch)
    if isinstance(node, RootNode):
        action_fields = op.model_dump(exclude_unset=True, exclude={"op", "node", "note", "summary"})
        if action_fields:
            raise OpRejected(f"the root takes only summary and note, not {', '.join(sorted(action_fields))}")
        if op.summary is None and op.note is None:
            raise OpRejected("nothing to update: give summary or note")
        if op.summary is not None:
            _check_fresh(node, batch)
            node.summary.text = op.summary
            _touch(node, batch)
        if op.note is not None:
            node.notes.append(Note(kind=NoteKind.NOTE, text=op.note, version=batch.version))
        return _changed(batch)
    if op.summary is not None:
        raise OpRejected("summary belongs to the root; use note for an action")
    changes = op.model_dump(exclude_unset=True, exclude={"op", "node", "note", "status", "summary"})
    if not changes and op.note is None and op.status is None:
        raise OpRejected("nothing to update: give at least one field, a note or status")
    if op.status is not None and node.status is not NodeStatus.TOO_HARD:
        raise OpRejected(f"only a too_hard node can be reopened; {node.id} is {node.status}")
    if changes or op.status is not None:
        _check_fresh(node, batch)  # a note is evidence and may land on any version
    try:
        updated = ActionNode.model_validate({**node.model_dump(), **changes})
    except ValidationError as exc:
        raise OpRejected(one_line(exc, set())) from None
    if op.status is not None:
        updated.status = NodeStatus.OPEN
        updated.notes.append(Note(kind=NoteKind.NOTE, text="reopened by the planner", version=batch.version))
    if op.note is not None:
        updated.notes.append(Note(kind=NoteKind.NOTE, text=op.note, version=batch.version))
    if changes or op.status is not None:
        _touch(updated, batch)
    tree.nodes[node.id] = updated
    return _changed(batch)


def _split(tree: Tree, op: Any, batch: Batch) -> tuple[list[str], list[str]]:
    node = _resolve_action(tree, op.node, batch)
    if node.status is NodeStatus.OPEN:
        if len(op.alternatives) < 2:
            raise OpRejected("splitting an open action takes two or more alternatives")
        if tree.children(node.id):
            raise OpRejected(f"{node.id} has children; prune or re-plan them before splitting it")
    elif node.status is not NodeStatus.TOO_HARD:
        raise OpRejected(f"only an open or too_hard node can be split; {node.id} is {node.status}")
    _check_fresh(node, batch)
    _check_new_refs([a.ref for a in op.alternatives], batch)
    _check_new_actions(tree, node.parent, [a.title for a in op.alternatives], batch)
    for i, alt in enumerate(op.alternatives):
        _note_defaults(alt, batch, f"alternative {i}: ")
    created = [_add_node(tree, alt, node.parent, batch, split_from=node.id) for alt in op.alternatives]
    if node.status is NodeStatus.OPEN:
        node.status = NodeStatus.SPLIT
        _touch(node, batch)
    text = f"split into {', '.join(created)}" + (f": {op.reason}" if op.reason else "")
    node.notes.append(Note(kind=NoteKind.SPLIT, text=text, version=batch.version))
    return _changed(batch, created)


def _mark_too_hard(tree: Tree, op: Any, batch: Batch) -> tuple[list[str], list[str]]:
    node = _resolve_action(tree, op.node, batch)
    if node.status not in (NodeStatus.OPEN, NodeStatus.LEASED, NodeStatus.TOO_HARD):
        raise OpRejected(f"only an open, leased or too_hard node can be marked too hard; {node.id} is {node.status}")
    if node.status is not NodeStatus.TOO_HARD:
        _check_fresh(node, batch)  # a reason added to a too-hard verdict is evidence, whatever the version
        _touch(node, batch)
    node.status = NodeStatus.TOO_HARD
    tree.leases.pop(node.id, None)
    node.notes.append(Note(kind=NoteKind.TOO_HARD, text=op.reason, version=batch.version))
    return _changed(batch)


def _prune(tree: Tree, op: Any, batch: Batch) -> tuple[list[str], list[str]]:
    node = _resolve_action(tree, op.node, batch)
    _check_fresh(node, batch)
    doomed = subtree_ids(tree, node.id)
    for kind, statuses in (
        ("a solution", {NodeStatus.DONE}),
        ("running work", {NodeStatus.LEASED}),
        ("failure evidence", {NodeStatus.TOO_HARD}),
    ):
        hits = [i for i in doomed if tree.nodes[i].status in statuses]
        if hits:
            raise OpRejected(f"the subtree of {node.id} holds {kind} ({', '.join(hits)}); it cannot be pruned")
    for node_id in doomed:
        del tree.nodes[node_id]
    gone = set(doomed)
    for key, hypothesis in list(tree.hypotheses.items()):
        if gone & set(hypothesis.actions):
            tree.hypotheses[key] = hypothesis.model_copy(update={"actions": [a for a in hypothesis.actions if a not in gone]})
    return _changed(batch, removed=doomed)


def _close(tree: Tree, op: Any, batch: Batch) -> tuple[list[str], list[str]]:
    item = _resolve_item(tree, op.target, batch)
    if not isinstance(item, RootNode):
        _check_fresh(item, batch)
    if isinstance(item, Hypothesis):
        _touch(item, batch)
        item.status = op.verdict or "closed"
        if op.reason:
            (item.evidence_against if item.status == "refuted" else item.evidence_for).append(
                Evidence(text=op.reason, version=batch.version)
            )
        return _changed(batch)
    if op.verdict is not None:
        raise OpRejected("verdict applies to hypotheses only")
    if isinstance(item, Question):
        if not op.reason:
            raise OpRejected(f"closing question {item.id} needs its answer in reason")
        item.status, item.answer = "answered", op.reason
        _touch(item, batch)
        return _changed(batch)
    if isinstance(item, RootNode):
        raise OpRejected("the root is the task itself and cannot be closed")
    if item.status is not NodeStatus.OPEN:
        raise OpRejected(f"only an open action can be closed; {item.id} is {item.status}")
    if tree.children(item.id):
        raise OpRejected(f"{item.id} has children; prune them first or mark it too hard instead")
    item.status = NodeStatus.CLOSED
    _touch(item, batch)
    item.notes.append(Note(kind=NoteKind.CLOSED, text=op.reason or "closed by the planner", version=batch.version))
    return _changed(batch)


def _reprioritise(tree: Tree, op: Any, batch: Batch) -> tuple[list[str], list[str]]:
    """Rescores what it can: an entry for a node that is not open, or that changed since the reply was
    written, is skipped on its own (and said in the report), not the whole op."""
    applied: list[tuple[ActionNode, float]] = []
    skipped: list[str] = []
    for ref, score in op.scores.items():
        try:
            node = _resolve_action(tree, ref, batch)
            if node.status is not NodeStatus.OPEN:
                raise OpRejected(f"{node.id} is {node.status}, not open")
            _check_fresh(node, batch)
        except OpRejected as exc:
            skipped.append(f"{ref}: {exc}")
            continue
        applied.append((node, score))
    if not applied:
        raise OpRejected("no score could change: " + "; ".join(skipped))
    for node, score in applied:
        if score != node.score:
            node.notes.append(Note(kind=NoteKind.NOTE, text=f"score {node.score:.2f} -> {score:.2f}: {op.reason}",
                                   version=batch.version))
            node.score = score
            _touch(node, batch)
    batch.notes += [f"not rescored: {line}" for line in skipped]
    return _changed(batch)


def _annotate(tree: Tree, op: Any, batch: Batch) -> tuple[list[str], list[str]]:
    item = _resolve_item(tree, op.target, batch)
    if isinstance(item, Hypothesis):
        if op.stance is None:
            raise OpRejected(f'evidence on hypothesis {item.id} needs "stance": "for" or "against"')
        (item.evidence_for if op.stance == "for" else item.evidence_against).append(Evidence(text=op.text, version=batch.version))
        return _changed(batch)
    if op.stance is not None:
        raise OpRejected("stance applies to hypotheses only")
    if isinstance(item, Question):
        item.answer = f"{item.answer} {op.text}".strip()
        return _changed(batch)
    item.notes.append(Note(kind=NoteKind.NOTE, text=op.text, version=batch.version))
    return _changed(batch)


def _add_hypothesis(tree: Tree, op: Any, batch: Batch) -> tuple[list[str], list[str]]:
    _check_new_refs([op.ref], batch)
    actions = [_resolve_action(tree, ref, batch).id for ref in op.actions]
    item_id = f"h{tree.next_item}"
    tree.hypotheses[item_id] = Hypothesis(
        id=item_id, text=op.text, actions=actions, created_at_version=batch.version,
        evidence_for=[Evidence(text=t, version=batch.version) for t in op.evidence_for],
        evidence_against=[Evidence(text=t, version=batch.version) for t in op.evidence_against],
    )
    return _changed(batch, [_allocate(tree, batch, item_id, op.ref)])


def _add_question(tree: Tree, op: Any, batch: Batch) -> tuple[list[str], list[str]]:
    _check_new_refs([op.ref], batch)
    item_id = f"q{tree.next_item}"
    tree.questions[item_id] = Question(id=item_id, text=op.text, created_at_version=batch.version)
    return _changed(batch, [_allocate(tree, batch, item_id, op.ref)])


# -------------------------------------------------------------------------------------- system ops


def _attach_solution(tree: Tree, op: Any, batch: Batch) -> tuple[list[str], list[str]]:
    target = _resolve_node(tree, op.node, batch)
    if op.evaluation.status is not Status.PASSED:
        raise OpRejected(f"only a PASSED solution can be attached (got {op.evaluation.status}); use mark_too_hard")
    if not batch.solution_exists(op.solution_id):
        raise OpRejected(f"solution {op.solution_id} is not in the solution store")
    ref = SolutionRef(solution_id=op.solution_id, evaluation=op.evaluation)
    if isinstance(target, RootNode):
        target.solution = ref
        return _changed(batch)
    if target.status in (NodeStatus.SPLIT, NodeStatus.CLOSED):
        raise OpRejected(f"{target.id} is {target.status}; attach the solution to the action it implements")
    if target.solution is not None:
        old = target.solution
        if old.evaluation.speedup is not None and (op.evaluation.speedup is None
                                                   or op.evaluation.speedup <= old.evaluation.speedup):
            # Two cycles that worked on one node (a lease that expired under a slow one): the faster stays.
            raise OpRejected(f"{target.id} already holds solution {old.solution_id}, at least as fast "
                             f"({_fmt_speedup(old.evaluation.speedup)} vs {_fmt_speedup(op.evaluation.speedup)})")
        text = f"replaced solution {old.solution_id} ({_fmt_speedup(old.evaluation.speedup)} vs baseline)"
        target.notes.append(Note(kind=NoteKind.NOTE, text=text, version=batch.version))
    target.solution = ref
    if target.status is not NodeStatus.DONE:
        _touch(target, batch)
    target.status = NodeStatus.DONE
    # Whoever held the lease is finished with the node, even if it is not the one reporting.
    tree.leases.pop(target.id, None)
    measured = measured_over_parent(tree, target)
    text = f"predicted {target.expected_speedup:.2f}x over parent, measured {_fmt_speedup(measured)}"
    target.notes.append(Note(kind=NoteKind.MEASURED, text=text, version=batch.version))
    return _changed(batch)


def _record_outcome(tree: Tree, op: Any, batch: Batch) -> tuple[list[str], list[str]]:
    _resolve_action(tree, op.node, batch).outcome = op.outcome
    return _changed(batch)


def _set_best(tree: Tree, op: Any, batch: Batch) -> tuple[list[str], list[str]]:
    root = _own(tree, batch, "root")
    assert isinstance(root, RootNode)
    summary = root.summary  # the batch's own copy: the tree it was given keeps its summary
    if summary.solution_id not in (None, op.solution_id) and summary.text and not summary.text.startswith("(written for"):
        # The words describe the old best; keep them, marked, until the planner rewrites them.
        summary.text = f"(written for solution {summary.solution_id}) {summary.text}"
    summary.solution_id, summary.speedup = op.solution_id, op.speedup
    summary.time_ms, summary.baseline_ms = dict(op.time_ms), dict(op.baseline_ms)
    return _changed(batch)


def _insert_continuation(tree: Tree, op: Any, batch: Batch) -> tuple[list[str], list[str]]:
    parent = _resolve_node(tree, op.parent, batch)
    action = ActionFields(title=CONTINUATION_TITLE, description=CONTINUATION_DESCRIPTION, difficulty=2, score=0.5,
                          expected_speedup=1.05, rationale=op.reason)
    node_id = _add_node(tree, action, parent.id, batch)
    tree.nodes[node_id].author = "system"
    return _changed(batch, [node_id])


_HANDLERS: dict[str, Handler] = {
    "insert": _insert, "update": _update, "split": _split, "mark_too_hard": _mark_too_hard, "prune": _prune,
    "close": _close, "reprioritise": _reprioritise, "annotate": _annotate, "add_hypothesis": _add_hypothesis,
    "add_question": _add_question, "attach_solution": _attach_solution, "record_outcome": _record_outcome,
    "set_best": _set_best, "insert_continuation": _insert_continuation,
}


# ----------------------------------------------------------------------------------------- helpers


def _add_node(tree: Tree, action: ActionFields, parent: str, batch: Batch, split_from: str | None = None) -> str:
    node_id = f"n{tree.next_seq}"
    batch.owned.add(node_id)
    batch.new_nodes += 1
    tree.nodes[node_id] = ActionNode(
        **action.model_dump(include=set(ActionFields.model_fields)),
        id=node_id, parent=parent, seq=tree.next_seq, split_from=split_from, created_at_version=batch.version,
        changed_at_version=batch.version,
    )
    tree.next_seq += 1
    ref = getattr(action, "ref", None)
    if ref is not None:
        batch.refs[ref.lstrip("$")] = node_id
    return node_id


def _allocate(tree: Tree, batch: Batch, item_id: str, ref: str | None) -> str:
    tree.next_item += 1
    batch.owned.add(item_id)
    if ref is not None:
        batch.refs[ref.lstrip("$")] = item_id
    return item_id


def _check_new_refs(refs: Sequence[str | None], batch: Batch) -> None:
    names = [r.lstrip("$") for r in refs if r is not None]
    for name in names:
        if name in batch.refs or name in batch.dead_refs or names.count(name) > 1:
            raise OpRejected(f"placeholder ${name} is already used in this batch")


def _deref(ref: str, batch: Batch) -> str:
    if not ref.startswith("$"):
        return ref
    name = ref[1:]
    if name in batch.dead_refs:
        raise OpRejected(f"placeholder {ref} was not created: op {batch.dead_refs[name]} was rejected")
    if name not in batch.refs:
        raise OpRejected(f'unknown placeholder {ref}; define it with "ref" on an earlier op of this batch')
    return batch.refs[name]


def _own(tree: Tree, batch: Batch, key: str) -> Item | None:
    """The working tree's own copy of item `key` (copied on first use in this batch), or None."""
    if key == "root":
        if key not in batch.owned:
            tree.root = tree.root.model_copy(deep=True)
            batch.owned.add(key)
        return tree.root
    copy = key not in batch.owned
    batch.owned.add(key)
    if key in tree.nodes:
        if copy:
            tree.nodes[key] = tree.nodes[key].model_copy(deep=True)
        return tree.nodes[key]
    if key in tree.hypotheses:
        if copy:
            tree.hypotheses[key] = tree.hypotheses[key].model_copy(deep=True)
        return tree.hypotheses[key]
    if key in tree.questions:
        if copy:
            tree.questions[key] = tree.questions[key].model_copy(deep=True)
        return tree.questions[key]
    batch.owned.discard(key)
    return None


def _resolve_item(tree: Tree, ref: str, batch: Batch) -> Item:
    item = _own(tree, batch, _deref(ref, batch))
    if item is None:
        raise OpRejected(f"no node, hypothesis or question {ref} in the world model")
    return item


def _resolve_node(tree: Tree, ref: str, batch: Batch) -> ActionNode | RootNode:
    key = _deref(ref, batch)
    if tree.get(key) is None:
        raise OpRejected(f"no node {ref} in the tree")
    node = _own(tree, batch, key)
    assert isinstance(node, ActionNode | RootNode)
    return node


def _resolve_action(tree: Tree, ref: str, batch: Batch) -> ActionNode:
    node = _resolve_node(tree, ref, batch)
    if isinstance(node, RootNode):
        raise OpRejected("the root is the task itself; this op applies to action nodes only")
    return node


def bury_refs(raw: object, index: int, batch: Batch) -> None:
    """Remember the placeholders a rejected op would have defined, to explain later failures."""
    if isinstance(raw, BaseModel):
        raw = raw.model_dump()
    if not isinstance(raw, Mapping):
        return
    wanted = [raw.get("ref")] + [a.get("ref") for a in raw.get("alternatives") or [] if isinstance(a, Mapping)]
    for ref in wanted:
        if isinstance(ref, str) and ref.lstrip("$") not in batch.refs:
            batch.dead_refs.setdefault(ref.lstrip("$"), index)


def one_line(exc: ValidationError, op_names: set[str] | frozenset[str]) -> str:
    parts = []
    for err in exc.errors(include_url=False):
        loc = [str(x) for x in err["loc"]]
        # A tagged union puts the tag first in the location; the planner already knows which op it wrote.
        if loc and loc[0] in op_names:
            loc = loc[1:]
        text = f"{'.'.join(loc)}: {err['msg']}" if loc else err["msg"]
        value = err.get("input")
        if err["type"] != "missing" and isinstance(value, str | int | float | bool):
            text += f" (got {str(value)[:40]!r})" if isinstance(value, str) else f" (got {value!r})"
        parts.append(text)
    return "; ".join(parts).replace("\n", " ")


def _fmt_speedup(value: float | None) -> str:
    return f"{value:.2f}x" if value is not None else "unknown"
