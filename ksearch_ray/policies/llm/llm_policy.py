"""The LLM policy: prompts from template files, litellm for the calls, replies read with care.

A planner reply is read leniently where its intent is unambiguous (`leniency`), dry-run against
the request's tree, and, when nothing in it can be used (no JSON, or every op rejected), asked
again once with the reasons (`planner_reasks`). Where the provider supports JSON-schema replies
they are requested for planner calls (`structured_output`); a call refused with a 400 is asked
again without the schema, that call only (a schema refused by name is dropped for the model by the
client). Prompts fit a budget in tokens: the run's setting, else what the model's context window
leaves for the answer; a prompt the model still finds too long is built again smaller, and the
smaller budget kept. A reply cut at the length limit is continued. A reply that still cannot be
used, or a call that fails, comes back with an `error`, the call records and (for a failed call)
`failed_call`: the run decides what to do (wait, stop, or count a failed attempt), the ledger
counts every call, and nothing crashes.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ksearch_ray.config import LLMConfig
from ksearch_ray.models import Solution
from ksearch_ray.policies.contract import CodeReply, CodeRequest, PlanReply, PlanRequest
from ksearch_ray.policies.llm.litellm_client import LiteLLMClient
from ksearch_ray.policies.llm.parsing import ParseError, extract_code, read_plan
from ksearch_ray.policies.llm.prompting import format_sources, render
from ksearch_ray.policies.llm.ratelimit import Limiter
from ksearch_ray.policies.llm.reply_cache import ResponseCache
from ksearch_ray.policies.llm.views import (
    CHARS_PER_TOKEN,
    code_against,
    cut_middle,
    evidence_text,
    failure_text,
    hardware_text,
    history_text,
    inspirations_text,
    interface_text,
    knowledge_text,
    measurement_text,
    noise_text,
    profile_section,
    result_text,
    times_text,
)
from ksearch_ray.policies.llm_call import LLMCall, LLMClient, LLMError, LLMReply, error_class
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
DEFAULT_BUDGET_TOKENS = 32_000
"""Prompt budget when the model's context window cannot be learned (a local server that does not say)."""
MAX_BUDGET_TOKENS = 100_000
"""Prompts stay below this even for models with larger windows: beyond it a prompt costs more than it tells."""
MIN_BUDGET_TOKENS = 1_000
MAX_SHRINKS = 3
MAX_CONTINUATIONS = 2
CONTINUE = ("Your reply was cut off at the length limit. Continue exactly where it stopped, without repeating "
            "anything and without any preamble.")
_WINDOW = re.compile(r"maximum context length is (\d+)", re.IGNORECASE)


@dataclass
class _Asked:
    """One logical question to the model: the text (None if there is none), every call it took, why not."""

    text: str | None
    calls: list[LLMCall]
    error: str | None = None
    failed: LLMCall | None = None
    truncated: bool = False


class LLMPolicy:
    def __init__(self, config: LLMConfig, cache_dir: Path | None = None, prompts_dir: Path | None = None,
                 client: LLMClient | None = None, limiter: Limiter | None = None):
        self.config = config
        self.name = f"llm: {config.model}"
        self.prompts_dir = prompts_dir
        self.client = client or LiteLLMClient(config, cache=ResponseCache(cache_dir) if cache_dir else None,
                                              limiter=limiter)
        self._structured = _wants_structured(config)
        self._budget_cap: int | None = None  # tokens: learned from a context overflow
        self._default_budget: int | None = None

    # --- the budget -------------------------------------------------------------------------------

    def budget_tokens(self, requested: int | None) -> int:
        """The prompt budget: the request's (the run's setting), else what the model's context window
        leaves for the answer; never more than a context overflow has shown to fit."""
        if requested is None:
            if self._default_budget is None:
                self._default_budget = self._budget_from_window()
            requested = self._default_budget
        return min(requested, self._budget_cap) if self._budget_cap else requested

    def _budget_from_window(self) -> int:
        window = getattr(self.client, "context_tokens", lambda: None)()
        if not window:
            return DEFAULT_BUDGET_TOKENS
        return min(max(window - self._answer_room(window), MIN_BUDGET_TOKENS), MAX_BUDGET_TOKENS)

    def _answer_room(self, window: int) -> int:
        """Tokens of the window kept for the reply: the run's max_tokens, else a quarter (within bounds)."""
        return self.config.max_tokens or min(max(window // 4, 256), 16_000)

    def _shrunk(self, budget: int, error: LLMError) -> int:
        """A budget the model's context can hold, after it refused one as too long."""
        said = _WINDOW.search(error.message)
        smaller = int(budget * 0.6)
        if said:
            window = int(said.group(1))
            smaller = min(smaller, window - self._answer_room(window))
        self._budget_cap = max(smaller, MIN_BUDGET_TOKENS)
        return self._budget_cap

    # --- asking -----------------------------------------------------------------------------------

    async def _complete(self, kind: str, messages: list[dict[str, Any]], structured: bool
                        ) -> tuple[LLMReply, list[LLMCall]]:
        """One completion; a structured call the provider refuses with a 400 is asked again, this once,
        without the schema (a parameter refused by name is dropped for the model by the client)."""
        schema = RESPONSE_FORMAT if structured and self._structured else None
        try:
            return await self.client.complete(kind, messages, response_format=schema), []
        except LLMError as exc:
            if schema is None or exc.kind != "bad_request":
                raise
            refused = [exc.call] if exc.call else []
            reply = await self.client.complete(kind, messages)
            return reply, refused

    async def _ask(self, kind: str, build: Callable[[int], list[dict[str, Any]]], budget: int, *,
                   structured: bool = False) -> _Asked:
        """Ask, reading the reply where it is; a prompt too long for the model is built again smaller, and a
        reply cut at the length limit is continued. A call that still fails comes back with its record."""
        calls: list[LLMCall] = []
        for shrink in range(MAX_SHRINKS + 1):
            messages = build(budget)
            try:
                reply, refused = await self._complete(kind, messages, structured)
            except LLMError as exc:
                calls += [exc.call] if exc.call else []
                if exc.kind == "context_window" and shrink < MAX_SHRINKS and budget > MIN_BUDGET_TOKENS:
                    budget = self._shrunk(budget, exc)
                    continue
                return _Asked(None, calls, _failed(exc), failed=exc.call)
            calls += [*refused, reply.call]
            text = reply.text
            for _ in range(MAX_CONTINUATIONS):
                if reply.call.finish_reason != "length" or not text.strip():
                    break
                follow = [*messages, {"role": "assistant", "content": text}, {"role": "user", "content": CONTINUE}]
                try:
                    reply, refused = await self._complete(f"{kind}_continue", follow, False)
                except LLMError as exc:
                    calls += [exc.call] if exc.call else []
                    return _Asked(None, calls, _failed(exc), failed=exc.call)
                calls += [*refused, reply.call]
                text += reply.text
            return _Asked(text, calls, truncated=reply.call.finish_reason == "length")
        raise AssertionError("unreachable: the last shrink returns")

    # --- planner ----------------------------------------------------------------------------------

    async def plan(self, request: PlanRequest) -> PlanReply:
        default_parent = request.node_id or ROOT_ID
        calls: list[LLMCall] = []
        notes: list[str] = []
        problem: str = "no reply"
        followups: list[dict[str, Any]] = []
        budget = self.budget_tokens(request.prompt_budget_tokens)
        for ask in range(self.config.planner_reasks + 1):
            kind = request.kind if ask == 0 else f"{request.kind}_reask"
            asked = await self._ask(kind, functools.partial(self._plan_followed, request, list(followups)), budget,
                                    structured=True)
            calls += asked.calls
            if asked.text is None:
                return PlanReply(calls=calls, error=asked.error, notes=notes, failed_call=asked.failed)
            text = asked.text
            try:
                ops, read_notes = read_plan(text, default_parent)
            except ParseError as exc:
                problem = f"the reply could not be read: {exc}"
            else:
                if read_notes:
                    notes.append("read leniently: " + "; ".join(read_notes))
                unusable = self._unusable(request, ops)
                if unusable is None:
                    used = calls[-1]
                    return PlanReply(ops=ops, calls=calls, notes=notes, source=(used.request_hash, used.sample))
                problem = unusable
            if ask < self.config.planner_reasks:
                notes.append(f"asked again ({problem[:200]})")
                # An empty assistant message is refused by some providers: an empty reply is said in words.
                said = [{"role": "assistant", "content": text}] if text.strip() else []
                problems = problem if text.strip() else f"Your reply was empty. {problem}"
                followups = [*followups, *said, *render("reask", prompts_dir=self.prompts_dir, problems=problems)]
        return PlanReply(calls=calls, error=problem, notes=notes)

    def _plan_followed(self, request: PlanRequest, followups: list[dict[str, Any]], budget_tokens: int
                       ) -> list[dict[str, Any]]:
        return self._plan_messages(request, budget_tokens) + followups

    def _unusable(self, request: PlanRequest, ops: list[dict[str, Any]]) -> str | None:
        """Why nothing in `ops` could apply to the request's tree (None if something can, or if the
        planner asked for no change at all)."""
        if not ops:
            return None
        _, report = apply_ops(request.tree, ops, solution_exists=lambda _id: True, system=False,
                              max_new=request.max_actions)
        if any(r.ok for r in report.results):
            return None
        return "every op was rejected:\n" + report.render()

    def _plan_messages(self, request: PlanRequest, budget_tokens: int) -> list[dict[str, Any]]:
        budget = budget_tokens * CHARS_PER_TOKEN
        node = request.node_id or ROOT_ID
        fields: dict[str, Any] = {
            "kind": request.kind, "task": request.task.description,
            "hardware": hardware_text(request.hardware, request.facts), "measurement": measurement_text(request.facts),
            "language": request.language, "noise": noise_text(request.noise), "max_actions": request.max_actions,
            "seed": self._seed_text(request), "node": render_node(request.tree, node),
            "evidence": evidence_text(request.evidence, request.facts), "code": self._code_text(request),
            "world_model": "", "remarks": self._remarks(request), "profile": profile_section(request.profiles),
        }
        rest = sum(len(m["content"]) for m in render(request.kind, prompts_dir=self.prompts_dir, **fields))
        room = budget - rest
        if room < MIN_WORLD_MODEL_CHARS:
            # Code and evidence give way first: the world model is what the planner plans with.
            for key in ("code", "evidence", "seed", "measurement"):
                fields[key] = cut_middle(fields[key], max(len(fields[key]) - (MIN_WORLD_MODEL_CHARS - room), 500))
            rest = sum(len(m["content"]) for m in render(request.kind, prompts_dir=self.prompts_dir, **fields))
            room = max(budget - rest, MIN_WORLD_MODEL_CHARS)
        fields["world_model"] = render_world_model(request.tree, focus=node, budget_chars=room)
        return render(request.kind, prompts_dir=self.prompts_dir, **fields)

    @staticmethod
    def _remarks(request: PlanRequest) -> str:
        parts = []
        if request.rejected:
            parts.append("# Edits of your earlier replies that were not applied\n\n"
                         + "\n".join(f"- {line}" for line in request.rejected))
        if request.empty_before:
            parts.append("# Note\n\nYour last answer to this question was an empty plan, which ends the search. "
                         "Propose the actions still worth trying; answer with an empty list again only if nothing is.")
        return "".join(f"\n\n{part}" for part in parts)

    def _seed_text(self, request: PlanRequest) -> str:
        root = request.tree.root
        if root.solution and root.solution.solution_id in request.solutions:
            times = times_text(request.seed_times, request.facts)
            return format_sources(request.solutions[root.solution.solution_id].sources) + (
                f"\n\nIts measured times per workload:\n{times}" if times else "")
        return "(no seed: the first actions are implemented from the specification)"

    def _code_text(self, request: PlanRequest) -> str:
        if request.kind == "too_hard":  # the failing code: what the obstacle is in
            last = next((a for a in reversed(request.attempts) if a.solution_id in request.solutions), None)
            if last is not None and last.solution_id:
                return format_sources(request.solutions[last.solution_id].sources)
            return "(no attempt returned code)"
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
        budget = self.budget_tokens(request.prompt_budget_tokens)
        asked = await self._ask(request.kind, lambda b: self._code_messages(request, b), budget)
        if asked.text is None:
            return CodeReply(calls=asked.calls, error=asked.error, failed_call=asked.failed)
        text = asked.text
        language: Literal["cuda", "python"] = "cuda" if request.language == "cuda" else "python"
        try:
            files = extract_code(text, language)
        except ParseError as exc:
            cut = " (the reply was cut off at the length limit)" if asked.truncated else ""
            return CodeReply(calls=asked.calls, error=f"unparseable coder reply: {exc}{cut}", reply_start=text[:400])
        solution = Solution(
            name=f"{request.node_id}-{request.kind}", task=task.name,
            language="cuda" if language == "cuda" else ("triton" if "triton" in "".join(files.values()) else "python"),
            entry_file=_entry_file(files, language), entry_point=task.entry_point, sources=files, author=self.config.model or "llm",
            description=_explanation(text) or f"{request.kind} for {request.node_id}", parent_id=code_of.id if code_of else None,
        )
        return CodeReply(solution=solution, calls=asked.calls)

    def _code_messages(self, request: CodeRequest, budget_tokens: int) -> list[dict[str, Any]]:
        task = request.task
        code_of = request.current or request.base
        result = request.current_result
        facts = request.facts
        passed = request.passed
        # improve shows the best code in full, so its failed successor goes as a change to it; debug shows
        # the failed code in full, and the last code that passed as a change to that.
        failure = failure_text(request.failure, shown=code_of if request.kind == "improve" else None,
                               what="best attempt so far")
        failed_code = request.failure.solution if request.failure else None
        fields: dict[str, Any] = {
            "kind": request.kind, "task": task.description, "language": request.language,
            "hardware": hardware_text(request.hardware, facts), "measurement": measurement_text(facts),
            "action": request.action_text or render_node(request.tree, request.node_id), "interface": interface_text(task),
            "knowledge": knowledge_text(request.tree), "noise": noise_text(request.noise),
            "base_code": format_sources(request.base.sources) if request.base else "",
            "base_result": (f"{request.base_speedup:.3g}x over the baseline\n" if request.base_speedup else "")
            + (times_text(request.base_times, facts) or "(per-workload times not available)"),
            "code": format_sources(code_of.sources) if code_of else "(no program yet: write the first one from the task and interface above)",
            "result": result_text(result, request.current_speedup, request.current_times, facts),
            "failure": failure or "(no failed attempt)",
            "failure_section": f"\n# The latest attempt, which failed\n\n{failure}\n" if failure else "",
            "passed_code": (code_against(passed, failed_code, "attempt that failed")
                            + (f"\n\n{request.passed_speedup:.3g}x over the baseline." if request.passed_speedup else ""))
            if passed else "(nothing has passed yet)",
            "reference": f"```python\n{request.reference.rstrip()}\n```" if request.reference else "(not available)",
            "history": history_text(request.history, earlier=request.earlier_attempts),
            # Inspirations share a third of the prompt budget; the parent's code is shown whole.
            "inspirations": inspirations_text(request.inspirations, budget_tokens * CHARS_PER_TOKEN // 3),
        }
        # Over the budget: what helps least gives way first; the code being changed last.
        order = (("history", 400), ("inspirations", 1_000), ("knowledge", 300), ("measurement", 800),
                 ("reference", 2_000), ("passed_code", 1_500), ("failure_section", 1_500), ("failure", 1_500),
                 ("result", 600), ("base_result", 400), ("base_code", 2_000), ("code", 2_000))
        return self._fit(request.kind, fields, budget_tokens * CHARS_PER_TOKEN, order)

    def _fit(self, kind: str, fields: dict[str, Any], budget: int, order: tuple[tuple[str, int], ...]
             ) -> list[dict[str, Any]]:
        messages = render(kind, prompts_dir=self.prompts_dir, **fields)
        for key, floor in order:
            excess = sum(len(m["content"]) for m in messages) - budget
            if excess <= 0:
                break
            value = fields[key]
            if isinstance(value, str) and len(value) > floor:
                fields[key] = cut_middle(value, max(floor, len(value) - excess))
                messages = render(kind, prompts_dir=self.prompts_dir, **fields)
        return messages


def _failed(exc: LLMError) -> str:
    """What a failed call's reply says: a reply that arrived and could not be read is said apart from a call
    that got none (a reader tells "the endpoint answers in a way we cannot read" from "the endpoint is down")."""
    if error_class(exc.kind) == "unusable":
        return f"the endpoint answered but its reply could not be read: {exc}"
    return f"LLM call failed: {exc}"


def _wants_structured(config: LLMConfig) -> bool:
    if config.structured_output != "auto":
        return config.structured_output == "on"
    try:
        from ksearch_ray.policies.llm.litellm_client import _import_litellm

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
