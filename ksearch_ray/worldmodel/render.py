"""Short plain-text views of the world model, for prompts and `ksearch show`.

Prompts pay per token, so every view is one line per node, titles trimmed, and the evidence cut to
its first sentences; the full record is the tree's JSON.
"""

from __future__ import annotations

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
    measured_over_parent,
    path_to,
    solution_speedup,
)

TITLE_LIMIT = 80
NOTE_LIMIT = 160


def render_tree(tree: Tree) -> str:
    """The whole tree, children indented under their parent, in creation order."""
    lines = [_root_line(tree.root)]

    def walk(parent_id: str, depth: int) -> None:
        for child in tree.children(parent_id):
            lines.append("  " * depth + _node_line(tree, child))
            walk(child.id, depth + 1)

    walk(ROOT_ID, 1)
    return "\n".join(lines)


def render_path(tree: Tree, node_id: str) -> str:
    """From the root down to `node_id`: the chain of changes the node's code builds on."""
    lines = []
    for depth, node in enumerate(path_to(tree, node_id)):
        line = _root_line(node) if isinstance(node, RootNode) else _node_line(tree, node)
        lines.append("  " * depth + line)
    return "\n".join(lines)


def render_frontier(
    tree: Tree,
    *,
    limit: int = 15,
    max_difficulty: int = DEFAULT_MAX_DIFFICULTY,
    relax_when_speedup_at_least: float | None = DEFAULT_RELAX_AT_SPEEDUP,
) -> str:
    """Open actions in selection order (gated ones marked), then the actions cycles are running now."""
    gate = difficulty_limit(
        tree, max_difficulty=max_difficulty, relax_when_speedup_at_least=relax_when_speedup_at_least
    )
    open_nodes = frontier(tree)
    lines = [f"Open frontier ({len(open_nodes)}, best first; difficulty <= {gate} may run now):"]
    for node in open_nodes[:limit]:
        gated = f" [waits: difficulty {node.difficulty} > {gate}]" if node.difficulty > gate else ""
        lines.append(f"  {_node_line(tree, node)} on {node.parent}{gated}")
    if len(open_nodes) > limit:
        lines.append(f"  ... and {len(open_nodes) - limit} more")
    if not open_nodes:
        lines.append("  (empty)")
    running = sorted(tree.leases.values(), key=lambda held: tree.nodes[held.node_id].seq)
    if running:
        lines.append("In progress:")
        lines += [f"  {held.node_id} {_title(tree.nodes[held.node_id])} ({held.holder})" for held in running]
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


def render_failures(tree: Tree) -> str:
    """Actions found too hard, with the evidence of why, so the planner does not propose them again."""
    lines = []
    for node in sorted(tree.nodes.values(), key=lambda node: node.seq):
        if node.status is not NodeStatus.TOO_HARD:
            continue
        evidence = [
            _trim(note.text, NOTE_LIMIT)
            for note in node.notes
            if note.kind in (NoteKind.TOO_HARD, NoteKind.NOTE)
        ]
        lines.append(
            f"{node.id} {_title(node)} (difficulty {node.difficulty}, expected {format_speedup(node.expected_speedup)}): "
            + ("; ".join(evidence) or "no reason recorded")
        )
    return "\n".join(lines) if lines else "(no failed actions)"


# ------------------------------------------------------------------------------------------ helpers


def _root_line(root: RootNode) -> str:
    if root.solution is None:
        return f"root: {_trim(root.title, TITLE_LIMIT)} (no seed; actions start from the baseline)"
    return f"root: {_trim(root.title, TITLE_LIMIT)} (seed {format_speedup(solution_speedup(root))} vs baseline)"


def _node_line(tree: Tree, node: ActionNode) -> str:
    facts = [f"d{node.difficulty}", f"score {node.score:.2f}"]
    if node.rating is not None:
        facts.append(f"rating {node.rating:g}")
    facts.append(f"expect {format_speedup(node.expected_speedup)}")
    line = f"{node.id} [{node.status}] {_title(node)} ({', '.join(facts)})"
    if node.solution is not None:
        line += f" -> got {format_speedup(measured_over_parent(tree, node))} over parent, {format_speedup(solution_speedup(node))} vs baseline"
    if node.split_from is not None:
        line += f" (alternative to {node.split_from})"
    if node.status is NodeStatus.LEASED:
        line += f" (leased to {tree.leases[node.id].holder})"
    if node.status in (NodeStatus.TOO_HARD, NodeStatus.SPLIT):
        reasons = [note.text for note in node.notes if note.kind in (NoteKind.TOO_HARD, NoteKind.SPLIT)]
        if reasons:
            line += f": {_trim(reasons[-1], NOTE_LIMIT)}"
    return line


def _title(node: ActionNode) -> str:
    return _trim(node.title, TITLE_LIMIT)


def _trim(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def format_speedup(speedup: float | None) -> str:
    """'1.35x'; tiny CPU-path values keep three significant digits ('0.00172x')."""
    if speedup is None:
        return "?x"
    # CPU-path speedups against a PyTorch baseline can be tiny (0.00172x): keep their digits.
    return f"{speedup:.2f}x" if speedup >= 0.1 else f"{speedup:.3g}x"
