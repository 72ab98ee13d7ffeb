"""Prompt size and world-model time per round as the tree grows (10, 100, 1,000 nodes).

A round here is what the driver does to the world model for one cycle: lease an action, record its
outcome and attach a solution, apply a planner batch (a note, a rating, two inserts), and render the
planner's view of the world model for the next prompt. Prompt size is that of a whole `refine`
prompt rendered by the LLM policy, within the default budget (100,000 tokens) and a small one
(8,000 tokens), to show that it stays flat beyond the budget.

    python experiments/wm_scaling.py            # prints a Markdown table
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

from ksearch_ray.config import LLMConfig
from ksearch_ray.models import Status
from ksearch_ray.policies.contract import PlanRequest
from ksearch_ray.policies.llm.llm_policy import LLMPolicy
from ksearch_ray.taskspec.task import find_task
from ksearch_ray.worldmodel.ops import apply_ops
from ksearch_ray.worldmodel.render import render_world_model
from ksearch_ray.worldmodel.select import select_and_lease
from ksearch_ray.worldmodel.tree import Outcome, Tree, new_tree


def insert(parent: str, title: str) -> dict:
    return {"op": "insert", "parent": parent, "title": title, "description": "change the tiling " * 4, "difficulty": 2,
            "score": 0.5, "expected_speedup": 1.2, "rationale": "fewer loads " * 5}


def apply(tree: Tree, *ops: dict) -> Tree:
    out, report = apply_ops(tree, list(ops), solution_exists=lambda _id: True)
    assert not report.rejected, report.render()
    return out


def grown(n: int) -> Tree:
    """`n` actions in chains of ten under the root, every other one with a solution, outcome and note."""
    tree = apply(new_tree("trimul", "Triangle multiplicative update."),
                 *[insert("root" if i % 10 == 0 else f"n{i}", f"action {i}") for i in range(n)])
    ops = []
    for i in range(1, n + 1, 2):
        ops += [
            {"op": "record_outcome", "node": f"n{i}", "outcome": Outcome(
                attempts=3, statuses={"PASSED": 2, "COMPILE_ERROR": 1}, best_speedup=1.0 + i / n, over_parent=1.05,
                failures="round 4 COMPILE_ERROR: error: identifier 'acc' is undefined").model_dump(mode="json")},
            {"op": "update", "node": f"n{i}", "note": "measured 1.05x over the parent; loads still dominate"},
        ]
    return apply(tree, *ops, {"op": "add_hypothesis", "text": "bound by the loads of B"})


def one_round(tree: Tree, r: int) -> tuple[Tree, float, float]:
    """The round's tree, and milliseconds spent on world-model operations and on rendering the view."""
    t0 = time.perf_counter()
    tree, ids = select_and_lease(tree, 1, f"c{r}", now=float(r), ttl=3600.0, max_difficulty=5)
    node = ids[0]
    tree = apply(tree, {"op": "record_outcome", "node": node, "outcome": {"attempts": 2, "statuses": {"PASSED": 2}}},
                 {"op": "attach_solution", "node": node, "solution_id": f"s{r}",
                  "evaluation": {"status": Status.PASSED.value, "speedup": 1.1}})
    tree = apply(tree, {"op": "update", "node": node, "rating": 6, "note": "as predicted"},
                 insert(node, f"follow-up {r} a"), insert(node, f"follow-up {r} b"))
    t1 = time.perf_counter()
    render_world_model(tree, focus=node, budget_chars=300_000)
    return tree, (t1 - t0) * 1e3, (time.perf_counter() - t1) * 1e3


def prompt_chars(tree: Tree, budget_tokens: int) -> int:
    task = find_task("trimul")
    focus = next(iter(tree.nodes))
    request = PlanRequest(kind="refine", task=task.definition, tree=tree, hardware="H200", language="triton",
                          node_id=focus, prompt_budget_tokens=budget_tokens)
    policy = LLMPolicy(LLMConfig(model="hosted_vllm/x", structured_output="off"), client=object())  # type: ignore[arg-type]
    return sum(len(m["content"]) for m in policy._plan_messages(request))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    print(f"machine: {platform.node()} ({platform.processor() or platform.machine()}), Python {platform.python_version()}")
    print("| nodes | world-model ops, ms per round | rendering the planner's view, ms | refine prompt, default budget (chars) | refine prompt, 8k-token budget (chars) |")
    print("|---|---|---|---|---|")
    for n in (10, 100, 1000):
        tree = grown(n)
        ops_ms, view_ms = [], []
        for r in range(args.rounds):
            tree, ops, view = one_round(tree, r)
            ops_ms.append(ops)
            view_ms.append(view)
        print(f"| {n} | {statistics.median(ops_ms):.2f} | {statistics.median(view_ms):.2f} | "
              f"{prompt_chars(tree, 100_000)} | {prompt_chars(tree, 8_000)} |")


if __name__ == "__main__":
    main()
