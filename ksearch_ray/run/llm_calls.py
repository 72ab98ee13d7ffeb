"""The planner's and the coder's calls: requests with what prompts state, and calls that outlast the provider.

Every call goes through `_policy_call`, which decides what a failed call means: the provider's passing
troubles are waited out and asked again (an `outage` event when it begins and ends; no round is spent:
`generate` records a candidate only when the coder answered), errors that never clear stop the run, a
refused request is asked again twice and then one failed call, and a policy that raised or broke its
contract is an event and a bug report (`run.faults`). Planner ops are applied in `plan`, against the tree
version the request was written for.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from ksearch_ray.config import RunConfig
from ksearch_ray.events import Candidate, LlmCallEvent, NoStream, Outage, PlanEmpty, PlanFailed, PolicyFault
from ksearch_ray.methods.context import Refused, RunRecord, Where, WorldModel
from ksearch_ray.models import Solution
from ksearch_ray.policies import reads_every_plan_solution
from ksearch_ray.policies.contract import (
    Attempt,
    CodeReply,
    CodeRequest,
    Facts,
    PlanReply,
    PlanRequest,
    WorkloadShape,
    code_request,
    plan_request,
    shown_plan_code,
)
from ksearch_ray.policies.llm_call import LLMCall, error_class
from ksearch_ray.run.backends import PolicyBackend
from ksearch_ray.run.budget import Budget
from ksearch_ray.run.errors import SearchError
from ksearch_ray.run.evaluations import Evaluations
from ksearch_ray.run.faults import BUGS_DIR, FAULT_LIMIT, one_line, reply_problem, write_bug_report
from ksearch_ray.store import RunStore
from ksearch_ray.taskspec.spec import TaskError
from ksearch_ray.text import clip
from ksearch_ray.worldmodel.api import ApplyOps
from ksearch_ray.worldmodel.ops import ApplyReport
from ksearch_ray.worldmodel.tree import Tree

log = logging.getLogger(__name__)

REPLY_START_CHARS = 200
"""How much of a reply without code is kept, so a user can see what the model said instead."""
REFUSAL_RETRIES = 2
"""Times a call the provider refused (a content policy, a bad request) is asked again: classifiers misfire."""
REJECTED_LIMIT = 5
"""Calls refused in a row (each after its retries), with nothing answered between, before the run stops: a
refusal is one failed call, but one that every request gets will not clear."""
REJECTIONS_SHOWN = 12
"""Lines of not-applied edits a planner prompt repeats."""


class LlmCalls:
    def __init__(self, config: RunConfig, run: RunRecord, store: RunStore, planner: PolicyBackend,
                 coder: PolicyBackend, budget: Budget, world: WorldModel, evals: Evaluations,
                 changed: Callable[[], None]):
        self.config = config
        self.run = run
        self.store = store
        self.planner = planner
        self.coder = coder
        self.budget = budget
        self.world = world
        self.evals = evals
        self.changed = changed  # the live view redraws: a call began or ended
        self.policy_name = ""
        self.in_flight: dict[int, tuple[str, str, float]] = {}  # call token -> (role, kind, monotonic start)
        self.outage_since: float | None = None  # monotonic start of the provider's current outage
        self._tokens = 0
        self._outage_failures = 0
        self._outage_error = ""
        self._rejected_in_a_row = 0
        self._faults_in_a_row: dict[str, int] = {}  # role -> policy faults in a row (run.faults)
        self._facts: Facts | None = None
        self._told_seq = 0  # planner rejections up to this event were already shown to the planner

    async def start(self) -> None:
        self.policy_name = await self.planner.name()

    def release(self) -> None:
        self.planner.release()
        self.coder.release()

    # --- calls ---------------------------------------------------------------------------------------------

    async def _policy_call(self, role: str, kind: str, request: Any, cycle: str | None) -> Any:
        """A planner or coder call: visible in the live view while it waits, logged when it returns.

        What the provider's failure means decides what happens next: one that passes (5xx, 429, a timeout,
        a cut connection) is waited out and the call asked again, spending no round, until the outage
        allowance is spent (then the run stops, resumable); one that never clears (a rejected key, an
        unknown model, an exhausted quota) stops the run at once; a refused request (a content policy, a
        bad request) is one failed call, returned like any reply without a result."""
        refusals = 0
        while True:
            try:
                reply = await self._ask_backend(role, kind, request)
                problem, exc = reply_problem(role, reply), None
            except SearchError:
                raise
            except Exception as raised:  # noqa: BLE001  (any exception a policy's own code raises is its bug: recorded below)
                problem, exc = one_line(raised), raised
            if problem is not None:
                self._policy_fault(role, kind, request, cycle, problem, exc)
                continue  # asked again: a fault spends no round
            self._faults_in_a_row[role] = 0
            for call in reply.calls:
                self.run.record(LlmCallEvent(role=role, cycle=cycle, call=call))
                if call.stream_fallback and call.error is None and self.run.view.no_stream is None:
                    self.run.record(NoStream(reason=call.stream_fallback))
                    self.run.say(f"the LLM endpoint does not stream ({clip(call.stream_fallback, 160)}): asking "
                                 "without streaming from now on")
                if call.error is None and call.attempts > 1 and not call.stream_fallback:  # details: the run's logs
                    self.run.say(f"{role} {call.kind}: answered after {call.attempts} attempts")
            failed: LLMCall | None = reply.failed_call
            what = error_class(failed.error_kind) if failed is not None else None
            if what != "transient":
                self._provider_answered()
            if what is None:
                self._rejected_in_a_row = 0
                return reply
            assert failed is not None
            if what == "unusable":
                # The endpoint answered, in a way that cannot be read: one failed call (a round without code, for
                # the coder), never an outage.
                self.run.say(f"the LLM endpoint answers, but the {role}'s {kind} reply could not be read "
                             f"({clip(failed.error or '', 160)})")
                return reply
            if what == "fatal":
                # A rejected key, an unknown model: every further call would fail the same way, so stop
                # now instead of spending the budget on failures.
                raise SearchError(f"the {role}'s LLM call failed and retrying cannot fix it: {failed.error}")
            if what == "rejected":
                refusals += 1
                if refusals <= REFUSAL_RETRIES:
                    self.run.say(f"the provider refused the {role}'s {kind} call ({(failed.error or '')[:160]}); "
                                 "asking again (no round is spent on it)")
                    await self._visible_sleep(role, kind, self.config.llm.backoff_base_s)
                    continue
                self._rejected_in_a_row += 1
                if self._rejected_in_a_row >= REJECTED_LIMIT:
                    raise SearchError(f"the provider refused {self._rejected_in_a_row} calls in a row; the last: "
                                      f"{failed.error}")
                return reply
            wait = self._outage_wait(failed)
            if self.budget.spend_left() is not None:
                return reply  # the budget ran out while the provider was failing: the caller gives its round back
            await self._visible_sleep(role, kind, wait)

    def _policy_fault(self, role: str, kind: str, request: Any, cycle: str | None, error: str,
                      exc: BaseException | None) -> None:
        """A policy that raised or replied out of contract: an event and a bug report; SearchError (the run
        stops, resumable) once this role has faulted FAULT_LIMIT times in a row."""
        in_a_row = self._faults_in_a_row.get(role, 0) + 1
        self._faults_in_a_row[role] = in_a_row
        report = write_bug_report(self.store.root, len(self.run.view.policy_faults) + 1, role=role, kind=kind, cycle=cycle,
                                  policy=self.policy_name, error=error, exc=exc, request=request)
        log.warning("the %s's %s call failed with its own bug (%s); report: %s", role, kind, error, report)
        self.run.record(PolicyFault(role=role, call_kind=kind, cycle=cycle, error=error, report=report, in_a_row=in_a_row))
        self.run.say(f"the {role}'s {kind} call broke the policy contract ({clip(error, 160)}); bug report: "
                     f"{self.store.root / report}; asking again (no round is spent on it)")
        if in_a_row >= FAULT_LIMIT:
            raise SearchError(f"the {role} broke the policy contract {in_a_row} times in a row (last: {error}); "
                              f"bug reports in {self.store.root / BUGS_DIR}")

    async def _ask_backend(self, role: str, kind: str, request: Any) -> Any:
        backend = self.planner if role == "planner" else self.coder
        self._tokens += 1
        token = self._tokens
        self.in_flight[token] = (role, kind, time.monotonic())
        self.changed()
        try:
            return await (backend.plan(request) if role == "planner" else backend.code(request))
        finally:
            self.in_flight.pop(token, None)

    async def _visible_sleep(self, role: str, kind: str, seconds: float) -> None:
        """Wait before asking again, shown in the live view as what this call waits for."""
        self._tokens += 1
        token = self._tokens
        self.in_flight[token] = (role, f"{kind}: retry after the provider failed", time.monotonic())
        self.changed()
        try:
            await asyncio.sleep(seconds)
        finally:
            self.in_flight.pop(token, None)

    def _outage_wait(self, failed: LLMCall) -> float:
        """Note one more failure of an outage (starting it, on the first); how long to wait before asking
        again. SearchError once the outage has lasted longer than its allowance."""
        llm = self.config.llm
        now = time.monotonic()
        self._outage_error = failed.error or failed.error_kind or "?"
        if self.outage_since is None:
            self.outage_since = now
            self._outage_failures = 0
            self.run.record(Outage(state="began", error=self._outage_error))
            self.run.say(f"the LLM provider is failing ({self._outage_error[:160]}): the endpoint is down or "
                         f"overloaded; waiting and asking again, for up to {llm.outage_s:g} s; no round is spent on it")
        self._outage_failures += 1
        lasted = now - self.outage_since
        if lasted >= llm.outage_s:
            self.run.record(Outage(state="gave_up", error=self._outage_error, failed_calls=self._outage_failures,
                               waited_s=lasted))
            raise SearchError(f"the LLM provider kept failing for {lasted:.0f} s, longer than the outage allowance "
                              f"(--outage-s {llm.outage_s:g}); last error: {self._outage_error[:200]}")
        backoff = min(llm.backoff_max_s, llm.backoff_base_s * 2 ** min(self._outage_failures - 1, 16))
        if failed.retry_after_s is not None:
            backoff = max(backoff, min(failed.retry_after_s, llm.backoff_max_s))
        return float(max(min(backoff, llm.outage_s - lasted), 0.0))

    def _provider_answered(self) -> None:
        if self.outage_since is None:
            return
        lasted = time.monotonic() - self.outage_since
        self.run.record(Outage(state="ended", error=self._outage_error, failed_calls=self._outage_failures, waited_s=lasted))
        self.run.say(f"the LLM provider answers again, after {lasted:.0f} s and {self._outage_failures} failed call(s)")
        self.outage_since = None

    # --- what prompts say ---------------------------------------------------------------------------

    def facts(self) -> Facts:
        """The device, the timing method and every scored workload's shapes and least work: once a session."""
        if self._facts is None:
            device = self.config.evaluation.device or "cpu"
            shapes = []
            for workload in self.run.task.workloads(self.evals.workload_set, device):
                try:
                    cost = self.run.task.workload_cost(workload)
                except TaskError:
                    cost = None
                shapes.append(WorkloadShape(name=workload.name, axes=dict(workload.axes), params=dict(workload.params),
                                            flops=cost[0] if cost else None, bytes=cost[1] if cost else None))
            mode = self.config.evaluation.mode
            self._facts = Facts(device=self.evals.infos[0] if self.evals.infos else None,
                                workload_set=self.run.task.workload_set_name(self.evals.workload_set, device), workloads=shapes,
                                timing_rule=self.config.evaluation.timing_for(device).rule(
                                    device, mode, objective=self.config.evaluation.objective or self.run.task.definition.objective.timed,
                                    flush_l2=self.run.task.definition.objective.flush_l2),
                                fresh_inputs=mode == "fresh")
        return self._facts

    def _reference_source(self) -> str:
        path = self.run.task.root / "reference.py"
        return path.read_text(encoding="utf-8") if path.is_file() else ""

    def _rejections(self) -> list[str]:
        """Planner edits not applied since the planner was last told, for its next prompt."""
        fresh = [line for seq, line in self.run.view.plan_rejections if seq > self._told_seq]
        if self.run.view.plan_rejections:
            self._told_seq = self.run.view.plan_rejections[-1][0]
        return fresh[-REJECTIONS_SHOWN:]

    def plan_request(self, kind: str, **fields: Any) -> PlanRequest:
        tree = self.world.tree()
        attempts = fields.get("attempts") or []
        ks = self.config.search.ksearch
        # The first plan may fill every cycle; later ones add a few actions each (K-Search: 3).
        max_actions = fields.pop("max_actions", None) or (
            max(self.config.search.width, ks.max_new_actions, 4) if kind == "initialize_tree" else ks.max_new_actions)
        return plan_request(
            kind, task=self.run.task.definition, tree=tree, hardware=self.evals.hardware,
            language=self.config.search.language, solutions=self._plan_solutions(tree, fields.get("node_id"), attempts),
            seeds=self.evals.seeds(),
            max_actions=max_actions, noise=self._noise_value(), prompt_budget_tokens=self.config.llm.prompt_budget_tokens,
            facts=self.facts(), rejected=self._rejections(),
            profiles={role: p.result for role, p in self.run.view.best_profiles().items()}, **fields,
        )

    def code_request(self, kind: str, **fields: Any) -> CodeRequest:
        reference = self._reference_source() if kind == "generate_from_spec" else ""
        return code_request(
            kind, task=self.run.task.definition, tree=self.world.tree(), hardware=self.evals.hardware,
            language=self.config.search.language, seeds=self.evals.seeds(), noise=self._noise_value(),
            prompt_budget_tokens=self.config.llm.prompt_budget_tokens, facts=self.facts(), reference=reference,
            **fields,
        )

    def _noise_value(self) -> float | None:
        noise = self.evals.noise()
        return noise.value if noise else None

    async def plan(self, request: PlanRequest, *, cycle: str | None = None) -> tuple[PlanReply, ApplyReport | None]:
        best = self.run.view.best
        # The best's profile may be on its way (a cycle that just found it asks the planner to refine now): the
        # planner waits for it, at most one profile's limit, rather than plan without it.
        if best is not None and await self.evals.profiles.of(best.solution_id):
            request.profiles = {role: p.result for role, p in self.run.view.best_profiles().items()}
        reply: PlanReply = await self._policy_call("planner", request.kind, request, cycle)
        for note in reply.notes:
            self.run.say(f"planner ({request.kind}): {note}")
        if reply.error:
            self.run.record(PlanFailed(plan_kind=request.kind, cycle=cycle, error=reply.error, notes=reply.notes))
            self.run.say(f"planner ({request.kind}): no usable reply: {reply.error}")
            return reply, None
        if not reply.ops:
            self.run.record(PlanEmpty(plan_kind=request.kind, cycle=cycle, notes=reply.notes))
            return reply, None
        tag = {"cycle": cycle, "plan_kind": request.kind, "focus": request.node_id, "source": reply.source,
               "notes": reply.notes, "version": request.tree.version}
        # Applied against the version it was written for: an op on something changed since is rejected on
        # its own, and the planner is told in its next call.
        report = await self.world.wm(ApplyOps(ops=reply.ops, system=False, base_version=request.tree.version,
                                        max_new=request.max_actions), tag=tag)
        rejected = report.rejected
        if rejected:
            self.run.say(f"planner ({request.kind}): {len(rejected)} of {len(reply.ops)} ops rejected: "
                         + "; ".join(f"{r.op}: {r.reason}" for r in rejected[:3]))
        return reply, report

    async def generate(self, request: CodeRequest, round_: int, where: Where) -> Attempt | None:
        """Ask the coder for round `round_`'s code and record the candidate (with code, or why none).
        None, and the round given back, when the budget ran out while the provider was failing."""
        reply: CodeReply = await self._policy_call("coder", request.kind, request, where.key)
        failed = error_class(reply.failed_call.error_kind) if reply.failed_call is not None else None
        if failed == "transient":
            self.run.give_back_round(round_)
            return None
        if failed == "rejected":
            self.run.give_back_round(round_)
            raise Refused(f"the provider refused the coder's {request.kind} call "
                          f"{REFUSAL_RETRIES + 1} times: {reply.error or ''}"[:300])
        error = reply.error if reply.solution is None else None
        solution_id = None
        started_from = {s.id for s in (request.current, request.base) if s is not None}
        if reply.solution is not None and reply.solution.id in started_from:
            error = "the reply's code is the code it started from, unchanged: the action was not implemented"
        elif reply.solution is not None and (earlier := self.run.view.verdict(reply.solution.id)) is not None:
            # Content-addressed: the same sources were judged already in this run; measuring them again
            # would spend an evaluation to learn nothing.
            status, message = earlier
            error = (f"the reply's code is identical to solution {reply.solution.id}, already evaluated in this run "
                     f"({status.value}{': ' + clip(message, 200) if message else ''}): not evaluated again")
        elif reply.solution is not None:
            solution_id = self.evals.save_solution(reply.solution)
        elif error is None:
            error = "the coder returned no code"
        self.run.record(Candidate(round=round_, attempt_kind=request.kind, solution_id=solution_id, error=error,
                              reply_start=(reply.reply_start or "")[:REPLY_START_CHARS], **where.fields(), **where.tags))
        attempt = self.run.view.attempt_at(round_, where.cycle)
        assert attempt is not None
        if solution_id is None:
            said = f" (the reply began: {clip(reply.reply_start, 120)!r})" if reply.reply_start else ""
            self.run.say(f"round {round_} ({where.key}, {request.kind}): no code: {clip(error, 160)}{said}")
        return attempt

    def _plan_solutions(self, tree: Tree, node_id: str | None, attempts: list[Any]) -> dict[str, Solution]:
        """The code a plan request carries (`PlanRequest.solutions`): all of the tree's and the attempts' for a
        policy that reads them all, else what the prompt can show (at most four kernels)."""
        if reads_every_plan_solution(self.config.llm):
            ids = {n.solution.solution_id for n in tree.nodes.values() if n.solution}
            if tree.root.solution:
                ids.add(tree.root.solution.solution_id)
            ids |= {a.solution_id for a in attempts if a.solution_id}
        else:
            ids = shown_plan_code(tree, node_id, attempts)
        return {i: self.evals.solution(i) for i in ids if self.store.has_solution(i)}
