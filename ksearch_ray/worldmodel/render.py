"""Plain-text views of the world model, for prompts and `ksearch show`.

`render_world_model` is what a planner reads: the kernel summary, the hypotheses and questions,
the action tree with each node's notes and observed outcome, the frontier and the failures. It
fits a character budget by giving up detail in steps (older notes, failure digests, then whole
subtrees far from the node in focus, each collapsed into one summary line), so a prompt stays the
same size however large the tree grows. The other functions are the short views it is built from.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from ksearch_ray.worldmodel.select import (
    DEFAULT_MAX_DIFFICULTY,
    DEFAULT_RELAX_AT_SPEEDUP,
    difficulty_limit,
    frontier,
)
from ksearch_ray.worldmodel.tree import (
    ROOT_ID,
    ActionNode,
    NodeStatus,
    NoteKind,
    RootNode,
    Tree,
    best_solution,
    measured_over_parent,
    path_to,
    solution_speedup,
)

TITLE_LIMIT = 80
NOTE_LIMIT = 160


def format_speedup(speedup: float | None) -> str:
    """'1.35x'; tiny CPU-path values keep three significant digits ('0.00172x')."""
    if speedup is None:
        return "?x"
    # CPU-path speedups against a PyTorch baseline can be tiny (0.00172x): keep their digits.
    return f"{speedup:.2f}x" if speedup >= 0.1 else f"{speedup:.3g}x"


@dataclass(frozen=True)
class Detail:
    """How much of each node a view shows; `render_world_model` lowers it step by step."""

    notes: int = 3  # most recent notes per node
    note_chars: int = NOTE_LIMIT
    failure_chars: int = 240
    frontier: int = 15
    collapse: bool = False  # fold subtrees away from the focus into one line each
    settled_items: bool = True  # show closed hypotheses and answered questions
    group_folded: bool = False  # all folded subtrees of one parent in a single line
    children: int | None = None  # children of the focus and the best node shown in full (the rest folded)
    too_hard: int | None = None  # the most recent too-hard and closed actions listed (the rest counted)
    hypotheses: int | None = None
    questions: int | None = None
    summary_chars: int | None = None
    best: int = 5
    tree: str = "full"  # full: the tree (folded as above); path: the focus's and the best's paths; count: one line
    title_chars: int = TITLE_LIMIT


LEVELS = (
    Detail(),
    Detail(notes=1, note_chars=120, failure_chars=120),
    Detail(notes=1, note_chars=100, failure_chars=80, frontier=10, collapse=True),
    Detail(notes=0, note_chars=80, failure_chars=60, frontier=8, collapse=True, settled_items=False),
    Detail(notes=0, note_chars=80, failure_chars=0, frontier=8, collapse=True, settled_items=False, group_folded=True,
           children=12, too_hard=15, hypotheses=8, questions=5, summary_chars=1200),
    Detail(notes=0, note_chars=60, failure_chars=0, frontier=6, collapse=True, settled_items=False, group_folded=True,
           children=4, too_hard=8, hypotheses=4, questions=2, summary_chars=600, tree="path"),
    Detail(notes=0, note_chars=50, failure_chars=0, frontier=3, collapse=True, settled_items=False, group_folded=True,
           children=0, too_hard=4, hypotheses=2, questions=0, summary_chars=300, best=3, tree="count", title_chars=50),
)
"""From most to least detail. Every level shows the open frontier, the best so far and what was found
too hard: a view gives up detail (notes, digests, subtrees far from the focus, old failures), never those."""


def render_world_model(tree: Tree, *, focus: str | None = None, budget_chars: int | None = None,
                       max_difficulty: int = DEFAULT_MAX_DIFFICULTY,
                       relax_when_speedup_at_least: float | None = DEFAULT_RELAX_AT_SPEEDUP) -> str:
    """The planner's view, at the most detail that fits `budget_chars` (None: the most detail).

    Folded, never cut: the tersest level (about 2,000 characters whatever the tree's size) is returned
    even when it does not fit a smaller budget."""
    text = ""
    for level in LEVELS:
        text = _world_model(tree, focus, level, max_difficulty, relax_when_speedup_at_least)
        if budget_chars is None or len(text) <= budget_chars:
            return text
    return text


def _world_model(tree: Tree, focus: str | None, detail: Detail, max_difficulty: int, relax: float | None) -> str:
    sections = [
        ("Kernel summary", render_summary(tree, detail.summary_chars)),
        ("Hypotheses", render_hypotheses(tree, detail)),
        ("Questions", render_questions(tree, detail)),
        ("Action tree", render_tree(tree, detail=detail, focus=focus)),
        ("Open frontier", render_frontier(tree, limit=detail.frontier, max_difficulty=max_difficulty,
                                          relax_when_speedup_at_least=relax, title_chars=detail.title_chars)),
        ("Best so far", render_best(tree, detail.best)),
        ("Found too hard", render_failures(tree, detail)),
    ]
    return "\n\n".join(f"## {title}\n{body}" for title, body in sections)


# --------------------------------------------------------------------------------------- sections


def render_summary(tree: Tree, text_chars: int | None = None) -> str:
    summary = tree.root.summary
    lines = []
    if summary.solution_id is None:
        lines.append("No measured best solution yet.")
    else:
        lines.append(f"Best solution {summary.solution_id}: {format_speedup(summary.speedup)} over the baseline.")
    words = summary.text or "(no description yet: write one with an `update` of node root, field `summary`)"
    lines.append(_trim(words, text_chars) if text_chars else words)
    if summary.time_ms:
        parts = []
        for name, ms in summary.time_ms.items():
            base = summary.baseline_ms.get(name)
            parts.append(f"  {name}: {ms:.4g} ms" + (f" (baseline {base:.4g} ms, {base / ms:.2f}x)" if base and ms else ""))
        lines.append("Time per workload:\n" + "\n".join(parts))
    return "\n".join(lines)


class _Listed(Protocol):
    """A hypothesis or a question: an id like "h3" and a status."""

    @property
    def id(self) -> str: ...

    @property
    def status(self) -> str: ...


T = TypeVar("T", bound=_Listed)


def _recent(items: Iterable[T], limit: int | None, settled: bool, noun: str) -> tuple[list[str], list[T]]:
    """Items in id order, open ones only unless `settled`, the last `limit` of them; the lines to print
    first say how many older ones were left out."""
    shown = [x for x in sorted(items, key=lambda x: int(x.id[1:])) if x.status == "open" or settled]
    if limit is None or len(shown) <= limit:
        return [], shown
    return [f"({len(shown) - limit} older {noun} not shown)"], shown[len(shown) - limit:]


def render_hypotheses(tree: Tree, detail: Detail = LEVELS[0]) -> str:
    lines, shown = _recent(tree.hypotheses.values(), detail.hypotheses, detail.settled_items, "hypotheses")
    for h in shown:
        line = f"{h.id} [{h.status}] {_trim(h.text, 200)}"
        if h.actions:
            line += f" (actions: {', '.join(h.actions)})"
        lines.append(line)
        lines += [f"  for: {_trim(e.text, detail.note_chars)}" for e in h.evidence_for[-2:]]
        lines += [f"  against: {_trim(e.text, detail.note_chars)}" for e in h.evidence_against[-2:]]
    return "\n".join(lines) or "(none yet: add them with add_hypothesis)"


def render_questions(tree: Tree, detail: Detail = LEVELS[0]) -> str:
    lines, shown = _recent(tree.questions.values(), detail.questions, detail.settled_items, "questions")
    for q in shown:
        if q.status == "open":
            lines.append(f"{q.id} [open] {_trim(q.text, 200)}" + (f" (so far: {_trim(q.answer, 120)})" if q.answer else ""))
        elif detail.settled_items:
            lines.append(f"{q.id} [{q.status}] {_trim(q.text, 120)} -> {_trim(q.answer, detail.note_chars)}")
    return "\n".join(lines) or "(none)"


def render_tree(tree: Tree, *, detail: Detail = LEVELS[0], focus: str | None = None) -> str:
    """The tree, children indented under their parent, each node with its notes and outcome.

    With `detail.collapse`, a subtree that holds neither the focus, the best solution, running work nor
    a top frontier action is folded into one line that counts what it holds (with `group_folded`, all
    such subtrees of one parent into a single line); `children` bounds the children of the focus and
    of the best node shown in full. `tree="path"` shows only the paths to the focus and the best node;
    `tree="count"` a single line of counts.
    """
    if detail.tree == "count":
        return f"{_root_line(tree.root)}\n  {_counts(tree, list(tree.nodes))} (folded to fit the prompt)"
    kids = children_index(tree)
    keep = _kept(tree, focus, detail, kids) if detail.collapse else None
    if detail.tree == "path":
        keep = _paths(tree, focus)
    lines = [_root_line(tree.root)]

    def walk(parent_id: str, depth: int) -> None:
        folded: list[ActionNode] = []
        for child in kids.get(parent_id, []):
            if keep is not None and child.id not in keep:
                if detail.group_folded:
                    folded.append(child)
                else:
                    lines.append("  " * depth + _folded(tree, child, kids))
                continue
            lines.extend("  " * depth + line for line in _node_block(tree, child, detail))
            walk(child.id, depth + 1)
        if folded:
            ids = [i for child in folded for i in _subtree(child, kids)]
            lines.append("  " * depth + f"[folded: {len(folded)} more subtrees here, {_counts(tree, ids)}]")

    walk(ROOT_ID, 1)
    return "\n".join(lines)


def _subtree(node: ActionNode, kids: dict[str, list[ActionNode]]) -> list[str]:
    ids = [node.id]
    for current in ids:  # grows while walked: breadth first
        ids += [child.id for child in kids.get(current, [])]
    return ids


def _counts(tree: Tree, ids: list[str]) -> str:
    counts: dict[str, int] = {}
    for i in ids:
        status = tree.nodes[i].status.value
        counts[status] = counts.get(status, 0) + 1
    speedups = [s for i in ids if (s := solution_speedup(tree.nodes[i])) is not None]
    best = f", best {format_speedup(max(speedups))}" if speedups else ""
    what = ", ".join(f"{n} {status}" for status, n in sorted(counts.items())) or "none"
    return f"{len(ids)} actions: {what}{best}"


def _paths(tree: Tree, focus: str | None) -> set[str]:
    keep: set[str] = set()
    best = best_solution(tree)
    for anchor in (focus, best.id if best else None):
        if anchor and anchor in tree.nodes:
            keep.update(n.id for n in path_to(tree, anchor) if isinstance(n, ActionNode))
    return keep


def render_path(tree: Tree, node_id: str) -> str:
    """From the root down to `node_id`: the chain of changes the node's code builds on."""
    lines = []
    for depth, node in enumerate(path_to(tree, node_id)):
        line = _root_line(node) if isinstance(node, RootNode) else _node_line(tree, node)
        lines.append("  " * depth + line)
    return "\n".join(lines)


def render_node(tree: Tree, node_id: str) -> str:
    """One action in full: what it is, where it sits, what was observed, what was noted."""
    node = tree.get(node_id)
    if not isinstance(node, ActionNode):
        return _root_line(tree.root)
    lines = [
        f"{node.id}: {node.title}",
        node.description or "(no description)",
        f"Difficulty {node.difficulty}/5; score {node.score:.2f}; expected speedup over the parent "
        f"{format_speedup(node.expected_speedup)}. Rationale: {node.rationale or '(none)'}",
        "Path from the root:",
        render_path(tree, node_id),
    ]
    block = _node_block(tree, node, Detail(notes=5, note_chars=300, failure_chars=600))
    lines += [line.strip() for line in block[1:]]
    return "\n".join(lines)


def render_frontier(
    tree: Tree,
    *,
    limit: int = 15,
    max_difficulty: int = DEFAULT_MAX_DIFFICULTY,
    relax_when_speedup_at_least: float | None = DEFAULT_RELAX_AT_SPEEDUP,
    title_chars: int = TITLE_LIMIT,
) -> str:
    """Open actions in selection order (gated ones marked), then the actions cycles are running now."""
    gate = difficulty_limit(
        tree, max_difficulty=max_difficulty, relax_when_speedup_at_least=relax_when_speedup_at_least
    )
    open_nodes = frontier(tree)
    lines = [f"{len(open_nodes)} open, best first; difficulty <= {gate} runs first:"]
    for node in open_nodes[:limit]:
        gated = f" [waits: difficulty {node.difficulty} > {gate}]" if node.difficulty > gate else ""
        lines.append(f"  {_node_line(tree, node, title_chars)} on {node.parent}{gated}")
    if len(open_nodes) > limit:
        lines.append(f"  ... and {len(open_nodes) - limit} more")
    if not open_nodes:
        lines.append("  (empty)")
    running = sorted(tree.leases.values(), key=lambda held: tree.nodes[held.node_id].seq)
    if running:
        lines.append("In progress:")
        lines += [f"  {held.node_id} {_title(tree.nodes[held.node_id], title_chars)} ({held.holder})"
                  for held in running[:limit]]
        if len(running) > limit:
            lines.append(f"  ... and {len(running) - limit} more")
    return "\n".join(lines)


def render_best(tree: Tree, n: int = 5) -> str:
    """The `n` fastest solutions so far, fastest first."""
    solved = sorted(
        (node for node in tree.nodes.values() if solution_speedup(node) is not None),
        key=lambda node: (-(solution_speedup(node) or 0.0), node.seq),
    )
    lines = []
    for rank, node in enumerate(solved[:n], start=1):
        assert node.solution is not None  # filtered above; tells the type checker
        latency = node.solution.evaluation.latency_ms
        timing = f", {latency:.4g} ms" if latency is not None else ""
        lines.append(
            f"{rank}. {node.id} {format_speedup(solution_speedup(node))} vs baseline{timing}: {_title(node)} "
            f"[solution {node.solution.solution_id}]"
        )
    if tree.root.solution is not None:
        lines.append(
            f"seed: {format_speedup(solution_speedup(tree.root))} vs baseline [solution {tree.root.solution.solution_id}]"
        )
    return "\n".join(lines) if lines else "(no passing solutions yet)"


def render_failures(tree: Tree, detail: Detail = LEVELS[0]) -> str:
    """Actions found too hard or closed, with why, so the planner does not propose them again."""
    lines = []
    failed = [n for n in sorted(tree.nodes.values(), key=lambda node: node.seq)
              if n.status in (NodeStatus.TOO_HARD, NodeStatus.CLOSED)]
    if detail.too_hard is not None and len(failed) > detail.too_hard:
        older = failed[: len(failed) - detail.too_hard]
        failed = failed[len(failed) - detail.too_hard:]
        titles = "; ".join(_trim(n.title, 40) for n in older[-8:])
        lines.append(f"({len(older)} earlier ones not shown in full; the latest of them: {titles})")
    for node in failed:
        evidence = [
            _trim(note.text, detail.note_chars)
            for note in node.notes
            if note.kind in (NoteKind.TOO_HARD, NoteKind.NOTE, NoteKind.CLOSED)
        ][-2:]
        lines.append(
            f"{node.id} [{node.status}] {_title(node, detail.title_chars)} (difficulty {node.difficulty}): "
            + ("; ".join(evidence) or "no reason recorded")
        )
    return "\n".join(lines) if lines else "(no failed actions)"


# ------------------------------------------------------------------------------------------ helpers


def children_index(tree: Tree) -> dict[str, list[ActionNode]]:
    """Parent id -> its children in creation order, built once per view (a view walks every node)."""
    kids: dict[str, list[ActionNode]] = {}
    for node in sorted(tree.nodes.values(), key=lambda n: n.seq):
        kids.setdefault(node.parent, []).append(node)
    return kids


def _kept(tree: Tree, focus: str | None, detail: Detail, kids: dict[str, list[ActionNode]]) -> set[str]:
    """Nodes whose whole surroundings stay visible: the paths to what matters now, and their children."""
    anchors = [n.id for n in frontier(tree)[: detail.frontier]] + list(tree.leases)
    best = best_solution(tree)
    if best is not None:
        anchors.append(best.id)
    if focus and focus in tree.nodes:
        anchors.append(focus)
    keep: set[str] = set()
    for anchor in anchors:
        keep.update(n.id for n in path_to(tree, anchor) if isinstance(n, ActionNode))
    for around in (focus, best.id if best else None):
        if around and around in tree.nodes:
            children = kids.get(around, [])
            if detail.children is not None:  # the latest ones; the rest fold with the other subtrees
                children = children[len(children) - detail.children:] if detail.children else []
            keep.update(c.id for c in children)
    return keep


def _folded(tree: Tree, node: ActionNode, kids: dict[str, list[ActionNode]]) -> str:
    return f"{node.id} {_title(node)} [folded: {_counts(tree, _subtree(node, kids))}]"


def _node_block(tree: Tree, node: ActionNode, detail: Detail) -> list[str]:
    lines = [_node_line(tree, node)]
    if node.outcome is not None and node.outcome.attempts:
        o = node.outcome
        statuses = ", ".join(f"{n} {s}" for s, n in sorted(o.statuses.items()))
        line = f"    observed: {o.attempts} attempt(s): {statuses}"
        if o.best_speedup is not None:
            line += f"; best {format_speedup(o.best_speedup)} vs baseline, {format_speedup(o.over_parent)} over parent"
        if o.budget_cut:
            line += "; cut short by the budget (not judged)"
        lines.append(line)
        if o.failures and detail.failure_chars:
            lines.append(f"    failures: {_trim(o.failures, detail.failure_chars)}")
    if detail.notes:
        for note in _notes(node, detail.notes):
            lines.append(f"    note: {_trim(note, detail.note_chars)}")
    return lines


def _notes(node: ActionNode, n: int) -> list[str]:
    # The status lines already carry too-hard and split reasons; notes add the rest.
    skip = {NoteKind.TOO_HARD, NoteKind.SPLIT} if node.status in (NodeStatus.TOO_HARD, NodeStatus.SPLIT) else set()
    # A node whose solution was replaced holds one "predicted ..., measured ..." note per solution: the
    # last one is about the solution it holds, the others would repeat stale figures.
    last_measured = max((i for i, note in enumerate(node.notes) if note.kind is NoteKind.MEASURED), default=None)
    return [note.text for i, note in enumerate(node.notes)
            if note.kind not in skip and (note.kind is not NoteKind.MEASURED or i == last_measured)][-n:]


def _root_line(root: RootNode) -> str:
    if root.solution is None:
        return f"root: {_trim(root.title, TITLE_LIMIT)} (no seed; actions start from the baseline)"
    return f"root: {_trim(root.title, TITLE_LIMIT)} (seed {format_speedup(solution_speedup(root))} vs baseline)"


def _node_line(tree: Tree, node: ActionNode, title_chars: int = TITLE_LIMIT) -> str:
    facts = [f"d{node.difficulty}", f"score {node.score:.2f}"]
    if node.rating is not None:
        facts.append(f"rating {node.rating:g}")
    facts.append(f"expect {format_speedup(node.expected_speedup)}")
    line = f"{node.id} [{node.status}] {_title(node, title_chars)} ({', '.join(facts)})"
    if node.author != "planner":
        line += f" (added by the {node.author})"
    if node.solution is not None:
        line += f" -> got {format_speedup(measured_over_parent(tree, node))} over parent, {format_speedup(solution_speedup(node))} vs baseline"
    if node.split_from is not None:
        line += f" (alternative to {node.split_from})"
    if node.status is NodeStatus.LEASED:
        line += f" (leased to {tree.leases[node.id].holder})"
    if node.status in (NodeStatus.TOO_HARD, NodeStatus.SPLIT, NodeStatus.CLOSED):
        kinds = (NoteKind.TOO_HARD, NoteKind.SPLIT, NoteKind.CLOSED)
        reasons = [note.text for note in node.notes if note.kind in kinds]
        if reasons:
            line += f": {_trim(reasons[-1], NOTE_LIMIT)}"
    return line


def _title(node: ActionNode, limit: int = TITLE_LIMIT) -> str:
    return _trim(node.title, limit)


def _trim(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."

