"""The edit-op language: the only way the world model changes.

A planner (an LLM, or the offline policy) replies with a list of ops as JSON objects, each tagged
by "op". `apply_ops` validates and applies them in order. A malformed op, or one that names a node
that does not exist or is in the wrong state, is rejected with a one-line reason the planner can
read on its next call; the rest of the batch still applies, because one typo should not throw away
a whole reply.

Planner ops, by what they do:

* add: `insert` (an action), `add_hypothesis`, `add_question`;
* update: `update` (an action's fields, or the root's kernel summary), `reprioritise` (the scores
  of several open actions at once, with the reason);
* annotate: `annotate` (a note on an action or the root; evidence for or against a hypothesis; a
  partial answer to a question);
* close: `close` (withdraw an open action as not worth trying; settle a hypothesis as supported,
  refuted or closed; answer a question), `mark_too_hard`, `prune` (delete untried ideas);
* split: `split` (an open or too-hard action into finer alternatives).

System ops (the driver's; rejected when a planner sends them): `attach_solution`,
`record_outcome` (what the cycles on an action observed), `set_best` (the measured part of the
root's kernel summary), `insert_continuation` (an action the driver adds itself when the planner
gave none it could use).

Placeholders let one reply build a subtree: an insert, a split alternative, a hypothesis or a
question may carry `"ref": "a"`, and any later op of the same batch may name it as `"$a"`.

Split, by choice: an open node is retired with status `split` (kept, not pruned, so the tree still
says that the planner found it too coarse) and its alternatives are inserted as its siblings, each
with `split_from` pointing back at it. A too-hard node keeps its status (it is failure evidence) and
gains the alternatives the same way: the planner's smaller steps towards the same goal.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from ksearch_ray.worldmodel.handlers import (
    SYSTEM_OPS,
    Batch,
    OpRejected,
    bury_refs,
    handler_for,
    one_line,
    working_copy,
)
from ksearch_ray.worldmodel.tree import (
    ActionFields,
    Difficulty,
    EvalSummary,
    Outcome,
    Rating,
    Speedup,
    Tree,
    Unit,
    check_invariants,
)

NodeRef = Annotated[
    str, Field(min_length=1, description="A node id ('n7'), 'root', or a placeholder ('$a').")
]
ItemRef = Annotated[
    str, Field(min_length=1, description="A node ('n7', 'root'), hypothesis ('h2') or question ('q1') id, or '$a'.")
]
RefName = Annotated[
    str, Field(pattern=r"^\$?[A-Za-z0-9_-]{1,32}$", description="Placeholder name, e.g. 'a'.")
]


class _Op(BaseModel):
    model_config = ConfigDict(extra="forbid")


class NewAction(ActionFields):
    """An action to create; `ref` names it for later ops of the same batch."""

    ref: RefName | None = None


class InsertOp(NewAction):
    """Add an open action under `parent`."""

    op: Literal["insert"]
    parent: NodeRef


class UpdateOp(_Op):
    """Change some of a node's planner-written fields; omitted fields keep their value.

    On an action, `status` may only be "open", to reopen a too_hard node with new insight; everything
    else about status goes through the other ops, and id and parent never change. On the root, only
    `summary` (the kernel summary's text) and `note` apply.
    """

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
    summary: str | None = Field(default=None, min_length=1, description="Root only: what the best kernel does.")
    note: str | None = Field(default=None, min_length=1, description="Evidence to append to the node's notes.")


class SplitOp(_Op):
    """Replace an open action by finer alternatives, or add smaller steps beside a too-hard one."""

    op: Literal["split"]
    node: NodeRef
    alternatives: list[NewAction] = Field(min_length=1)
    reason: str = ""


class MarkTooHardOp(_Op):
    """Record that an action could not be implemented, and why (again on a too-hard node: adds the reason)."""

    op: Literal["mark_too_hard"]
    node: NodeRef
    reason: str = Field(min_length=1)


class PruneOp(_Op):
    """Remove a subtree of untried ideas; solutions, running work and failure evidence are never pruned."""

    op: Literal["prune"]
    node: NodeRef


class CloseOp(_Op):
    """Close an open action (not worth trying), a hypothesis (with a verdict) or a question (with its answer)."""

    op: Literal["close"]
    target: ItemRef
    reason: str = Field(default="", description="Why; for a question, its answer.")
    verdict: Literal["supported", "refuted", "closed"] | None = Field(
        default=None, description="Hypotheses only; default 'closed'."
    )


class ReprioritiseOp(_Op):
    """New scores for several open actions at once."""

    op: Literal["reprioritise"]
    scores: dict[str, Unit] = Field(min_length=1, description="Node id -> new score (0..1).")
    reason: str = Field(min_length=1)


class AnnotateOp(_Op):
    """A note on an action or the root, evidence on a hypothesis (`stance` for/against), or a partial answer."""

    op: Literal["annotate"]
    target: ItemRef
    text: str = Field(min_length=1)
    stance: Literal["for", "against"] | None = None


class AddHypothesisOp(_Op):
    """A belief about what limits the kernel, to be tested."""

    op: Literal["add_hypothesis"]
    text: str = Field(min_length=1)
    ref: RefName | None = None
    actions: list[str] = Field(default_factory=list, description="Actions that test or exploit it.")
    evidence_for: list[str] = Field(default_factory=list)
    evidence_against: list[str] = Field(default_factory=list)


class AddQuestionOp(_Op):
    """Something to find out before committing to a direction."""

    op: Literal["add_question"]
    text: str = Field(min_length=1)
    ref: RefName | None = None


class AttachSolutionOp(_Op):
    """System: attach a passing solution to an action (which becomes done) or, as the seed, to the root."""

    op: Literal["attach_solution"]
    node: NodeRef
    solution_id: str = Field(min_length=1)
    evaluation: EvalSummary


class RecordOutcomeOp(_Op):
    """System: what the cycles on an action observed, replacing the previous record."""

    op: Literal["record_outcome"]
    node: NodeRef
    outcome: Outcome


class SetBestOp(_Op):
    """System: the measured part of the kernel summary, when the run's best changes."""

    op: Literal["set_best"]
    solution_id: str = Field(min_length=1)
    speedup: Speedup | None = None
    time_ms: dict[str, float] = Field(default_factory=dict)
    baseline_ms: dict[str, float] = Field(default_factory=dict)


class InsertContinuationOp(_Op):
    """System: an action of the driver's own under `parent` (the best node): improve that solution."""

    op: Literal["insert_continuation"]
    parent: NodeRef
    reason: str = Field(min_length=1)


EditOp = Annotated[
    InsertOp | UpdateOp | SplitOp | MarkTooHardOp | PruneOp | CloseOp | ReprioritiseOp | AnnotateOp
    | AddHypothesisOp | AddQuestionOp | AttachSolutionOp | RecordOutcomeOp | SetBestOp | InsertContinuationOp,
    Field(discriminator="op"),
]
_EDIT_OP: TypeAdapter[EditOp] = TypeAdapter(EditOp)
OP_NAMES = frozenset({
    "insert", "update", "split", "mark_too_hard", "prune", "close", "reprioritise", "annotate", "add_hypothesis",
    "add_question", *SYSTEM_OPS,
})
PLANNER_OPS = OP_NAMES - SYSTEM_OPS


class OpResult(BaseModel):
    """The fate of one op of a batch."""

    index: int = Field(description="Position of the op in the batch, from 0.")
    op: str = Field(description="The op's tag, or '?' when it had none.")
    ok: bool
    created: list[str] = Field(default_factory=list, description="Ids of the nodes, hypotheses or questions created.")
    removed: list[str] = Field(default_factory=list, description="Ids of the nodes the op pruned.")
    reason: str = Field(default="", description="One line saying why the op was rejected.")
    notes: list[str] = Field(default_factory=list, description="What else the planner should know: defaults filled "
                             "in, entries skipped.")


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
            lines.append(f"op {r.index} {r.op}: ok" + (f" ({detail})" if detail else "")
                         + "".join(f"; {note}" for note in r.notes))
        return "\n".join(lines)

    def problems(self) -> list[str]:
        """One line per op that was rejected or only partly applied: what the planner is told next time."""
        out = [f"{r.op} (op {r.index}): REJECTED: {r.reason}" for r in self.results if not r.ok]
        out += [f"{r.op} (op {r.index}): {note}" for r in self.results if r.ok for note in r.notes
                if note.startswith("not ")]
        return out


def apply_ops(
    tree: Tree,
    ops: Sequence[EditOp | Mapping[str, Any]],
    *,
    solution_exists: Callable[[str], bool],
    system: bool = True,
    base_version: int | None = None,
    max_new: int | None = None,
) -> tuple[Tree, ApplyReport]:
    """Apply `ops` in order to a copy of `tree`; return the new tree and a per-op report.

    Ops may be models or raw dicts straight from an LLM's JSON; `system=False` (a planner's batch)
    rejects the system ops. `base_version`: the version the batch was written against; an op that
    would edit an item changed since (by another batch, a lease, a finished cycle) is rejected on its
    own. `max_new`: how many new actions the batch may add. The version goes up by one if any op
    changed the tree. A tree that breaks an invariant after the batch is a bug in a handler and
    raises InvariantError.
    """
    work = working_copy(tree)
    batch = Batch(version=tree.version + 1, solution_exists=solution_exists,
                  base=base_version if base_version is not None and base_version < tree.version else None,
                  max_new=max_new)
    results = []
    for index, raw in enumerate(ops):
        name = _op_name(raw)
        batch.notes = []
        try:
            if not system and name in SYSTEM_OPS:
                raise OpRejected(f"{name} is done by the system, not by the planner")
            op = raw if isinstance(raw, BaseModel) else _EDIT_OP.validate_python(raw)
            # Handlers check everything before they change anything, so a rejected op leaves no trace.
            created, removed = handler_for(op)(work, op, batch)
        except (ValidationError, OpRejected) as exc:
            bury_refs(raw, index, batch)
            reason = one_line(exc, OP_NAMES) if isinstance(exc, ValidationError) else str(exc)
            results.append(OpResult(index=index, op=name, ok=False, reason=reason))
            continue
        results.append(OpResult(index=index, op=name, ok=True, created=created, removed=removed, notes=batch.notes))
    if batch.changed:
        work.version = batch.version
    # Handlers keep the invariants by construction; a violation here is their bug, not the
    # planner's, and must stop the run loudly rather than be reported as a rejected op.
    # What the batch touched, and the leases it added, dropped or replaced: the rest of the tree is the input's
    # own objects, whose invariants held (checking every lease cost a pass over all of them per batch, half
    # of a batch's time at width 1,024).
    leases_changed = (tree.leases.keys() ^ work.leases.keys()) | {
        key for key, lease in work.leases.items() if tree.leases.get(key) is not lease}
    check_invariants(work, solution_exists, only=batch.owned | leases_changed)
    report = ApplyReport(results=results, refs=batch.refs, version_before=tree.version, version=work.version)
    return work, report


def _op_name(raw: object) -> str:
    tag = raw.get("op") if isinstance(raw, Mapping) else getattr(raw, "op", None)
    return tag if isinstance(tag, str) and tag in OP_NAMES else "?"
