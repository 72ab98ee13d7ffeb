"""The LLM policy: prompts from template files, litellm for the calls, replies read with care.

A planner reply is read leniently where its intent is unambiguous (`leniency`), dry-run against
the request's tree, and, when nothing in it can be used (no JSON, or every op rejected), asked
again once with the reasons (`planner_reasks`). Where the provider supports JSON-schema replies
they are requested for planner calls (`structured_output`); a provider that refuses the parameter
is asked again without it, and not asked with it again. A reply that still cannot be used, or a
call that fails after its retries, becomes a reply with an `error` and the call records: the run
decides what to do, the ledger counts the cost, and nothing crashes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from ksearch_ray.models import Solution
from ksearch_ray.policies.contract import CodeReply, CodeRequest, PlanReply, PlanRequest
from ksearch_ray.policies.llm.client import (
    LiteLLMClient,
    LLMCall,
    LLMClient,
    LLMConfig,
    LLMError,
    ResponseCache,
)
from ksearch_ray.policies.llm.parsing import ParseError, extract_code, read_plan
from ksearch_ray.policies.llm.prompting import format_sources, render
from ksearch_ray.policies.llm.views import (
    CHARS_PER_TOKEN,
    cut_middle,
    evidence_text,
    history_text,
    inspirations_text,
    interface_text,
    knowledge_text,
    noise_text,
    result_text,
    times_text,
)
from ksearch_ray.worldmodel.ops import apply_ops
from ksearch_ray.worldmodel.render import render_node, render_world_model
from ksearch_ray.worldmodel.tree import ROOT_ID

PLAN_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"ops": {"type": "array", "items": {"type": "object"}, "description": "Edit ops, in order."}},
    "required": ["ops"],
}
RESPONSE_FORMAT: dict[str, Any] = {"type": "json_schema", "json_schema": {"name": "world_model_edits", "schema": PLAN_SCHEMA}}
MIN_WORLD_MODEL_CHARS = 2_000


class LLMPolicy:
    def __init__(self, config: LLMConfig, cache_dir: Path | None = None, prompts_dir: Path | None = None,
                 client: LLMClient | None = None):
        self.config = config
        self.name = f"llm: {config.model}"
        self.prompts_dir = prompts_dir
        self.client = client or LiteLLMClient(config, cache=ResponseCache(cache_dir) if cache_dir else None)
        self._structured = _wants_structured(config)

    async def _ask(self, kind: str, messages: list[dict[str, Any]], *, structured: bool = False
                   ) -> tuple[str | None, list[LLMCall], str | None]:
        extra = {"response_format": RESPONSE_FORMAT} if structured and self._structured else {}
        try:
            reply = await self.client.complete(kind, messages, **extra)
        except LLMError as exc:
            calls = [exc.call] if exc.call else []
            if extra and exc.kind == "bad_request":
                # The provider refuses JSON-schema replies: say so, and ask as plain text from now on.
                self._structured = False
                for call in calls:
                    call.error_kind = "unsupported"
                text, more, error = await self._ask(kind, messages)
                return text, calls + more, error
            return None, calls, f"LLM call failed: {exc}"
        return reply.text, [reply.call], None

    # --- planner ----------------------------------------------------------------------------------

    async def plan(self, request: PlanRequest) -> PlanReply:
        messages = self._plan_messages(request)
        default_parent = request.node_id or ROOT_ID
        calls: list[LLMCall] = []
        notes: list[str] = []
        problem: str | None = "no reply"
        for ask in range(self.config.planner_reasks + 1):
            kind = request.kind if ask == 0 else f"{request.kind}_reask"
            text, more, error = await self._ask(kind, messages, structured=True)
            calls += more
            if text is None:
                return PlanReply(calls=calls, error=error, notes=notes)
            try:
                ops, read_notes = read_plan(text, default_parent)
            except ParseError as exc:
                problem = f"the reply could not be read: {exc}"
            else:
                if read_notes:
                    notes.append("read leniently: " + "; ".join(read_notes))
                problem = self._unusable(request, ops)
                if problem is None:
                    used = calls[-1]
                    return PlanReply(ops=ops, calls=calls, notes=notes, source=(used.request_hash, used.sample))
            if ask < self.config.planner_reasks:
                notes.append(f"asked again ({problem[:200]})")
                messages = [*messages, {"role": "assistant", "content": text},
                            *render("reask", prompts_dir=self.prompts_dir, problems=problem)]
        return PlanReply(calls=calls, error=problem, notes=notes)

    def _unusable(self, request: PlanRequest, ops: list[dict[str, Any]]) -> str | None:
        """Why nothing in `ops` could apply to the request's tree (None if something can, or if the
        planner asked for no change at all)."""
        if not ops:
            return None
        _, report = apply_ops(request.tree, ops, solution_exists=lambda _id: True, system=False)
        if any(r.ok for r in report.results):
            return None
        return "every op was rejected:\n" + report.render()

    def _plan_messages(self, request: PlanRequest) -> list[dict[str, Any]]:
        budget = request.prompt_budget_tokens * CHARS_PER_TOKEN
        node = request.node_id or ROOT_ID
        fields: dict[str, Any] = {
            "kind": request.kind, "task": request.task.description, "hardware": request.hardware,
            "language": request.language, "noise": noise_text(request.noise), "max_actions": request.max_actions,
            "seed": self._seed_text(request), "node": render_node(request.tree, node),
            "evidence": evidence_text(request.evidence), "code": self._code_text(request), "world_model": "",
        }
        rest = sum(len(m["content"]) for m in render(request.kind, prompts_dir=self.prompts_dir, **fields))
        room = budget - rest
        if room < MIN_WORLD_MODEL_CHARS:
            # Code and evidence give way first: the world model is what the planner plans with.
            for key in ("code", "evidence", "seed"):
                fields[key] = cut_middle(fields[key], max(len(fields[key]) - (MIN_WORLD_MODEL_CHARS - room), 500))
            rest = sum(len(m["content"]) for m in render(request.kind, prompts_dir=self.prompts_dir, **fields))
            room = max(budget - rest, MIN_WORLD_MODEL_CHARS)
        fields["world_model"] = render_world_model(request.tree, focus=node, budget_chars=room)
        return render(request.kind, prompts_dir=self.prompts_dir, **fields)

    def _seed_text(self, request: PlanRequest) -> str:
        root = request.tree.root
        if root.solution and root.solution.solution_id in request.solutions:
            times = times_text(request.seed_times)
            return format_sources(request.solutions[root.solution.solution_id].sources) + (
                f"\n\nIts measured times per workload:\n{times}" if times else "")
        return "(no seed: the first actions are implemented from the specification)"

    def _code_text(self, request: PlanRequest) -> str:
        best = max((a for a in request.attempts if a.passed), key=lambda a: a.speedup or 0.0, default=None)
        if best and best.solution_id in request.solutions:
            return format_sources(request.solutions[best.solution_id].sources)
        target = request.tree.get(request.node_id or ROOT_ID)
        if target is not None and target.solution and target.solution.solution_id in request.solutions:
            return format_sources(request.solutions[target.solution.solution_id].sources)
        return "(no passing code)"

    # --- coder ------------------------------------------------------------------------------------

    async def code(self, request: CodeRequest) -> CodeReply:
        task = request.task
        code_of = request.current or request.base
        result = request.current_result
        fields: dict[str, object] = {
            "kind": request.kind, "task": task.description, "hardware": request.hardware, "language": request.language,
            "action": request.action_text or render_node(request.tree, request.node_id), "interface": interface_text(task),
            "knowledge": knowledge_text(request.tree), "noise": noise_text(request.noise),
            "base_code": format_sources(request.base.sources) if request.base else "",
            "base_result": (f"{request.base_speedup:.3g}x over the baseline\n" if request.base_speedup else "")
            + (times_text(request.base_times) or "(per-workload times not available)"),
            "code": format_sources(code_of.sources) if code_of else "(no program yet: write the first one from the task and interface above)",
            "status": result.status.value if result else "",
            "log": result.decisive_lines() if result else "",
            "result": result_text(result, request.current_speedup, request.current_times),
            "history": history_text(request.history),
            # Inspirations share a third of the prompt budget; the parent's code is shown whole.
            "inspirations": inspirations_text(request.inspirations, request.prompt_budget_tokens * CHARS_PER_TOKEN // 3),
        }
        text, calls, error = await self._ask(request.kind, render(request.kind, prompts_dir=self.prompts_dir, **fields))
        if text is None:
            return CodeReply(calls=calls, error=error)
        language: Literal["cuda", "python"] = "cuda" if request.language == "cuda" else "python"
        try:
            files = extract_code(text, language)
        except ParseError as exc:
            return CodeReply(calls=calls, error=f"unparseable coder reply: {exc}", reply_start=text[:400])
        solution = Solution(
            name=f"{request.node_id}-{request.kind}", task=task.name,
            language="cuda" if language == "cuda" else ("triton" if "triton" in "".join(files.values()) else "python"),
            entry_file=_entry_file(files, language), entry_point=task.entry_point, sources=files, author=self.config.model or "llm",
            description=_explanation(text) or f"{request.kind} for {request.node_id}", parent_id=code_of.id if code_of else None,
        )
        return CodeReply(solution=solution, calls=calls)


def _wants_structured(config: LLMConfig) -> bool:
    if config.structured_output != "auto":
        return config.structured_output == "on"
    try:
        from ksearch_ray.policies.llm.client import _import_litellm

        return bool(_import_litellm().supports_response_schema(model=config.model))
    except Exception:  # noqa: BLE001  (litellm raises for models it does not know: then it is not supported)
        return False


def _explanation(text: str, limit: int = 600) -> str:
    """The prose of a coder reply outside its code blocks: the coder's own summary of the change."""
    prose, inside = [], False
    for line in text.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            inside = not inside
            continue
        if not inside and line.strip() and not line.lstrip().startswith("### file"):
            prose.append(line.strip())
    joined = " ".join(prose)
    return joined if len(joined) <= limit else joined[: limit - 3] + "..."


def _entry_file(files: dict[str, str], language: str) -> str:
    if language == "cuda":
        for name, text in files.items():
            if "PYBIND11_MODULE" in text or "TORCH_LIBRARY" in text:
                return name
    return next(iter(files))
