"""The world model's content (summary, hypotheses, questions, outcomes), the ops that edit it, the
lenient reading of planner replies, and prompt views that stay within their budget."""

from __future__ import annotations

import json
import time

import pytest

from ksearch_ray.policies.llm.parsing import read_plan
from ksearch_ray.policies.standin.player import Player
from ksearch_ray.worldmodel.ops import apply_ops
from ksearch_ray.worldmodel.render import render_world_model
from ksearch_ray.worldmodel.select import select_and_lease
from ksearch_ray.worldmodel.tree import NodeStatus, Outcome, Tree, new_tree


def applied(tree: Tree, *ops: dict, system: bool = True) -> Tree:
    out, report = apply_ops(tree, list(ops), solution_exists=lambda _id: True, system=system)
    assert not report.rejected, report.render()
    return out


def insert(parent: str, title: str, **fields) -> dict:
    return {"op": "insert", "parent": parent, "title": title, "difficulty": 2, "score": 0.5, "expected_speedup": 1.2} | fields


def test_hypotheses_and_questions_are_added_annotated_and_settled() -> None:
    t = applied(new_tree("t"), insert("root", "tile", ref="a"),
                {"op": "add_hypothesis", "text": "bound by loads of B", "actions": ["$a"], "ref": "h"},
                {"op": "add_question", "text": "does BLOCK_N=128 spill?", "ref": "q"},
                {"op": "annotate", "target": "$h", "stance": "for", "text": "n1 halved the load time"})
    h, q = t.hypotheses["h1"], t.questions["q2"]
    assert h.actions == ["n1"] and [e.text for e in h.evidence_for] == ["n1 halved the load time"]
    t = applied(t, {"op": "close", "target": "h1", "verdict": "refuted", "reason": "n3 changed nothing"},
                {"op": "close", "target": "q2", "reason": "no: 96 registers"})
    assert t.hypotheses["h1"].status == "refuted" and t.hypotheses["h1"].evidence_against[-1].text == "n3 changed nothing"
    assert t.questions["q2"].status == "answered" and t.questions["q2"].answer == "no: 96 registers"
    assert q.status == "open"  # the earlier tree is untouched


def test_the_root_summary_is_written_by_the_planner_and_measured_by_the_system() -> None:
    t = applied(new_tree("t"), {"op": "update", "node": "root", "summary": "one kernel per row; loads dominate"})
    t = applied(t, {"op": "set_best", "solution_id": "s1", "speedup": 1.4, "time_ms": {"w": 2.0}, "baseline_ms": {"w": 2.8}})
    text = render_world_model(t)
    assert "one kernel per row" in text and "w: 2 ms (baseline 2.8 ms, 1.40x)" in text
    _, report = apply_ops(t, [{"op": "update", "node": "root", "score": 0.3}], solution_exists=lambda _: True)
    assert "the root takes only summary and note" in report.results[0].reason


def test_system_ops_are_refused_from_the_planner() -> None:
    _, report = apply_ops(new_tree("t"), [{"op": "record_outcome", "node": "n1", "outcome": {}},
                                          {"op": "insert_continuation", "parent": "root", "reason": "x"}],
                          solution_exists=lambda _: True, system=False)
    assert all("is done by the system" in r.reason for r in report.results)


def test_close_reprioritise_and_split_of_a_too_hard_action() -> None:
    t = applied(new_tree("t"), insert("root", "a"), insert("root", "b"), insert("root", "c"))
    t = applied(t, {"op": "close", "target": "n1", "reason": "the data never fits"},
                {"op": "reprioritise", "scores": {"n2": 0.9, "n3": 0.1}, "reason": "n2 attacks the loads"})
    assert t.nodes["n1"].status is NodeStatus.CLOSED and (t.nodes["n2"].score, t.nodes["n3"].score) == (0.9, 0.1)
    t = applied(t, {"op": "mark_too_hard", "node": "n2", "reason": "system: no passing attempt"},
                {"op": "mark_too_hard", "node": "n2", "reason": "planner: the shared memory is too small"},
                {"op": "split", "node": "n2", "alternatives": [{"title": "half tiles", "difficulty": 1, "score": 0.5,
                                                                 "expected_speedup": 1.1}]})
    n2 = t.nodes["n2"]
    assert n2.status is NodeStatus.TOO_HARD and len([n for n in n2.notes if n.kind == "too_hard"]) == 2
    assert t.nodes["n4"].split_from == "n2" and t.nodes["n4"].status is NodeStatus.OPEN


def test_outcomes_are_recorded_and_shown_to_the_planner() -> None:
    t = applied(new_tree("t"), insert("root", "a"))
    outcome = Outcome(attempts=3, statuses={"COMPILE_ERROR": 2, "PASSED": 1}, best_speedup=1.3, over_parent=1.1,
                      failures="round 2 COMPILE_ERROR: error: identifier 'acc' is undefined")
    t = applied(t, {"op": "record_outcome", "node": "n1", "outcome": outcome.model_dump(mode="json")})
    text = render_world_model(t)
    assert "observed: 3 attempt(s): 2 COMPILE_ERROR, 1 PASSED; best 1.30x vs baseline, 1.10x over parent" in text
    assert "identifier 'acc' is undefined" in text


def test_a_batch_leaves_its_input_tree_untouched() -> None:
    t = applied(new_tree("t"), insert("root", "a"), {"op": "add_hypothesis", "text": "h"})
    before = t.model_dump_json()
    applied(t, {"op": "update", "node": "n1", "score": 0.9, "note": "x"}, {"op": "annotate", "target": "h1",
                                                                            "stance": "against", "text": "y"})
    assert t.model_dump_json() == before


# --- replies that drift from the format -------------------------------------------------------------


@pytest.mark.parametrize(("reply", "expected_ops", "note"), [
    ('```json\n{"ops": [{"op": "update", "node_id": "n1", "score": "0.7"}], "actions": [{"title": "tile", "difficulty": "2", "score": 0.6, "expected_speedup": "1.3x"}]}\n```',
     [{"op": "update", "node": "n1", "score": 0.7},
      {"title": "tile", "difficulty": 2, "score": 0.6, "expected_speedup": 1.3, "op": "insert", "parent": "n4"}],
     "read the lists ops, actions as one list of ops"),
    ('[{"type": "add_action", "parent_id": "root", "title": "x", "difficulty": 1, "score": 0.5, "expected_speedup": 1.1}]',
     [{"parent": "root", "title": "x", "difficulty": 1, "score": 0.5, "expected_speedup": 1.1, "op": "insert"}],
     'read op "add_action" as "insert"'),
    ('{"ops": [{"op": "close", "node": "h2", "reason": "no"}]}', [{"op": "close", "reason": "no", "target": "h2"}],
     'read "node" as "target"'),
])
def test_replies_in_other_shapes_are_read_as_meant(reply: str, expected_ops: list, note: str) -> None:
    ops, notes = read_plan(reply, default_parent="n4")
    assert ops == expected_ops
    assert any(note in n for n in notes), notes


def test_structured_output_replies_are_plain_json_objects() -> None:
    ops, notes = read_plan(json.dumps({"ops": [{"op": "add_question", "text": "why?"}]}))
    assert ops == [{"op": "add_question", "text": "why?"}] and notes == []


# --- prompt views within a budget -------------------------------------------------------------------


def big_tree(n: int) -> Tree:
    """A tree of `n` actions in chains of ten, half of them done, with notes and outcomes."""
    ops: list[dict] = []
    for i in range(n):
        parent = "root" if i % 10 == 0 else f"n{i}"
        ops.append(insert(parent, f"action {i} " + "x" * 40, rationale="because " * 5))
    t = applied(new_tree("t"), *ops)
    for i in range(1, n + 1, 2):
        t = applied(t, {"op": "record_outcome", "node": f"n{i}",
                        "outcome": Outcome(attempts=2, statuses={"PASSED": 1, "RUNTIME_ERROR": 1},
                                           failures="round 3 RUNTIME_ERROR: " + "y" * 200).model_dump(mode="json")},
                    {"op": "update", "node": f"n{i}", "note": "measured " + "z" * 80})
    return t


def test_the_world_model_view_fits_its_budget_however_large_the_tree() -> None:
    sizes = {}
    for n in (10, 100, 1000):
        t = big_tree(n)
        text = render_world_model(t, focus="n5", budget_chars=30_000)
        assert len(text) <= 30_000
        assert "n5 [" in text  # the node in focus is always shown
        sizes[n] = len(text)
    assert sizes[1000] <= 30_000 and sizes[100] <= 30_000
    assert "[folded:" in render_world_model(big_tree(1000), focus="n5", budget_chars=30_000)


def test_world_model_time_per_round_at_a_thousand_nodes_is_small() -> None:
    t = big_tree(1000)
    started = time.perf_counter()
    rounds = 20
    for r in range(rounds):
        t, ids = select_and_lease(t, 1, f"c{r}", now=float(r), ttl=60.0)
        t = applied(t, {"op": "record_outcome", "node": ids[0], "outcome": {"attempts": 1}},
                    insert(ids[0], f"follow-up {r}"), {"op": "update", "node": ids[0], "rating": 5})
    per_round_ms = (time.perf_counter() - started) * 1e3 / rounds
    assert per_round_ms < 100, per_round_ms  # the benchmark (experiments/wm_scaling.py) records the real figure


# --- the stand-in as a planner ------------------------------------------------------------------------


def test_the_standin_proposes_tunable_changes_it_reads_from_the_seed() -> None:
    seed = "```python\nBLOCK = 128  # tunable: [64, 128, 256]\ndef run(x):\n    return x\n```"
    prompt = f"Call: initialize_tree\n\n# World model\n\nroot\n\n# Starting point\n\n{seed}\n\n# What to do\n\nPropose up to 6 first actions"
    reply = Player(seed=0).answer([{"role": "user", "content": prompt}], structured=True)
    ops = json.loads(reply)["ops"]
    titles = [op["title"] for op in ops if op["op"] == "insert"]
    assert "Set BLOCK to 64" in titles and "Set BLOCK to 256" in titles and "Set BLOCK to 128" not in titles
