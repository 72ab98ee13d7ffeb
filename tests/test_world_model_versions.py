"""Planner batches applied to a tree that moved on: versioned ops, partial rescoring, duplicates, caps,
defaults for what a planner left out, leases that ended under their cycle, and the faster solution kept."""

from __future__ import annotations

from typing import Any

from ksearch_ray.worldmodel.ops import apply_ops
from ksearch_ray.worldmodel.select import select_and_lease
from ksearch_ray.worldmodel.state import WorldModelState
from ksearch_ray.worldmodel.tree import NodeStatus, Tree, new_tree


def insert(parent: str, title: str, **fields: Any) -> dict[str, Any]:
    return {"op": "insert", "parent": parent, "title": title, "difficulty": 2, "score": 0.5,
            "expected_speedup": 1.2} | fields


def attach(node: str, solution_id: str, speedup: float) -> dict[str, Any]:
    return {"op": "attach_solution", "node": node, "solution_id": solution_id,
            "evaluation": {"status": "PASSED", "speedup": speedup}}


def apply(tree: Tree, ops: list[dict[str, Any]], **kwargs: Any):  # type: ignore[no-untyped-def]
    return apply_ops(tree, ops, solution_exists=lambda _id: True, **kwargs)


def three_actions() -> Tree:
    tree, report = apply(new_tree("t"), [insert("root", "a"), insert("root", "b"), insert("root", "c")])
    assert not report.rejected
    return tree


def test_an_op_on_a_node_leased_since_the_reply_was_written_is_rejected_alone() -> None:
    tree = three_actions()
    written_for = tree.version
    tree, _ = select_and_lease(tree, 1, "c1", 0.0, 60.0)  # n1 goes to a cycle meanwhile
    tree, report = apply(tree, [{"op": "update", "node": "n1", "score": 0.9},
                                {"op": "update", "node": "n2", "score": 0.8},
                                {"op": "annotate", "target": "n1", "text": "evidence is welcome on any version"}],
                         system=False, base_version=written_for)
    first, second, third = report.results
    assert not first.ok and "changed" in first.reason and "leased" in first.reason
    assert second.ok and third.ok
    assert tree.nodes["n2"].score == 0.8 and tree.nodes["n1"].score == 0.5


def test_without_edits_in_between_nothing_is_stale() -> None:
    tree = three_actions()
    _, report = apply(tree, [{"op": "update", "node": "n1", "score": 0.9}], system=False, base_version=tree.version)
    assert not report.rejected


def test_a_batch_may_edit_twice_what_it_changed_itself() -> None:
    tree = three_actions()
    base = tree.version
    tree, _ = apply(tree, [{"op": "annotate", "target": "root", "text": "another batch"}])  # the version moves on
    _, report = apply(tree, [{"op": "update", "node": "n2", "score": 0.9},
                             {"op": "reprioritise", "scores": {"n2": 0.7}, "reason": "second thoughts"}],
                      system=False, base_version=base)
    assert not report.rejected, report.render()


def test_reprioritise_skips_the_entries_it_cannot_apply_and_says_which() -> None:
    tree = three_actions()
    base = tree.version
    tree, _ = select_and_lease(tree, 1, "c1", 0.0, 60.0)  # n1
    tree, report = apply(tree, [{"op": "reprioritise", "scores": {"n1": 0.1, "n2": 0.9, "n9": 0.3},
                                 "reason": "measured"}], system=False, base_version=base)
    [result] = report.results
    assert result.ok and tree.nodes["n2"].score == 0.9 and tree.nodes["n1"].score == 0.5
    assert any("n1" in note for note in result.notes) and any("n9" in note for note in result.notes)
    assert report.problems() and all("not rescored" in line for line in report.problems())
    tree, report = apply(tree, [{"op": "reprioritise", "scores": {"n1": 0.2}, "reason": "x"}], system=False)
    assert not report.results[0].ok  # nothing left to rescore: the op itself is rejected


def test_the_same_action_twice_under_one_parent_is_rejected() -> None:
    tree = three_actions()
    tree, report = apply(tree, [insert("root", "A!"), insert("n1", "a"), insert("root", "d"), insert("root", "D")],
                         system=False)
    assert [r.ok for r in report.results] == [False, True, True, False]
    assert "n1" in report.results[0].reason


def test_a_batch_adds_at_most_max_new_actions() -> None:
    tree = three_actions()
    ops = [insert("root", f"idea {i}") for i in range(4)]
    ops.append({"op": "split", "node": "n3", "alternatives": [{"title": "c1"}, {"title": "c2"}]})
    tree, report = apply(tree, ops, system=False, max_new=3)
    assert [r.ok for r in report.results] == [True, True, True, False, False]
    assert "at most 3" in report.results[3].reason
    assert tree.nodes["n3"].status is NodeStatus.OPEN  # the rejected split changed nothing


def test_missing_estimates_get_defaults_and_the_report_says_so() -> None:
    tree, report = apply(new_tree("t"), [{"op": "insert", "parent": "root", "title": "guess"}], system=False)
    [result] = report.results
    assert result.ok and any("defaults used" in note and "expected_speedup" in note for note in result.notes)
    node = tree.nodes[result.created[0]]
    assert (node.difficulty, node.score, node.expected_speedup) == (3, 0.5, 1.1)


def test_a_slower_solution_never_replaces_a_faster_one() -> None:
    tree = three_actions()
    tree, _ = apply(tree, [attach("n1", "fast", 2.0)])
    tree, report = apply(tree, [attach("n1", "slow", 1.5)])
    assert not report.results[0].ok and "at least as fast" in report.results[0].reason
    assert tree.nodes["n1"].solution.solution_id == "fast"
    tree, report = apply(tree, [attach("n1", "faster", 2.5)])
    assert report.results[0].ok and tree.nodes["n1"].solution.solution_id == "faster"


def test_renewing_or_releasing_a_lease_that_expired_names_it_instead_of_failing() -> None:
    state = WorldModelState(three_actions(), lambda _id: True)
    assert state.select_and_lease(1, "c1", now=0.0, ttl=10.0, max_difficulty=4, relax_at=None) == ["n1"]
    assert state.renew(["n1"], "c1", now=5.0, ttl=10.0) == []
    assert state.expire(now=20.0) == ["n1"]
    state.select_and_lease(1, "c2", now=20.0, ttl=10.0, max_difficulty=4, relax_at=None)
    assert state.renew(["n1"], "c1", now=21.0, ttl=10.0) == ["n1"]
    assert state.release(["n1"], "c1") == ["n1"]
    assert state.tree.leases["n1"].holder == "c2"  # the second cycle keeps its node


# --- views of a large tree: folded, never cut -------------------------------------------------------


def wide_tree(n: int = 600) -> Tree:
    """`n` actions, most of them children of the root (as a long search leaves them): every third done,
    every fifth found too hard, one leased, the rest open; long titles and notes throughout."""
    from ksearch_ray.worldmodel.tree import Outcome

    ops: list[dict[str, Any]] = [insert("root" if i % 7 else f"n{max(i - 3, 1)}", f"idea {i} " + "w" * 50,
                                        rationale="r" * 80) for i in range(1, n + 1)]
    tree, report = apply(new_tree("t"), ops, system=True)
    assert not report.rejected, report.render()[:500]
    system: list[dict[str, Any]] = []
    for i in range(1, n + 1):
        node = f"n{i}"
        system.append({"op": "record_outcome", "node": node, "outcome": Outcome(
            attempts=3, statuses={"RUNTIME_ERROR": 2, "PASSED": 1}, failures="round 2 RUNTIME_ERROR: " + "e" * 200
        ).model_dump(mode="json")})
        if i % 3 == 0:
            system.append(attach(node, f"s{i}", 1.0 + i / 1000))
        elif i % 5 == 0:
            system.append({"op": "mark_too_hard", "node": node, "reason": f"failed {i}: " + "f" * 150})
    tree, report = apply(tree, system)
    tree, _ = select_and_lease(tree, 1, "c1", 0.0, 60.0)
    return tree


def test_a_600_node_view_keeps_the_frontier_the_best_and_the_failures_at_any_budget() -> None:
    from ksearch_ray.worldmodel.render import render_world_model
    from ksearch_ray.worldmodel.select import frontier
    from ksearch_ray.worldmodel.tree import best_solution

    tree = wide_tree()
    best = best_solution(tree)
    top = frontier(tree)[0]
    latest_too_hard = max((n for n in tree.nodes.values() if n.status is NodeStatus.TOO_HARD), key=lambda n: n.seq)
    for budget in (300_000, 30_000, 8_000, 3_000):
        text = render_world_model(tree, focus=best.id, budget_chars=budget)
        assert len(text) <= budget, (budget, len(text))
        frontier_part = text[text.index("## Open frontier"):text.index("## Best so far")]
        best_part = text[text.index("## Best so far"):text.index("## Found too hard")]
        failed_part = text[text.index("## Found too hard"):]
        assert f"{top.id} [open]" in frontier_part, budget
        assert f"1. {best.id} " in best_part, budget
        assert f"{latest_too_hard.id} [too_hard]" in failed_part, budget
        assert "cut to fit" not in text
