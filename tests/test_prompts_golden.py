"""Every prompt, rendered for fixed run states and checked in (tests/data/prompts/): a change to what a
model sees shows in a diff. Two states: the toy task on the CPU (`tests/data/prompts/*.txt`) and TriMul
on an H200 (`tests/data/prompts/trimul_h200/*.txt`: the device's facts, every workload's shapes, the
roofline, a Triton compile error with its source context, a per-workload mismatch). After a deliberate
change: KSEARCH_UPDATE_PROMPTS=1 pytest -k golden.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from golden import check_golden

from ksearch_ray.config import LLMConfig
from ksearch_ray.evaluation.describe import DATASHEETS, EvaluatorInfo
from ksearch_ray.evaluation.settings import TimingPolicy
from ksearch_ray.models import EvalResult, Solution, Status, Timing, WorkloadResult
from ksearch_ray.policies.contract import (
    Attempt,
    AttemptEvidence,
    CodeRequest,
    Facts,
    FailedAttempt,
    PlanRequest,
    WorkloadShape,
    WorkloadTime,
)
from ksearch_ray.policies.llm.llm_policy import LLMPolicy
from ksearch_ray.policies.llm_call import LLMCall, LLMReply
from ksearch_ray.taskspec.task import Task, find_task
from ksearch_ray.taskspec.tunables import rewrite_tunables
from ksearch_ray.worldmodel.ops import apply_ops
from ksearch_ray.worldmodel.tree import Outcome, Tree, new_tree

GOLDEN = Path(__file__).parent / "data" / "prompts"
TASK = find_task("toy_axpy", [str(Path(__file__).parent / "data")])
SEED = TASK.solution("triton_seed")
FAST = Solution(name="n1-improve", task="toy_axpy", language="triton", entry_file="axpy.py", entry_point="run",
                sources={"axpy.py": SEED.sources["axpy.py"].replace("BLOCK = 128", "BLOCK = 1024")},
                description="BLOCK 1024: a quarter of the programs")
PLAN_KINDS = ("initialize_tree", "propose_actions", "refine", "too_hard")
CODE_KINDS = ("generate_from_spec", "generate_from_base", "debug", "improve")


class Recorder:
    """An LLM client that records the messages and answers with a fixed reply."""

    def __init__(self, reply: str):
        self.reply = reply
        self.messages: list[dict[str, Any]] = []

    async def complete(self, kind: str, messages: list[dict[str, Any]], *, response_format: Any = None) -> LLMReply:
        self.messages = messages
        return LLMReply(text=self.reply, call=LLMCall(kind=kind, model="m", request_hash="h"))

    def context_tokens(self) -> int | None:
        return None


def timed(solution: Solution, ms: float | dict[str, float], device: str = "cpu") -> EvalResult:
    per = ms if isinstance(ms, dict) else {"n4096": ms}
    clock = "cuda_events" if device == "cuda" else "host_wall"
    workloads = [WorkloadResult(workload=name, status=Status.PASSED,
                                timing=Timing(mean_ms=v, median_ms=v, min_ms=v, std_ms=0.01, count=20, wall_median_ms=v,
                                              clock=clock))
                 for name, v in per.items()]
    return EvalResult(solution_id=solution.id, solution_name=solution.name, task=solution.task, status=Status.PASSED,
                      workload_set="benchmarks", mode="fresh", device=device, timed=True, score=min(per.values()),
                      workloads=workloads)


def facts_for(task: Task, info: EvaluatorInfo, device: str) -> Facts:
    workloads = task.workloads(task.definition.default_workloads, device)
    shapes = []
    for w in workloads:
        cost = task.workload_cost(w)
        shapes.append(WorkloadShape(name=w.name, axes=dict(w.axes), params=dict(w.params),
                                    flops=cost[0] if cost else None, bytes=cost[1] if cost else None))
    return Facts(device=info, workload_set=task.workload_set_name(task.definition.default_workloads, device),
                 workloads=shapes, timing_rule=TimingPolicy.for_device(device).rule(
                     device, "fresh", objective=task.definition.objective.timed, flush_l2=task.definition.objective.flush_l2))


@dataclass
class Scenario:
    """A run state every prompt kind is rendered from."""

    task: Task
    seed: Solution
    fast: Solution
    broken: Solution  # the failed attempt's code
    failed: EvalResult  # its evaluation
    tree: Tree
    evidence: list[AttemptEvidence]
    facts: Facts
    hardware: str
    fast_ms: dict[str, float]
    base_times: list[WorkloadTime]
    reference: str
    solutions: dict[str, Solution] = field(default_factory=dict)


def _tree(task: Task, seed: Solution, fast: Solution, fast_speedup: float, fast_ms: dict[str, float],
          base_ms: dict[str, float], titles: tuple[str, str], descriptions: tuple[str, str], failure: str) -> Tree:
    tree = new_tree(task.name, task.definition.description)
    ops: list[dict[str, Any]] = [
        {"op": "attach_solution", "node": "root", "solution_id": seed.id, "evaluation": {"status": "PASSED", "speedup": 0.5}},
        {"op": "insert", "parent": "root", "title": titles[0], "description": descriptions[0], "difficulty": 1,
         "score": 0.7, "expected_speedup": 1.5, "rationale": "fewer programs"},
        {"op": "insert", "parent": "root", "title": titles[1], "description": descriptions[1], "difficulty": 3,
         "score": 0.4, "expected_speedup": 1.2, "rationale": "bandwidth"},
        {"op": "add_hypothesis", "text": "launch overhead dominates at these sizes", "actions": ["n1"]},
        {"op": "add_question", "text": "does NUM_WARPS matter here?"},
        {"op": "update", "node": "root", "summary": "the seed kernel, tiled; see its tunables"},
        {"op": "record_outcome", "node": "n1", "outcome": Outcome(
            attempts=2, statuses={"PASSED": 1, "COMPILE_ERROR": 1}, best_speedup=fast_speedup, over_parent=2.5,
            failures=failure).model_dump(mode="json")},
        {"op": "attach_solution", "node": "n1", "solution_id": fast.id,
         "evaluation": {"status": "PASSED", "speedup": fast_speedup}},
        {"op": "set_best", "solution_id": fast.id, "speedup": fast_speedup, "time_ms": fast_ms, "baseline_ms": base_ms},
    ]
    tree, report = apply_ops(tree, ops, solution_exists=lambda _id: True)
    assert not report.rejected, report.render()
    return tree


def toy() -> Scenario:
    broken = Solution(name="n2-generate", task="toy_axpy", language="triton", entry_file="axpy.py", entry_point="run",
                      sources={"axpy.py": FAST.sources["axpy.py"].replace("a * x + b", "a * x * 1.5 + b")})
    failed = EvalResult(
        solution_id=broken.id, solution_name=broken.name, task="toy_axpy", status=Status.INCORRECT_NUMERICAL,
        message="n4096: 4096 of 4096 elements outside tolerance; first at [0]: got 1.5, expected 1.0",
        workload_set="benchmarks", mode="fresh", device="cpu",
        workloads=[WorkloadResult(workload="n4096", status=Status.INCORRECT_NUMERICAL,
                                  message="4096 of 4096 elements outside tolerance; first at [0]: got 1.5, expected 1.0",
                                  max_abs_error=0.5, fraction_ok=0.0)])
    tree = _tree(TASK, SEED, FAST, 1.25, {"n4096": 0.8}, {"n4096": 1.0}, ("Larger blocks", "Vectorised loads"),
                 ("BLOCK to 1024", "load 4 at a time"), "round 1 COMPILE_ERROR: SyntaxError: invalid syntax (axpy.py:12)")
    evidence = [
        AttemptEvidence(round=1, kind="generate_from_base", status="COMPILE_ERROR", change="BLOCK to 1024, draft",
                        error="COMPILE_ERROR: SyntaxError: invalid syntax (axpy.py:12)\n    def _draft(:", speedup=None,
                        over_parent=None),
        AttemptEvidence(round=2, kind="debug", status="PASSED", change="BLOCK 1024: a quarter of the programs",
                        error="", speedup=1.25, over_parent=2.5, times=[WorkloadTime("n4096", 0.8, 2.0, 1.0)]),
    ]
    info = EvaluatorInfo(device="cpu", name="cpu", hardware="cpu (Triton interpreter)",
                         software={"torch": "2.13.0", "triton": "3.6.0"})
    return Scenario(TASK, SEED, FAST, broken, failed, tree, evidence, facts_for(TASK, info, "cpu"),
                    "cpu (Triton interpreter)", {"n4096": 0.8}, [WorkloadTime("n4096", 0.8, None, 1.0)],
                    (TASK.root / "reference.py").read_text())


TRIMUL = find_task("trimul")
H200 = EvaluatorInfo(device="cuda", name="NVIDIA H200", hardware="NVIDIA H200 (compute capability 9.0, 132 SMs, 140 GiB)",
                     compute_capability="9.0", sm_count=132, memory_gib=139.8, shared_memory_per_sm_kib=228,
                     registers_per_sm=65536, l2_cache_mib=60, peaks=DATASHEETS["H200"],
                     software={"torch": "2.11.0", "triton": "3.6.0", "cuda": "13.0"})
TRIMUL_COMPILE_ERROR = """\
  submission.py:182 in custom_kernel: _triangle_kernel[grid](
CompilationError: at 14:20:
    pid_n = tl.program_id(1)
    base = tl.program_id(2).to(tl.int64) * N * N  # one (b, h) matrix
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, N, BLOCK_K):
        a = tl.load(left_ptr + base + offs_m[:, None] * N + k + tl.arange(0, BLOCK_K)[None, :])
                    ^
ValueError('Cannot make_shape_compatible: incompatible dimensions at index 1: 64 and 32')"""


def trimul_h200() -> Scenario:
    seed = TRIMUL.solution("triton_seed")
    source = seed.sources["submission.py"]
    fast = Solution(name="n1-improve", task="trimul", language="triton", entry_file="submission.py",
                    entry_point="custom_kernel", sources={"submission.py": rewrite_tunables(source, {"DOT_PRECISION": "tf32"})},
                    description="tf32 operands in the triangle contraction")
    broken = Solution(name="n2-generate", task="trimul", language="triton", entry_file="submission.py",
                      entry_point="custom_kernel", sources={"submission.py": rewrite_tunables(source, {"BLOCK_K": 16})})
    workloads = TRIMUL.workloads("benchmarks", "cuda")
    names = [w.name for w in workloads]
    # Plausible figures: the fp32 baseline at about 15 TFLOP/s of the task's least work.
    base_ms = {w.name: round(TRIMUL.workload_cost(w)[0] / 15e12 * 1e3, 3) for w in workloads}  # type: ignore[index]
    fast_ms = {name: ms / 2.1 for name, ms in base_ms.items()}
    failed = EvalResult(
        solution_id=broken.id, solution_name=broken.name, task="trimul", status=Status.INCORRECT_NUMERICAL,
        message=f"{names[1]}: 58 of 50331648 elements outside tolerance; first at [0, 3, 17, 5]: got 0.4183, expected 0.3702",
        workload_set="benchmarks", mode="fresh", device="cuda", device_name="NVIDIA H200",
        workloads=[WorkloadResult(workload=names[0], status=Status.PASSED),
                   WorkloadResult(workload=names[1], status=Status.INCORRECT_NUMERICAL,
                                  message="58 of 50331648 elements outside tolerance; first at [0, 3, 17, 5]: got "
                                          "0.4183, expected 0.3702", max_abs_error=0.0481, max_rel_error=0.13,
                                  fraction_ok=0.99999885)])
    tree = _tree(TRIMUL, seed, fast, 2.1, fast_ms, base_ms, ("TF32 in the contraction", "Larger K tiles"),
                 ("DOT_PRECISION to tf32", "BLOCK_K to 64 with 3 stages"),
                 "round 1 COMPILE_ERROR: CompilationError: at 14:20: incompatible dimensions")
    evidence = [
        AttemptEvidence(round=1, kind="generate_from_base", status="COMPILE_ERROR", change="tf32 draft",
                        error="COMPILE_ERROR: CompilationError: at 14:20:\n" + TRIMUL_COMPILE_ERROR, speedup=None,
                        over_parent=None),
        AttemptEvidence(round=2, kind="debug", status="PASSED", change="tf32 operands in the triangle contraction",
                        error="", speedup=2.1, over_parent=2.0,
                        times=[WorkloadTime(n, fast_ms[n], fast_ms[n] * 2, base_ms[n]) for n in names]),
    ]
    return Scenario(TRIMUL, seed, fast, broken, failed, tree, evidence, facts_for(TRIMUL, H200, "cuda"), H200.hardware,
                    fast_ms, [WorkloadTime(n, fast_ms[n], None, base_ms[n]) for n in names],
                    (TRIMUL.root / "reference.py").read_text())


SCENARIOS = {"toy": (toy, GOLDEN), "trimul_h200": (trimul_h200, GOLDEN / "trimul_h200")}


def state():  # type: ignore[no-untyped-def]
    """The toy scenario's tree and evidence (other tests build on it)."""
    s = toy()
    return s.tree, s.evidence


def rendered(kind: str, scenario: Scenario) -> str:
    s = scenario
    solutions = {s.seed.id: s.seed, s.fast.id: s.fast, s.broken.id: s.broken}
    recorder = Recorder("```json\n{\"ops\": []}\n```" if kind in PLAN_KINDS
                        else "```python\ndef run(x, a, b):\n    return a * x + b\n```")
    policy = LLMPolicy(LLMConfig(model="hosted_vllm/m", structured_output="off", prompt_budget_tokens=100_000),
                       client=recorder)
    if kind in PLAN_KINDS:
        node = {"initialize_tree": "root", "propose_actions": "n1", "refine": "n1", "too_hard": "n2"}[kind]
        fast_result = timed(s.fast, s.fast_ms, s.facts.device.device if s.facts.device else "cpu")
        attempts = {
            "refine": [Attempt(round=2, kind="debug", solution_id=s.fast.id, result=fast_result, speedup=1.25)],
            "too_hard": [Attempt(round=4, kind="generate_from_base", solution_id=s.broken.id, result=s.failed)],
        }.get(kind, [])
        request = PlanRequest(kind=kind, task=s.task.definition, tree=s.tree, hardware=s.hardware,  # type: ignore[arg-type]
                              language="triton", node_id=node, attempts=attempts,
                              evidence=s.evidence if kind in ("refine", "too_hard") else [], solutions=solutions,
                              seed_times=s.base_times, max_actions=4 if kind == "initialize_tree" else 3, noise=0.04,
                              prompt_budget_tokens=100_000, facts=s.facts,
                              rejected=["propose_actions: update (op 1): REJECTED: n2 was changed (version 9, now leased) "
                                        "after the version this reply was written for (8)"] if kind == "refine" else [])
        asyncio.run(policy.plan(request))
    else:
        current = s.fast if kind == "improve" else (s.broken if kind == "debug" else None)
        result = timed(s.fast, s.fast_ms, s.failed.device) if kind == "improve" else (s.failed if kind == "debug" else None)
        failure = FailedAttempt(round=4, kind="generate_from_base", solution=s.broken, result=s.failed) \
            if kind in ("debug", "improve") else None
        request = CodeRequest(
            kind=kind, task=s.task.definition, tree=s.tree, node_id="n2", hardware=s.hardware,  # type: ignore[arg-type]
            language="triton", base=None if kind == "generate_from_spec" else s.fast, base_speedup=1.25,
            base_times=s.base_times, current=current, current_result=result,
            current_speedup=1.25 if kind == "improve" else None,
            current_times=[WorkloadTime(t.workload, t.ms, t.ms, t.baseline_ms) for t in s.base_times] if kind == "improve" else [],
            history=[Attempt(round=3, kind="generate_from_base", solution_id=s.fast.id, result=timed(s.fast, s.fast_ms),
                             speedup=1.25),
                     Attempt(round=4, kind="generate_from_base", solution_id=s.broken.id, result=s.failed)],
            noise=0.04, prompt_budget_tokens=100_000, facts=s.facts, failure=failure, passed=s.fast, passed_speedup=1.25,
            reference=s.reference if kind == "generate_from_spec" else "",
        )
        asyncio.run(policy.code(request))
    return "\n".join(f"<<< {m['role']} >>>\n{m['content']}" for m in recorder.messages)


@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize("kind", [*PLAN_KINDS, *CODE_KINDS])
def test_golden_prompt(kind: str, scenario: str) -> None:
    make, directory = SCENARIOS[scenario]
    check_golden(rendered(kind, make()), directory / f"{kind}.txt", f"{kind} prompt")


def test_the_h200_prompts_carry_the_facts_a_kernel_engineer_needs() -> None:
    s = trimul_h200()
    improve, debug = rendered("improve", s), rendered("debug", s)
    for text in (improve, debug, rendered("refine", s)):
        assert "132 SMs" in text and "228 KiB shared memory" in text and "65536 32-bit registers" in text
        assert "4.8 TB/s" in text and "989 TFLOP/s" in text and "triton 3.6.0" in text and "cuda 13.0" in text
        assert "regenerated" in text and "CUDA graph" in text
        assert all(w.name in text for w in s.facts.workloads) and "N=1024, B=1, D=384" in text
    assert "% of the fp32 peak" in improve and "% of memory bandwidth" in improve  # the roofline, per workload
    # After a pass, a later failure still reaches the coder with its code and its per-workload mismatch.
    assert "The latest attempt, which failed" in improve and "1.2e-06 of the elements outside tolerance" in improve
    assert "+BLOCK_K = 16" in improve  # as a change to the best code, which the prompt shows in full
    assert "Last code that passed" in debug and "+DOT_PRECISION = 'tf32'" in debug
    # The planner's evidence keeps Triton's source context of a compile error (the line and the caret).
    refine = rendered("refine", s)
    assert "a = tl.load(left_ptr" in refine and "                    ^" in refine
    assert "not applied" in refine and "n2 was changed" in refine
    assert "BLOCK_K = 16" in rendered("too_hard", s)  # the failing code itself


def test_the_spec_prompt_shows_the_reference_implementation() -> None:
    text = rendered("generate_from_spec", trimul_h200())
    assert "# Reference implementation" in text and "def reference(inputs" in text
