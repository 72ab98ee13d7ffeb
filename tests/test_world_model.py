"""The world model's pure core: the tree, the edit-op language, selection, leases and views."""

from __future__ import annotations

from typing import Any

import pytest

from ksearch_ray.models import Status
from ksearch_ray.worldmodel.ops import ApplyReport, InsertOp, apply_ops
from ksearch_ray.worldmodel.render import (
    render_best,
    render_failures,
    render_frontier,
    render_path,
    render_tree,
)
from ksearch_ray.worldmodel.select import (
    LeaseError,
    expire_leases,
    frontier,
    lease,
    leases_of,
    release,
    renew,
    select_and_lease,
    select_frontier,
)
from ksearch_ray.worldmodel.tree import (
    ActionNode,
    EvalSummary,
    InvariantError,
    NodeStatus,
    NoteKind,
    SolutionRef,
    Tree,
    best_solution,
    check_invariants,
    invariant_problems,
    new_tree,
)

STORE = {"sol-a", "sol-b", "sol-c", "sol-seed"}


def exists(solution_id: str) -> bool:
    return solution_id in STORE


def action(title: str, **overrides: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {"title": title, "difficulty": 2, "score": 0.5, "expected_speedup": 1.2}
    return fields | overrides


def insert(parent: str, title: str, **overrides: Any) -> dict[str, Any]:
    return {"op": "insert", "parent": parent} | action(title, **overrides)


def attach(node: str, solution_id: str, speedup: float | None, latency_ms: float = 1.0) -> dict[str, Any]:
    evaluation = {"status": "PASSED", "speedup": speedup, "latency_ms": latency_ms, "log": "ok"}
    return {"op": "attach_solution", "node": node, "solution_id": solution_id, "evaluation": evaluation}


def apply(tree: Tree, *ops: Any) -> tuple[Tree, ApplyReport]:
    return apply_ops(tree, list(ops), solution_exists=exists)


def applied(tree: Tree, *ops: Any) -> Tree:
    """Apply ops that must all succeed."""
    out, report = apply(tree, *ops)
    assert not report.rejected, report.render()
    return out


@pytest.fixture
def tree() -> Tree:
    """root -> n1 (done, 1.2x) -> n3 ; root -> n2 (open)."""
    return applied(
        new_tree("trimul", "Triangle multiplicative update."),
        insert("root", "fuse gating", score=0.9),
        insert("root", "use fp16 accumulate", score=0.4),
        insert("n1", "tile the k loop", score=0.7),
        attach("n1", "sol-a", 1.2),
    )


# ------------------------------------------------------------------------------------- tree and JSON


def test_insert_allocates_sequential_ids_that_are_never_reused() -> None:
    t = applied(new_tree("t"), insert("root", "a"), insert("root", "b"))
    assert list(t.nodes) == ["n1", "n2"]
    t = applied(t, {"op": "prune", "node": "n2"}, insert("root", "c"))
    assert list(t.nodes) == ["n1", "n3"]


def test_round_trip_json_is_exact(tree: Tree) -> None:
    t = applied(
        tree,
        {"op": "update", "node": "n2", "rating": 7.5, "confidence": 0.25, "note": "suspicious of fp16 error"},
        {"op": "mark_too_hard", "node": "n2", "reason": "fails tolerance"},
        {"op": "split", "node": "n3", "alternatives": [action("x", expected_speedup=1.1 / 3), action("y")]},
    )
    t = lease(t, ["n4"], "cycle-1", now=12.5, ttl=30.0)
    text = t.model_dump_json()
    again = Tree.model_validate_json(text)
    assert again == t
    assert again.model_dump_json() == text
    assert again.nodes["n4"].expected_speedup == 1.1 / 3


def test_evaluation_log_keeps_only_its_tail() -> None:
    summary = EvalSummary(status=Status.PASSED, log="x" * 5000 + "THE ERROR")
    assert summary.log.endswith("THE ERROR")
    assert len(summary.log) <= 600


# ------------------------------------------------------------------------------------------- the ops


def test_apply_is_pure(tree: Tree) -> None:
    before = tree.model_dump_json()
    apply(
        tree,
        insert("n1", "new"),
        {"op": "update", "node": "n2", "score": 0.99},
        {"op": "mark_too_hard", "node": "n3", "reason": "no"},
        {"op": "prune", "node": "n2"},
    )
    assert tree.model_dump_json() == before


def test_rejected_op_does_not_stop_the_rest_of_the_batch(tree: Tree) -> None:
    t, report = apply(
        tree,
        insert("root", "first"),
        insert("root", "too hard to even say", difficulty=9),
        insert("root", "last"),
    )
    assert [r.ok for r in report.results] == [True, False, True]
    assert [n.title for n in t.nodes.values()][-2:] == ["first", "last"]
    assert report.results[1].reason == "difficulty: Input should be less than or equal to 5 (got 9)"


@pytest.mark.parametrize(
    ("op", "expected_in_reason"),
    [
        ({"op": "grow", "node": "n1"}, "grow"),
        ({"node": "n1", "score": 0.3}, "op"),
        (insert("root", "x", score=1.5), "score"),
        (insert("root", "x", expected_speedup=0), "expected_speedup"),
        (insert("root", "x", colour="blue"), "colour"),
        ({"op": "insert", "parent": "root", "difficulty": 2, "score": 0.5, "expected_speedup": 1.1}, "title"),
        ({"op": "update", "node": "n2", "id": "n9"}, "id"),
        ({"op": "update", "node": "n2", "parent": "n1"}, "parent"),
        ({"op": "update", "node": "n2", "status": "leased"}, "status"),
        ({"op": "split", "node": "n2", "alternatives": [action("only one")]}, "alternatives"),
        ("insert a node please", "dictionary"),
    ],
)
def test_malformed_op_is_rejected_with_a_one_line_reason(
    tree: Tree, op: Any, expected_in_reason: str
) -> None:
    t, report = apply(tree, op)
    (result,) = report.results
    assert not result.ok
    assert expected_in_reason in result.reason
    assert "\n" not in result.reason
    assert t == tree


@pytest.mark.parametrize(
    "op",
    [
        insert("n99", "orphan"),
        {"op": "update", "node": "n99", "score": 0.1},
        {"op": "mark_too_hard", "node": "n99", "reason": "r"},
        {"op": "prune", "node": "n99"},
        attach("n99", "sol-b", 1.1),
        {"op": "split", "node": "n99", "alternatives": [action("a"), action("b")]},
    ],
)
def test_op_naming_a_missing_node_is_rejected(tree: Tree, op: dict[str, Any]) -> None:
    _, report = apply(tree, op)
    assert report.results[0].reason == "no node n99 in the tree"


def test_models_and_dicts_can_be_mixed_in_one_batch(tree: Tree) -> None:
    op = InsertOp.model_validate(insert("root", "typed"))
    t = applied(tree, op, insert("root", "raw"))
    assert [n.title for n in t.nodes.values()][-2:] == ["typed", "raw"]


def test_update_changes_only_the_given_fields(tree: Tree) -> None:
    t = applied(tree, {"op": "update", "node": "n2", "score": 0.95, "note": "measured elsewhere: 1.4x"})
    old, new = tree.nodes["n2"], t.nodes["n2"]
    assert new.score == 0.95
    assert new.model_dump(exclude={"score", "notes", "changed_at_version"}) == old.model_dump(exclude={"score", "notes", "changed_at_version"})
    assert new.changed_at_version == t.version  # a planner batch written before this one may no longer edit it
    assert [n.text for n in new.notes] == ["measured elsewhere: 1.4x"]


def test_update_with_nothing_to_change_is_rejected(tree: Tree) -> None:
    _, report = apply(tree, {"op": "update", "node": "n2"})
    assert "nothing to update" in report.results[0].reason


def test_update_cannot_touch_the_root(tree: Tree) -> None:
    _, report = apply(tree, {"op": "update", "node": "root", "title": "another task"})
    assert "root" in report.results[0].reason


def test_too_hard_node_can_be_reopened_but_a_done_one_cannot(tree: Tree) -> None:
    t = applied(tree, {"op": "mark_too_hard", "node": "n2", "reason": "spills"})
    t = applied(t, {"op": "update", "node": "n2", "status": "open", "difficulty": 3})
    assert t.nodes["n2"].status is NodeStatus.OPEN
    assert "n2" in select_frontier(t, 10)
    _, report = apply(t, {"op": "update", "node": "n1", "status": "open"})
    assert "only a too_hard node can be reopened" in report.results[0].reason


def test_placeholder_refs_build_a_subtree_in_one_batch(tree: Tree) -> None:
    t, report = apply(
        tree,
        insert("n1", "persistent kernel", ref="p"),
        insert("$p", "split-k", ref="q"),
        insert("$q", "stream-k"),
        insert("$p", "warp specialize"),
        {"op": "update", "node": "$q", "rating": 8},
    )
    assert not report.rejected
    p, q = report.refs["p"], report.refs["q"]
    assert t.nodes[p].parent == "n1"
    assert t.nodes[q].parent == p
    assert [c.title for c in t.children(q)] == ["stream-k"]
    assert [c.title for c in t.children(p)] == ["split-k", "warp specialize"]
    assert t.nodes[q].rating == 8


def test_placeholder_of_a_rejected_insert_explains_the_later_failure(tree: Tree) -> None:
    t, report = apply(
        tree,
        insert("root", "bad", ref="a", difficulty=0),
        insert("$a", "child"),
        insert("$nope", "child"),
    )
    assert report.results[1].reason == "placeholder $a was not created: op 0 was rejected"
    assert "unknown placeholder $nope" in report.results[2].reason
    assert t == tree


def test_placeholder_cannot_be_defined_twice_in_a_batch(tree: Tree) -> None:
    t, report = apply(
        tree, insert("root", "one", ref="a"), insert("root", "two", ref="a"), insert("$a", "kid")
    )
    assert [r.ok for r in report.results] == [True, False, True]
    assert t.nodes[report.results[2].created[0]].parent == report.results[0].created[0]


def test_split_replaces_open_node_with_alternatives(tree: Tree) -> None:
    t, report = apply(
        tree,
        {
            "op": "split",
            "node": "n3",
            "reason": "too coarse",
            "alternatives": [action("tile k by 64", ref="k64"), action("tile k by 128")],
        },
        insert("$k64", "and unroll"),
    )
    assert not report.rejected
    created = report.results[0].created
    assert len(created) == 2
    assert t.nodes["n3"].status is NodeStatus.SPLIT
    assert all(t.nodes[i].parent == "n1" and t.nodes[i].split_from == "n3" for i in created)
    frontier_ids = select_frontier(t, 10)
    assert "n3" not in frontier_ids
    assert set(created) <= set(frontier_ids)
    assert "too coarse" in t.nodes["n3"].notes[-1].text


def test_split_refuses_a_leased_node_or_one_with_children(tree: Tree) -> None:
    leased = lease(tree, ["n3"], "cycle-1", now=0, ttl=60)
    alternatives = [action("a"), action("b")]
    _, report = apply(leased, {"op": "split", "node": "n3", "alternatives": alternatives})
    assert "only an open or too_hard node can be split" in report.results[0].reason
    with_child = applied(tree, insert("n2", "child of n2"))
    _, report = apply(with_child, {"op": "split", "node": "n2", "alternatives": alternatives})
    assert "has children" in report.results[0].reason


def test_mark_too_hard_records_the_reason_and_ends_the_lease(tree: Tree) -> None:
    leased = lease(tree, ["n3"], "cycle-1", now=0, ttl=60)
    t = applied(
        leased, {"op": "mark_too_hard", "node": "n3", "reason": "every attempt hit illegal memory access"}
    )
    node = t.nodes["n3"]
    assert node.status is NodeStatus.TOO_HARD
    assert "n3" not in t.leases
    assert (node.notes[-1].kind, node.notes[-1].text) == (
        NoteKind.TOO_HARD,
        "every attempt hit illegal memory access",
    )


def test_attach_solution_marks_done_and_records_predicted_vs_measured(tree: Tree) -> None:
    leased = lease(tree, ["n3"], "cycle-1", now=0, ttl=60)
    t = applied(leased, attach("n3", "sol-b", 1.8))
    node = t.nodes["n3"]
    assert node.status is NodeStatus.DONE
    assert node.solution is not None and node.solution.solution_id == "sol-b"
    assert "n3" not in t.leases
    # n1 measured 1.2x over the baseline, n3 1.8x: 1.5x over its parent, against 1.2x predicted.
    assert node.notes[-1].text == "predicted 1.20x over parent, measured 1.50x"


@pytest.mark.parametrize(
    ("op", "reason"),
    [
        (attach("n2", "sol-missing", 1.3), "not in the solution store"),
        (attach("n2", "sol-b", 1.3) | {"evaluation": {"status": "INCORRECT_NUMERICAL"}}, "only a PASSED"),
        (attach("n2", "sol-b", 1.3) | {"evaluation": {"status": "FINE"}}, "evaluation.status"),
    ],
)
def test_attach_solution_rejects_unknown_or_failing_solutions(
    tree: Tree, op: dict[str, Any], reason: str
) -> None:
    t, report = apply(tree, op)
    assert reason in report.results[0].reason
    assert t.nodes["n2"].status is NodeStatus.OPEN


def test_attaching_to_the_root_sets_the_seed() -> None:
    t = applied(
        new_tree("t"), attach("root", "sol-seed", 1.5), insert("root", "a"), attach("n1", "sol-a", 1.8)
    )
    assert t.root.solution is not None and t.root.solution.solution_id == "sol-seed"
    assert t.nodes["n1"].notes[-1].text == "predicted 1.20x over parent, measured 1.20x"


def test_without_a_seed_actions_under_the_root_are_measured_against_the_baseline(tree: Tree) -> None:
    assert tree.nodes["n1"].notes[-1].text == "predicted 1.20x over parent, measured 1.20x"


def test_prune_removes_an_open_subtree(tree: Tree) -> None:
    t = applied(tree, insert("n2", "kid", ref="k"), insert("$k", "grandkid"))
    t, report = apply(t, {"op": "prune", "node": "n2"})
    assert report.results[0].removed == ["n2", "n4", "n5"]
    assert set(t.nodes) == {"n1", "n3"}


@pytest.mark.parametrize(
    ("target", "prepare", "reason"),
    [
        ("root", [], "root"),
        ("n1", [], "a solution (n1)"),
        ("n2", [{"op": "mark_too_hard", "node": "n2", "reason": "r"}], "failure evidence (n2)"),
    ],
)
def test_prune_refuses_root_solutions_and_evidence(
    tree: Tree, target: str, prepare: list[Any], reason: str
) -> None:
    t = applied(tree, *prepare)
    after, report = apply(t, {"op": "prune", "node": target})
    assert reason in report.results[0].reason
    assert after == t


def test_prune_refuses_a_leased_subtree(tree: Tree) -> None:
    t = lease(tree, ["n3"], "cycle-1", now=0, ttl=60)
    _, report = apply(t, {"op": "prune", "node": "n1"})
    assert "a solution (n1)" in report.results[0].reason
    _, report = apply(applied(t, insert("n3", "below a leased node")), {"op": "prune", "node": "n3"})
    assert "running work (n3)" in report.results[0].reason


def test_version_increments_once_per_batch_that_changed_something(tree: Tree) -> None:
    t, report = apply(
        tree, insert("root", "a"), insert("root", "b"), {"op": "update", "node": "n2", "score": 0.1}
    )
    assert t.version == tree.version + 1 and report.changed
    assert all(t.nodes[i].created_at_version == t.version for i in ("n4", "n5"))
    t2, report = apply(t, {"op": "grow"}, insert("n99", "x"))
    assert t2.version == t.version and not report.changed


def test_invariants_catch_broken_trees(tree: Tree) -> None:
    broken = tree.model_copy(deep=True)
    broken.nodes["n2"].parent = "n3"
    broken.nodes["n1"].parent = "n2"
    broken.nodes["n3"].status = NodeStatus.LEASED
    broken.nodes["n1"].solution = None
    problems = " | ".join(invariant_problems(broken, exists))
    assert "cycle" in problems
    assert "n3: status leased disagrees with the lease table" in problems
    assert "n1: status done but solution is missing" in problems
    # A batch checks what it touched (its cost must not grow with the tree): here n1.
    with pytest.raises(InvariantError):
        apply(broken, {"op": "update", "node": "n1", "note": "x"})


def test_invariants_check_solution_ids_against_the_store(tree: Tree) -> None:
    check_invariants(tree, exists)
    with pytest.raises(InvariantError, match="sol-a is not in the store"):
        check_invariants(tree, lambda solution_id: False)


def test_seed_solution_must_pass() -> None:
    seed = SolutionRef(solution_id="sol-seed", evaluation=EvalSummary(status=Status.TIMEOUT))
    with pytest.raises(InvariantError, match="did not pass"):
        check_invariants(new_tree("t", seed=seed))


# ------------------------------------------------------------------------------------------ selection


def test_frontier_is_open_actions_under_the_root_or_under_solved_nodes(tree: Tree) -> None:
    t = applied(tree, insert("n2", "under an unsolved node"), insert("n3", "under another unsolved node"))
    assert [n.id for n in frontier(t)] == ["n3", "n2"]


def test_selection_ranks_by_score_then_difficulty_then_rating_then_age() -> None:
    t = applied(
        new_tree("t"),
        insert("root", "low score", score=0.2, difficulty=1),
        insert("root", "hard", score=0.8, difficulty=3),
        insert("root", "unrated", score=0.8, difficulty=2),
        insert("root", "rated 5", score=0.8, difficulty=2, rating=5),
        insert("root", "rated 9", score=0.8, difficulty=2, rating=9),
        insert("root", "rated 9 again", score=0.8, difficulty=2, rating=9),
        insert("root", "best", score=0.95, difficulty=4),
    )
    assert select_frontier(t, 10) == ["n7", "n5", "n6", "n4", "n3", "n2", "n1"]
    assert select_frontier(t, 2) == ["n7", "n5"]
    assert select_frontier(t, 0) == []


def test_difficulty_gate_holds_hard_actions_back_until_a_good_speedup_or_nothing_else_is_open() -> None:
    t = applied(new_tree("t"), insert("root", "easy"), insert("root", "moonshot", difficulty=5, score=0.99))
    assert select_frontier(t, 5) == ["n1"]  # the gate holds n2 back while n1 can run
    modest = applied(t, attach("n1", "sol-a", 1.4), insert("n1", "small step"))
    assert select_frontier(modest, 5) == ["n3"]
    good = applied(t, attach("n1", "sol-a", 1.5), insert("n1", "small step"))
    assert select_frontier(good, 5) == ["n2", "n3"]  # relaxed: ranked by score
    assert select_frontier(good, 5, relax_when_speedup_at_least=None) == ["n3"]
    # Every open action above the limit: the best of them runs anyway (the reference's fallback).
    only_hard = applied(t, attach("n1", "sol-a", 1.4))
    assert select_frontier(only_hard, 5) == ["n2"]
    assert select_frontier(t, 5, max_difficulty=5) == ["n2", "n1"]


def test_selection_never_returns_a_leased_node(tree: Tree) -> None:
    best = select_frontier(tree, 1)
    t = lease(tree, best, "cycle-1", now=0, ttl=60)
    assert best[0] not in select_frontier(t, 10)
    assert best[0] not in [n.id for n in frontier(t)]


def test_concurrent_cycles_get_disjoint_nodes_one_at_a_time() -> None:
    t = applied(new_tree("t"), *[insert("root", f"idea {i}", score=i / 20) for i in range(12)])
    handed_out: list[str] = []
    for cycle in range(15):
        t, ids = select_and_lease(t, 1, f"cycle-{cycle}", now=float(cycle), ttl=100.0)
        handed_out += ids
    assert len(handed_out) == 12 == len(set(handed_out))
    assert select_frontier(t, 5) == []


def test_concurrent_cycles_get_disjoint_nodes_k_at_a_time() -> None:
    width = 4
    t = applied(new_tree("t"), *[insert("root", f"idea {i}") for i in range(10)])
    batches = []
    for cycle in range(3):
        t, ids = select_and_lease(t, width, f"cycle-{cycle}", now=0.0, ttl=100.0)
        batches.append(ids)
    flat = [i for ids in batches for i in ids]
    assert [len(ids) for ids in batches] == [4, 4, 2]
    assert len(flat) == len(set(flat)) == 10


def test_lease_refuses_a_node_already_leased_or_off_the_frontier(tree: Tree) -> None:
    t = lease(tree, ["n3"], "cycle-1", now=0, ttl=60)
    with pytest.raises(LeaseError, match="already leased to cycle-1"):
        lease(t, ["n3"], "cycle-2", now=1, ttl=60)
    with pytest.raises(LeaseError, match="not on the frontier"):
        lease(t, ["n1"], "cycle-2", now=1, ttl=60)
    with pytest.raises(LeaseError, match="repeat"):
        lease(tree, ["n2", "n2"], "cycle-2", now=1, ttl=60)


def test_lease_is_pure_and_bumps_the_version(tree: Tree) -> None:
    before = tree.model_dump_json()
    t = lease(tree, ["n2"], "cycle-1", now=0, ttl=60)
    assert tree.model_dump_json() == before
    assert t.version == tree.version + 1
    assert t.leases["n2"].expires_at == 60


def test_expired_lease_returns_node_to_frontier(tree: Tree) -> None:
    t = lease(tree, ["n3"], "cycle-1", now=100.0, ttl=30.0)
    t = lease(t, ["n2"], "cycle-2", now=110.0, ttl=30.0)
    still, expired = expire_leases(t, now=129.0)
    assert expired == [] and still == t
    t, expired = expire_leases(t, now=130.0)
    assert expired == ["n3"]
    assert t.nodes["n3"].status is NodeStatus.OPEN
    assert select_frontier(t, 10) == ["n3"]
    assert leases_of(t, "cycle-2") == ["n2"]


def test_renewed_lease_outlives_its_first_deadline(tree: Tree) -> None:
    t = lease(tree, ["n3"], "cycle-1", now=0.0, ttl=30.0)
    t = renew(t, ["n3"], "cycle-1", now=25.0, ttl=30.0)
    t, expired = expire_leases(t, now=40.0)
    assert expired == []
    with pytest.raises(LeaseError, match="leased to cycle-1, not cycle-2"):
        renew(t, ["n3"], "cycle-2", now=41.0, ttl=30.0)


def test_release_returns_the_node_but_only_for_its_holder(tree: Tree) -> None:
    t = lease(tree, ["n2", "n3"], "cycle-1", now=0, ttl=60)
    with pytest.raises(LeaseError, match="leased to cycle-1, not cycle-2"):
        release(t, ["n3"], "cycle-2")
    t = release(t, ["n3"], "cycle-1")
    assert t.nodes["n3"].status is NodeStatus.OPEN
    assert select_frontier(t, 10) == ["n3"]
    with pytest.raises(LeaseError, match="not leased"):
        release(t, ["n3"], "cycle-1")


def test_a_lease_reissued_after_expiry_is_not_released_by_the_dead_cycle(tree: Tree) -> None:
    t = lease(tree, ["n3"], "cycle-1", now=0, ttl=10)
    t, _ = expire_leases(t, now=10)
    t = lease(t, ["n3"], "cycle-2", now=11, ttl=10)
    with pytest.raises(LeaseError):
        release(t, ["n3"], "cycle-1")
    assert t.leases["n3"].holder == "cycle-2"


# ------------------------------------------------------------------------------------ queries and views


def test_best_solution_is_the_highest_speedup_among_done_nodes(tree: Tree) -> None:
    assert best_solution(new_tree("t")) is None
    t = applied(tree, attach("n3", "sol-b", 1.1), attach("n2", "sol-c", 1.7))
    best = best_solution(t)
    assert isinstance(best, ActionNode) and best.id == "n2"


def test_render_path_runs_from_root_to_node_with_speedups(tree: Tree) -> None:
    t = applied(tree, attach("n3", "sol-b", 1.8))
    lines = render_path(t, "n3").splitlines()
    assert len(lines) == 3
    assert lines[0].startswith("root: trimul")
    assert "n1" in lines[1] and "fuse gating" in lines[1] and "1.20x vs baseline" in lines[1]
    assert "n3" in lines[2] and "tile the k loop" in lines[2] and "1.50x over parent" in lines[2]


def test_render_frontier_lists_selection_order_gates_and_running_work(tree: Tree) -> None:
    t = applied(tree, insert("root", "moonshot", difficulty=5, score=0.1))
    t = lease(t, ["n2"], "cycle-7", now=0, ttl=60)
    text = render_frontier(t)
    assert text.index("n3") < text.index("n4")
    assert "waits: difficulty 5 > 4" in text
    assert "In progress:" in text and "cycle-7" in text.split("In progress:")[1]


def test_render_best_orders_solutions_by_speedup(tree: Tree) -> None:
    assert render_best(new_tree("t")) == "(no passing solutions yet)"
    t = applied(tree, attach("n3", "sol-b", 1.9), attach("n2", "sol-c", 1.5))
    lines = render_best(t, 2).splitlines()
    assert [line.split()[1] for line in lines] == ["n3", "n2"]
    assert "1.90x vs baseline" in lines[0] and "sol-b" in lines[0]


def test_render_failures_shows_reasons(tree: Tree) -> None:
    assert render_failures(tree) == "(no failed actions)"
    t = applied(tree, {"op": "mark_too_hard", "node": "n2", "reason": "fp16 accumulation breaks tolerance"})
    text = render_failures(t)
    assert text.startswith("n2 [too_hard] use fp16 accumulate") and "fp16 accumulation breaks tolerance" in text


def test_render_tree_indents_children_under_parents(tree: Tree) -> None:
    lines = [line for line in render_tree(tree).splitlines() if not line.strip().startswith(("note:", "observed:", "failures:"))]
    assert [line.split()[0] for line in lines] == ["root:", "n1", "n3", "n2"]
    indents = [len(line) - len(line.lstrip()) for line in lines]
    assert indents == [0, 2, 4, 2]


def test_a_replaced_solution_leaves_one_measured_note_in_the_rendered_tree(tree: Tree) -> None:
    from ksearch_ray.worldmodel.render import render_tree

    t = applied(lease(tree, ["n3"], "cycle-1", now=0, ttl=60), attach("n3", "sol-b", 1.8))
    t = applied(t, attach("n3", "sol-c", 2.4))  # a faster solution for the same action replaces it
    assert [n.kind for n in t.nodes["n3"].notes].count(NoteKind.MEASURED) == 2  # the record keeps both
    text = render_tree(t)
    assert text.count("measured 2.00x") == 1 and "measured 1.50x" not in text, text


def test_a_failure_digest_names_each_status_once() -> None:
    from ksearch_ray.methods.evidence import failure_digest
    from ksearch_ray.policies.contract import AttemptEvidence

    evidence = [AttemptEvidence(round=3, kind="implement", status="COMPILE_ERROR", change="tiles",
                                error="COMPILE_ERROR: ptxas error: too many resources\nline 2",
                                speedup=None, over_parent=None)]
    assert failure_digest(evidence) == "round 3 COMPILE_ERROR: ptxas error: too many resources"
