"""The LLM policy: prompts from template files, litellm for the calls, robust reply parsing.

A reply that cannot be parsed, or a call that fails after its retries, becomes a reply with an
`error` and the call records: the cycle counts it as a failed attempt, the ledger counts its
cost, and nothing crashes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from ksearch_ray.llm.client import LiteLLMClient, LLMCall, LLMClient, LLMConfig, LLMError, ResponseCache
from ksearch_ray.llm.parsing import ParseError, extract_code, extract_ops
from ksearch_ray.llm.prompting import format_sources, render
from ksearch_ray.models import EvalResult, Solution
from ksearch_ray.search.policy import Attempt, CodeReply, CodeRequest, PlanReply, PlanRequest
from ksearch_ray.taskspec.task import TaskDefinition
from ksearch_ray.worldmodel.render import (
    render_best,
    render_failures,
    render_frontier,
    render_path,
    render_tree,
)
from ksearch_ray.worldmodel.tree import ActionNode, Tree


def interface_text(task: TaskDefinition) -> str:
    def spec(name: str, s) -> str:  # type: ignore[no-untyped-def]
        shape = "scalar" if s.shape is None else "[" + ", ".join(str(d) for d in s.shape) + "]"
        return f"  {name}: {shape} {s.dtype}" + (f"  ({s.description})" if s.description else "")

    call = (
        f"def {task.entry_point}(data)  # data = the inputs below, packed as the task description says"
        if task.interface == "gpumode"
        else f"def {task.entry_point}({', '.join(task.inputs)})  # returns the outputs in order (a tuple, or one tensor)"
    )
    lines = [call, "Inputs:", *(spec(n, s) for n, s in task.inputs.items()), "Outputs:"]
    lines += [spec(n, s) for n, s in task.outputs.items()]
    return "\n".join(lines)


def result_text(result: EvalResult | None, speedup: float | None = None) -> str:
    if result is None:
        return "(not evaluated)"
    if not result.passed:
        return f"{result.status.value}: {result.message}\n{result.log[-2500:]}".strip()
    lines = [f"PASSED; speedup over the baseline: {speedup:.3f}x" if speedup else "PASSED"]
    for w in result.workloads:
        if w.timing:
            lines.append(f"  {w.workload}: mean {w.timing.mean_ms:.4f} ms (max abs error {w.max_abs_error or 0:.2e})")
    return "\n".join(lines)


def history_text(history: list[Attempt]) -> str:
    lines = []
    for a in history:
        what = a.error or (a.result.status.value if a.result else "pending")
        if a.speedup:
            what += f", {a.speedup:.3f}x"
        lines.append(f"- round {a.round} ({a.kind}): {what}")
    return "\n".join(lines) or "(none yet)"


def action_text(tree: Tree, node_id: str) -> str:
    node = tree.get(node_id)
    assert isinstance(node, ActionNode)
    return (
        f"{node.title}\n{node.description}\nDifficulty {node.difficulty}/5; expected speedup over the parent "
        f"{node.expected_speedup:.2f}x. Rationale: {node.rationale}\nPath from the root:\n{render_path(tree, node_id)}"
    )


def tree_text(tree: Tree) -> str:
    return (
        f"{render_tree(tree)}\n\nOpen frontier:\n{render_frontier(tree)}\n\nBest so far:\n{render_best(tree)}"
        f"\n\nFound too hard:\n{render_failures(tree)}"
    )


class LLMPolicy:
    def __init__(self, config: LLMConfig, cache_dir: Path | None = None, prompts_dir: Path | None = None,
                 client: LLMClient | None = None):
        self.config = config
        self.name = f"llm: {config.model}"
        self.prompts_dir = prompts_dir
        self.client = client or LiteLLMClient(config, cache=ResponseCache(cache_dir) if cache_dir else None)

    async def _ask(self, kind: str, **fields: object) -> tuple[str | None, list[LLMCall], str | None]:
        messages = render(kind, prompts_dir=self.prompts_dir, **fields)
        try:
            reply = await self.client.complete(kind, messages)
        except LLMError as exc:
            return None, [exc.call] if exc.call else [], f"LLM call failed: {exc}"
        return reply.text, [reply.call], None

    async def plan(self, request: PlanRequest) -> PlanReply:
        fields: dict[str, object] = {
            "task": request.task.description, "hardware": request.hardware, "language": request.language,
            "tree": tree_text(request.tree), "max_actions": request.max_actions,
            "seed": self._seed_text(request),
            "node": action_text(request.tree, request.node_id) if request.node_id and request.node_id != "root" else "root",
            "outcome": history_text(request.attempts), "attempts": history_text(request.attempts),
            "code": self._best_code(request),
        }
        text, calls, error = await self._ask(request.kind, **fields)
        if text is None:
            return PlanReply(calls=calls, error=error)
        try:
            ops = extract_ops(text)
        except ParseError as exc:
            return PlanReply(calls=calls, error=f"unparseable planner reply: {exc}")
        return PlanReply(ops=ops, calls=calls)

    def _seed_text(self, request: PlanRequest) -> str:
        root = request.tree.root
        if root.solution and root.solution.solution_id in request.solutions:
            return format_sources(request.solutions[root.solution.solution_id].sources)
        return "(no seed: the first actions are implemented from the specification)"

    def _best_code(self, request: PlanRequest) -> str:
        best = max((a for a in request.attempts if a.passed), key=lambda a: a.speedup or 0.0, default=None)
        if best and best.solution_id in request.solutions:
            return format_sources(request.solutions[best.solution_id].sources)
        return "(no passing code)"

    async def code(self, request: CodeRequest) -> CodeReply:
        task = request.task
        code_of = request.current or request.base
        fields: dict[str, object] = {
            "task": task.description, "hardware": request.hardware, "language": request.language,
            "action": action_text(request.tree, request.node_id), "interface": interface_text(task),
            "base_code": format_sources(request.base.sources) if request.base else "",
            "base_result": f"speedup {request.base_speedup:.3f}x over the baseline" if request.base_speedup else "(unmeasured)",
            "code": format_sources(code_of.sources) if code_of else "",
            "status": request.current_result.status.value if request.current_result else "",
            "log": f"{request.current_result.message}\n{request.current_result.log}" if request.current_result else "",
            "result": result_text(request.current_result, request.history[-1].speedup if request.history else None),
            "history": history_text(request.history),
        }
        text, calls, error = await self._ask(request.kind, **fields)
        if text is None:
            return CodeReply(calls=calls, error=error)
        language: Literal["cuda", "python"] = "cuda" if request.language == "cuda" else "python"
        try:
            files = extract_code(text, language)
        except ParseError as exc:
            return CodeReply(calls=calls, error=f"unparseable coder reply: {exc}")
        entry_file = _entry_file(files, language)
        solution = Solution(
            name=f"{request.node_id}-{request.kind}", task=task.name,
            language="cuda" if language == "cuda" else ("triton" if "triton" in "".join(files.values()) else "python"),
            entry_file=entry_file, entry_point=task.entry_point, sources=files, author=self.config.model,
            description=f"{request.kind} for {request.node_id}", parent_id=code_of.id if code_of else None,
        )
        return CodeReply(solution=solution, calls=calls)


def _entry_file(files: dict[str, str], language: str) -> str:
    if language == "cuda":
        for name, text in files.items():
            if "PYBIND11_MODULE" in text or "TORCH_LIBRARY" in text:
                return name
    return next(iter(files))
