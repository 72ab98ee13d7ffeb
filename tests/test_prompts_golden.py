"""Every prompt, rendered for one fixed run state and checked in (tests/data/prompts/): a change to
what a model sees shows in a diff. After a deliberate change: KSEARCH_UPDATE_PROMPTS=1 pytest -k golden.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from ksearch_ray.models import EvalResult, Solution, Status, Timing, WorkloadResult
from ksearch_ray.policies.contract import Attempt, AttemptEvidence, CodeRequest, PlanRequest, WorkloadTime
from ksearch_ray.policies.llm.policy import LLMPolicy
from ksearch_ray.policies.llm.types import LLMCall, LLMConfig, LLMReply
from ksearch_ray.taskspec.task import find_task
from ksearch_ray.worldmodel.ops import apply_ops
from ksearch_ray.worldmodel.tree import Outcome, new_tree

GOLDEN = Path(__file__).parent / "data" / "prompts"
TASK = find_task("toy_axpy", [str(Path(__file__).parent / "data")])
SEED = TASK.solution("triton_seed")
FAST = Solution(name="n1-improve", task="toy_axpy", language="triton", entry_file="axpy.py", entry_point="run",
                sources={"axpy.py": SEED.sources["axpy.py"].replace("BLOCK = 128", "BLOCK = 1024")},
                description="BLOCK 1024: a quarter of the programs")


class Recorder:
    """An LLM client that records the messages and answers with a fixed reply."""

    def __init__(self, reply: str):
        self.reply = reply
        self.messages: list[dict[str, Any]] = []

    async def complete(self, kind: str, messages: list[dict[str, Any]], *, response_format: Any = None) -> LLMReply:
        self.messages = messages
        return LLMReply(text=self.reply, call=LLMCall(kind=kind, model="m", request_hash="h"))


def timed(solution: Solution, ms: float) -> EvalResult:
    timing = Timing(mean_ms=ms, median_ms=ms, min_ms=ms, std_ms=0.01, count=20, wall_median_ms=ms, clock="host_wall")
    return EvalResult(solution_id=solution.id, solution_name=solution.name, task="toy_axpy", status=Status.PASSED,
                      workload_set="benchmarks", mode="fresh", device="cpu", timed=True, score=ms,
                      workloads=[WorkloadResult(workload="n4096", status=Status.PASSED, timing=timing)])


def state():  # type: ignore[no-untyped-def]
    tree = new_tree("toy_axpy", TASK.definition.description)
    ops: list[dict[str, Any]] = [
        {"op": "attach_solution", "node": "root", "solution_id": SEED.id, "evaluation": {"status": "PASSED", "speedup": 0.5}},
        {"op": "insert", "parent": "root", "title": "Larger blocks", "description": "BLOCK to 1024", "difficulty": 1,
         "score": 0.7, "expected_speedup": 1.5, "rationale": "fewer programs in the interpreter"},
        {"op": "insert", "parent": "root", "title": "Vectorised loads", "description": "load 4 at a time", "difficulty": 3,
         "score": 0.4, "expected_speedup": 1.2, "rationale": "bandwidth"},
        {"op": "add_hypothesis", "text": "launch overhead dominates at these sizes", "actions": ["n1"]},
        {"op": "add_question", "text": "does NUM_WARPS matter in the interpreter?"},
        {"op": "update", "node": "root", "summary": "one Triton program per BLOCK elements; y = a*x + b"},
        {"op": "record_outcome", "node": "n1", "outcome": Outcome(
            attempts=2, statuses={"PASSED": 1, "COMPILE_ERROR": 1}, best_speedup=1.25, over_parent=2.5,
            failures="round 1 COMPILE_ERROR: SyntaxError: invalid syntax (axpy.py:12)").model_dump(mode="json")},
        {"op": "attach_solution", "node": "n1", "solution_id": FAST.id, "evaluation": {"status": "PASSED", "speedup": 1.25}},
        {"op": "set_best", "solution_id": FAST.id, "speedup": 1.25, "time_ms": {"n4096": 0.8}, "baseline_ms": {"n4096": 1.0}},
    ]
    tree, report = apply_ops(tree, ops, solution_exists=lambda _id: True)
    assert not report.rejected, report.render()
    evidence = [
        AttemptEvidence(round=1, kind="generate_from_base", status="COMPILE_ERROR", change="BLOCK to 1024, draft",
                        error="COMPILE_ERROR: SyntaxError: invalid syntax (axpy.py:12)\n    def _draft(:", speedup=None,
                        over_parent=None),
        AttemptEvidence(round=2, kind="debug", status="PASSED", change="BLOCK 1024: a quarter of the programs",
                        error="", speedup=1.25, over_parent=2.5, times=[WorkloadTime("n4096", 0.8, 2.0, 1.0)]),
    ]
    return tree, evidence


def rendered(kind: str) -> str:
    tree, evidence = state()
    solutions = {SEED.id: SEED, FAST.id: FAST}
    recorder = Recorder("```json\n[]\n```" if kind in ("initialize_tree", "propose_actions", "refine", "too_hard")
                        else "```python\ndef run(x, a, b):\n    return a * x + b\n```")
    policy = LLMPolicy(LLMConfig(model="hosted_vllm/m", structured_output="off"), client=recorder)
    if kind in ("initialize_tree", "propose_actions", "refine", "too_hard"):
        node = {"initialize_tree": "root", "propose_actions": "n1", "refine": "n1", "too_hard": "n2"}[kind]
        attempts = [Attempt(round=2, kind="debug", solution_id=FAST.id, result=timed(FAST, 0.8), speedup=1.25)]
        request = PlanRequest(kind=kind, task=TASK.definition, tree=tree, hardware="cpu (Triton interpreter)",  # type: ignore[arg-type]
                              language="triton", node_id=node, attempts=attempts if kind == "refine" else [],
                              evidence=evidence if kind in ("refine", "too_hard") else [], solutions=solutions,
                              seed_times=[WorkloadTime("n4096", 2.0, None, 1.0)], max_actions=4, noise=0.04)
        asyncio.run(policy.plan(request))
    else:
        current = FAST if kind in ("improve", "debug") else None
        result = timed(FAST, 0.8) if kind == "improve" else (
            EvalResult(solution_id="x", solution_name="x", task="toy_axpy", status=Status.INCORRECT_NUMERICAL,
                       message="n4096: 4096 of 4096 elements outside tolerance; first at [0]: got 1.5, expected 1.0",
                       workload_set="benchmarks", mode="fresh", device="cpu") if kind == "debug" else None)
        request = CodeRequest(
            kind=kind, task=TASK.definition, tree=tree, node_id="n2", hardware="cpu (Triton interpreter)",  # type: ignore[arg-type]
            language="triton", base=None if kind == "generate_from_spec" else FAST, base_speedup=1.25,
            base_times=[WorkloadTime("n4096", 0.8, None, 1.0)], current=current, current_result=result,
            current_speedup=1.25 if kind == "improve" else None,
            current_times=[WorkloadTime("n4096", 0.8, 0.8, 1.0)] if kind == "improve" else [],
            history=[Attempt(round=3, kind="generate_from_base", solution_id=FAST.id, result=timed(FAST, 0.8), speedup=1.25)],
            noise=0.04,
        )
        asyncio.run(policy.code(request))
    return "\n".join(f"<<< {m['role']} >>>\n{m['content']}" for m in recorder.messages)


@pytest.mark.parametrize("kind", ["initialize_tree", "propose_actions", "refine", "too_hard", "generate_from_spec",
                                  "generate_from_base", "debug", "improve"])
def test_golden_prompt(kind: str) -> None:
    text = rendered(kind)
    path = GOLDEN / f"{kind}.txt"
    if os.environ.get("KSEARCH_UPDATE_PROMPTS"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.is_file(), f"no golden file {path}: run with KSEARCH_UPDATE_PROMPTS=1 to write it"
    assert text == path.read_text(), f"the {kind} prompt changed; review the diff, then KSEARCH_UPDATE_PROMPTS=1"
