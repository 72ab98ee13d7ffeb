"""A search run in plain Python: the event log, budgets, baselines, the seed, the best, the end.

`Search` is the context every search method runs in (`methods.context.SearchContext`) and the only
writer of events.jsonl: `record(event)` appends an event and applies it to the run's read model
(`events.RunView`), the same reducer every reader of the run directory uses. It reaches the world
model, the planner, the coder and the evaluators through small interfaces (`run.backends`), so the
same logic runs in this process (`run.local`) and on Ray (`distributed`).

LLM calls go through `_policy_call`, which decides what a failed call means: the provider's passing
troubles are waited out and asked again (an `outage` event when it begins and ends; no round is spent:
`generate` records a candidate only when the coder answered), errors that never clear stop the run,
and a refused request is asked again twice and then one failed call. Planner ops are applied in
`plan`, against the tree version the request was written for.

The world model is mirrored: every change goes through `wm()`, one typed command at a time (`worldmodel.api`), which
applies it on the backend (the authority: the WorldModelActor on Ray), and records it; the read model applies the same
command with the same pure functions, so reading the tree never crosses a process boundary and a
resumed run rebuilds the exact tree by replay.

Trusting a number (see `measure`): each session measures the baseline on every evaluator and the
kernel it starts from (the seed, in the first session; the best so far, later) beside it, so every
speedup of a session is against numbers measured in that session. A candidate becomes the best only
when it beats the best by more than the measured noise and an independent re-timing agrees. At the
end the best is re-timed against the baseline and the seed, interleaved, within the wall budget,
stopping early once the verdict cannot change; a best that does not beat the seed in every repeat
gives way to the seed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ksearch_ray.config import RunConfig
from ksearch_ray.evaluation.describe import EvaluatorInfo
from ksearch_ray.evaluation.profiling import ProfileResult, kernel_line
from ksearch_ray.evaluation.scoring import speedup
from ksearch_ray.events import (
    Baseline,
    Best,
    Candidate,
    Confirm,
    ConfirmRow,
    Evaluation,
    Event,
    IsolationWarning,
    LlmCallEvent,
    NoStream,
    Outage,
    PlanEmpty,
    PlanFailed,
    PolicyFault,
    Profile,
    ProfilerNote,
    Remeasure,
    Resume,
    Retime,
    RunEnd,
    RunView,
    Seed,
    SeedFailed,
    WmCall,
    WmInit,
)
from ksearch_ray.measure import Noise, Spread, beyond_noise, confirm_verdict, format_noise, with_noise
from ksearch_ray.methods.context import Method, Refused, Where
from ksearch_ray.methods.evidence import eval_summary, workload_times
from ksearch_ray.methods.tuner import autotune
from ksearch_ray.models import EvalResult, Solution
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
)
from ksearch_ray.policies.llm.types import LLMCall, error_class
from ksearch_ray.run.backends import BUILDER, Backends
from ksearch_ray.run.errors import SearchError
from ksearch_ray.run.faults import BUGS_DIR, FAULT_LIMIT, one_line, reply_problem, write_bug_report
from ksearch_ray.run.outcome import EXTEND_FLAG
from ksearch_ray.store import RunStore
from ksearch_ray.taskspec.task import Task, TaskError, solution_from_file
from ksearch_ray.taskspec.tunables import read_tunables
from ksearch_ray.text import clip
from ksearch_ray.worldmodel.api import ApplyOps, Command, R, logged
from ksearch_ray.worldmodel.ops import ApplyReport, AttachSolutionOp, SetBestOp
from ksearch_ray.worldmodel.state import WorldModelState
from ksearch_ray.worldmodel.tree import ROOT_ID, Tree, new_tree

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
PROFILE_MIN_S = 30.0
"""A profile is not started with less wall budget than this left (a TriMul best takes 10 to 15 s on an H200)."""
NOISE_LEAST = 3
"""Baseline measurements a session makes at its start however long they take (`search.noise_repeats` caps them)."""
SEED_REPEATS = 2
"""Measurements of the seed at the start: TriMul's, in the CPU interpreter, takes a minute each."""


class Search:
    def __init__(self, config: RunConfig, task: Task, store: RunStore, backends: Backends, method: Method, *,
                 on_change: Callable[[Search], None] | None = None, on_line: Callable[[str], None] | None = None,
                 budget_change: dict[str, Any] | None = None, clock: Callable[[], float] = time.time,
                 observers: Sequence[Callable[[Event, RunView], None]] = ()):
        self.config = config
        self.task = task
        self.store = store
        self.backends = backends
        self.method = method
        self.on_change = on_change or (lambda _s: None)
        self.on_line = on_line or (lambda _text: None)
        """Hears one line per notable event: phases, evaluations, new bests."""
        self.budget_change = budget_change or {}
        """Budget settings this session changes (`ksearch resume --rounds ...`), logged with `resume`."""
        self.clock = clock
        self.observers = list(observers)
        """Hear each event as it is recorded, after the read model applied it (experiment trackers); never
        the replayed ones."""
        self.view = RunView(solution_exists=store.has_solution)
        self.started = time.monotonic()
        self.phase = "starting"
        self.policy_name = ""
        self.infos: list[EvaluatorInfo] = []
        self.working_on: dict[str, str] = {}  # cycle or lane -> what it does, for the live view
        self.llm_in_flight: dict[int, tuple[str, str, float]] = {}  # call token -> (role, kind, monotonic start)
        self._llm_tokens = 0
        self._outstanding: set[int] = set()  # rounds taken and not yet recorded as candidates
        self._since_baseline: dict[int, float] = {}  # evaluator -> its seconds on other kernels since its last baseline
        self._baselines_made: dict[int, int] = {}  # evaluator -> its baseline measurements this session (noise only)
        self._round_lock = asyncio.Lock()
        self._seed_solutions: dict[str, Solution] | None = None
        self._solutions: dict[str, Solution] = {}
        self.wm_s = 0.0  # time spent on world-model calls (backend and mirror)
        self.pool = backends.evaluators
        self.world_model: Any = None
        self.mirror: WorldModelState | None = None
        self.evaluations_before = 0  # candidate evaluations of earlier sessions (the live view's rate is this session's)
        self._wm_lock = asyncio.Lock()  # one world-model call at a time: the actor, the mirror and the log agree on order
        self._facts: Facts | None = None
        self._told_seq = 0  # planner rejections up to this event were already shown to the planner
        self.outage_since: float | None = None  # monotonic start of the provider's current outage
        self._outage_failures = 0
        self._outage_error = ""
        self._rejected_in_a_row = 0
        self._faults_in_a_row: dict[str, int] = {}  # role -> policy faults in a row (run.faults)
        self._profiling: dict[str, asyncio.Task[None]] = {}  # solution id -> its profile in flight (between measurements)

    # --- the log ---------------------------------------------------------------------------------

    def record(self, event: Event) -> Event:
        """Append to events.jsonl, then apply to the read model and the method: the one way state changes."""
        self.store.append(event)
        self.view.apply(event)
        self.method.observe(event)
        for observer in self.observers:
            observer(event, self.view)
        if isinstance(event, Candidate):
            self._outstanding.discard(event.round)
        self.on_change(self)
        return event

    def say(self, text: str) -> None:
        self.on_line(text)

    def working(self, key: str, text: str | None) -> None:
        if text is None:
            self.working_on.pop(key, None)
        else:
            self.working_on[key] = text
        self.on_change(self)

    def set_phase(self, text: str) -> None:
        """What the run is doing now, for the live view and as a line in logs."""
        self.phase = text
        self.on_line(text)
        self.on_change(self)

    def now(self) -> float:
        return self.clock()

    @property
    def hardware(self) -> str:
        return self.infos[0].hardware if self.infos else ""

    @property
    def gpu_of(self) -> list[str]:
        return [info.name for info in self.infos]

    # --- set-up ------------------------------------------------------------------------------------

    async def setup(self) -> None:
        for event in self.store.read_events():
            self.view.apply(event)
            self.method.observe(event)
        self.evaluations_before = self.view.evaluations
        self.set_phase("starting evaluators")
        self.infos = await self.pool.describe_all()
        self.policy_name = await self.backends.planner.name()
        self.on_line(f"planner and coder: {self.policy_name}; evaluators: {len(self.infos)} on {self.hardware}")
        self.on_line(self.objective_line())
        tree = self.view.tree
        if tree is None:
            self.record(WmInit(tree=new_tree(self.task.name, self.task.definition.description)))
        else:
            self.record(Resume(open_cycles=[c.cycle_id for c in self.view.open_cycles], budget=self.budget_change))
        for index, info in enumerate(self.infos):
            for warning in info.isolation_warnings:
                self.on_line(f"WARNING: evaluator {index}: {warning}")
                self.record(IsolationWarning(evaluator=index, warning=warning))
        if self.config.evaluation.profile.bests:
            self._note_profiler()
        assert self.view.tree is not None
        self.mirror = WorldModelState(self.view.tree, self.store.has_solution)
        self.world_model = self.backends.world_model(self.view.tree)

    # --- the world model ------------------------------------------------------------------------------

    async def wm(self, command: Command[R], *, tag: dict[str, Any] | None = None) -> R:
        async with self._wm_lock:
            t0 = time.monotonic()
            result = await self.world_model.run(command)
            assert self.mirror is not None
            mirrored = self.mirror.run(command)
            if mirrored != result:  # both applied the same pure function to the same tree
                raise SearchError(f"the world-model replica disagrees with its actor after {command.call}; "
                                  "the run log is the truth")
            self.wm_s += time.monotonic() - t0
            self.record(WmCall(command=logged(command), **(tag or {})))
            return result

    def tree(self) -> Tree:
        assert self.view.tree is not None
        return self.view.tree

    # --- LLM calls -----------------------------------------------------------------------------------

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
                self.record(LlmCallEvent(role=role, cycle=cycle, call=call))
                if call.stream_fallback and call.error is None and self.view.no_stream is None:
                    self.record(NoStream(reason=call.stream_fallback))
                    self.on_line(f"the LLM endpoint does not stream ({clip(call.stream_fallback, 160)}): asking "
                                 "without streaming from now on")
                if call.error is None and call.attempts > 1 and not call.stream_fallback:  # details: the run's logs
                    self.on_line(f"{role} {call.kind}: answered after {call.attempts} attempts")
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
                self.on_line(f"the LLM endpoint answers, but the {role}'s {kind} reply could not be read "
                             f"({clip(failed.error or '', 160)})")
                return reply
            if what == "fatal":
                # A rejected key, an unknown model: every further call would fail the same way, so stop
                # now instead of spending the budget on failures.
                raise SearchError(f"the {role}'s LLM call failed and retrying cannot fix it: {failed.error}")
            if what == "rejected":
                refusals += 1
                if refusals <= REFUSAL_RETRIES:
                    self.on_line(f"the provider refused the {role}'s {kind} call ({(failed.error or '')[:160]}); "
                                 "asking again (no round is spent on it)")
                    await self._visible_sleep(role, kind, self.config.llm.backoff_base_s)
                    continue
                self._rejected_in_a_row += 1
                if self._rejected_in_a_row >= REJECTED_LIMIT:
                    raise SearchError(f"the provider refused {self._rejected_in_a_row} calls in a row; the last: "
                                      f"{failed.error}")
                return reply
            wait = self._outage_wait(failed)
            if self._spend_left() is not None:
                return reply  # the budget ran out while the provider was failing: the caller gives its round back
            await self._visible_sleep(role, kind, wait)

    def _policy_fault(self, role: str, kind: str, request: Any, cycle: str | None, error: str,
                      exc: BaseException | None) -> None:
        """A policy that raised or replied out of contract: an event and a bug report; SearchError (the run
        stops, resumable) once this role has faulted FAULT_LIMIT times in a row."""
        in_a_row = self._faults_in_a_row.get(role, 0) + 1
        self._faults_in_a_row[role] = in_a_row
        report = write_bug_report(self.store.root, len(self.view.policy_faults) + 1, role=role, kind=kind, cycle=cycle,
                                  policy=self.policy_name, error=error, exc=exc, request=request)
        log.warning("the %s's %s call failed with its own bug (%s); report: %s", role, kind, error, report)
        self.record(PolicyFault(role=role, call_kind=kind, cycle=cycle, error=error, report=report, in_a_row=in_a_row))
        self.on_line(f"the {role}'s {kind} call broke the policy contract ({clip(error, 160)}); bug report: "
                     f"{self.store.root / report}; asking again (no round is spent on it)")
        if in_a_row >= FAULT_LIMIT:
            raise SearchError(f"the {role} broke the policy contract {in_a_row} times in a row (last: {error}); "
                              f"bug reports in {self.store.root / BUGS_DIR}")

    async def _ask_backend(self, role: str, kind: str, request: Any) -> Any:
        backend = self.backends.planner if role == "planner" else self.backends.coder
        self._llm_tokens += 1
        token = self._llm_tokens
        self.llm_in_flight[token] = (role, kind, time.monotonic())
        self.on_change(self)
        try:
            return await (backend.plan(request) if role == "planner" else backend.code(request))
        finally:
            self.llm_in_flight.pop(token, None)

    async def _visible_sleep(self, role: str, kind: str, seconds: float) -> None:
        """Wait before asking again, shown in the live view as what this call waits for."""
        self._llm_tokens += 1
        token = self._llm_tokens
        self.llm_in_flight[token] = (role, f"{kind}: retry after the provider failed", time.monotonic())
        self.on_change(self)
        try:
            await asyncio.sleep(seconds)
        finally:
            self.llm_in_flight.pop(token, None)

    def _outage_wait(self, failed: LLMCall) -> float:
        """Note one more failure of an outage (starting it, on the first); how long to wait before asking
        again. SearchError once the outage has lasted longer than its allowance."""
        llm = self.config.llm
        now = time.monotonic()
        self._outage_error = failed.error or failed.error_kind or "?"
        if self.outage_since is None:
            self.outage_since = now
            self._outage_failures = 0
            self.record(Outage(state="began", error=self._outage_error))
            self.on_line(f"the LLM provider is failing ({self._outage_error[:160]}): the endpoint is down or "
                         f"overloaded; waiting and asking again, for up to {llm.outage_s:g} s; no round is spent on it")
        self._outage_failures += 1
        lasted = now - self.outage_since
        if lasted >= llm.outage_s:
            self.record(Outage(state="gave_up", error=self._outage_error, failed_calls=self._outage_failures,
                               waited_s=lasted))
            raise SearchError(f"the LLM provider kept failing for {lasted:.0f} s, longer than the outage allowance "
                              f"(--outage-s {llm.outage_s:g}); last error: {self._outage_error[:200]}")
        backoff = min(llm.backoff_max_s, llm.backoff_base_s * 2 ** min(self._outage_failures - 1, 16))
        if failed.retry_after_s is not None:
            backoff = max(backoff, min(failed.retry_after_s, llm.backoff_max_s))
        return max(min(backoff, llm.outage_s - lasted), 0.0)

    def _provider_answered(self) -> None:
        if self.outage_since is None:
            return
        lasted = time.monotonic() - self.outage_since
        self.record(Outage(state="ended", error=self._outage_error, failed_calls=self._outage_failures, waited_s=lasted))
        self.on_line(f"the LLM provider answers again, after {lasted:.0f} s and {self._outage_failures} failed call(s)")
        self.outage_since = None

    def objective_line(self) -> str:
        """Which figure scores the search (kernel or call), and why: one of the run's first lines."""
        rule = self.task.definition.objective
        chosen = self.config.evaluation.objective
        objective = chosen or rule.timed
        why = "set by --objective / evaluation.objective" if chosen else f"the task's rule: {rule.source or 'the default'}"
        cpu = "; on the CPU there is no graph replay: the call figure is the only one" \
            if (self.config.evaluation.device or "cpu") == "cpu" else ""
        return f"objective: {objective} ({why}){cpu}"

    # --- what prompts say ---------------------------------------------------------------------------

    def facts(self) -> Facts:
        """The device, the timing method and every scored workload's shapes and least work: once a session."""
        if self._facts is None:
            device = self.config.evaluation.device or "cpu"
            shapes = []
            for workload in self.task.workloads(self.workload_set, device):
                try:
                    cost = self.task.workload_cost(workload)
                except TaskError:
                    cost = None
                shapes.append(WorkloadShape(name=workload.name, axes=dict(workload.axes), params=dict(workload.params),
                                            flops=cost[0] if cost else None, bytes=cost[1] if cost else None))
            mode = self.config.evaluation.mode
            self._facts = Facts(device=self.infos[0] if self.infos else None,
                                workload_set=self.task.workload_set_name(self.workload_set, device), workloads=shapes,
                                timing_rule=self.config.evaluation.timing_for(device).rule(
                                    device, mode, objective=self.config.evaluation.objective or self.task.definition.objective.timed,
                                    flush_l2=self.task.definition.objective.flush_l2),
                                fresh_inputs=mode == "fresh")
        return self._facts

    def _reference_source(self) -> str:
        path = self.task.root / "reference.py"
        return path.read_text(encoding="utf-8") if path.is_file() else ""

    def _rejections(self) -> list[str]:
        """Planner edits not applied since the planner was last told, for its next prompt."""
        fresh = [line for seq, line in self.view.plan_rejections if seq > self._told_seq]
        if self.view.plan_rejections:
            self._told_seq = self.view.plan_rejections[-1][0]
        return fresh[-REJECTIONS_SHOWN:]

    def plan_request(self, kind: str, **fields: Any) -> PlanRequest:
        tree = self.tree()
        attempts = fields.get("attempts") or []
        ks = self.config.search.ksearch
        # The first plan may fill every cycle; later ones add a few actions each (K-Search: 3).
        max_actions = fields.pop("max_actions", None) or (
            max(self.config.search.width, ks.max_new_actions, 4) if kind == "initialize_tree" else ks.max_new_actions)
        return plan_request(
            kind, task=self.task.definition, tree=tree, hardware=self.hardware,
            language=self.config.search.language, solutions=self._tree_solutions(tree, attempts), seeds=self.seeds(),
            max_actions=max_actions, noise=self._noise_value(), prompt_budget_tokens=self.config.llm.prompt_budget_tokens,
            facts=self.facts(), rejected=self._rejections(),
            profiles={role: p.result for role, p in self.view.best_profiles().items()}, **fields,
        )

    def code_request(self, kind: str, **fields: Any) -> CodeRequest:
        reference = self._reference_source() if kind == "generate_from_spec" else ""
        return code_request(
            kind, task=self.task.definition, tree=self.tree(), hardware=self.hardware,
            language=self.config.search.language, seeds=self.seeds(), noise=self._noise_value(),
            prompt_budget_tokens=self.config.llm.prompt_budget_tokens, facts=self.facts(), reference=reference,
            **fields,
        )

    def _noise_value(self) -> float | None:
        noise = self.noise()
        return noise.value if noise else None

    async def plan(self, request: PlanRequest, *, cycle: str | None = None) -> tuple[PlanReply, ApplyReport | None]:
        best = self.view.best
        if best is not None and best.solution_id in self._profiling:
            # The best's profile is on its way (a cycle that just found it asks the planner to refine now): the planner
            # waits for it, at most one profile's limit, rather than plan without it.
            await asyncio.shield(self._profiling[best.solution_id])
            request.profiles = {role: p.result for role, p in self.view.best_profiles().items()}
        reply: PlanReply = await self._policy_call("planner", request.kind, request, cycle)
        for note in reply.notes:
            self.on_line(f"planner ({request.kind}): {note}")
        if reply.error:
            self.record(PlanFailed(plan_kind=request.kind, cycle=cycle, error=reply.error, notes=reply.notes))
            self.on_line(f"planner ({request.kind}): no usable reply: {reply.error}")
            return reply, None
        if not reply.ops:
            self.record(PlanEmpty(plan_kind=request.kind, cycle=cycle, notes=reply.notes))
            return reply, None
        tag = {"cycle": cycle, "plan_kind": request.kind, "focus": request.node_id, "source": reply.source,
               "notes": reply.notes, "version": request.tree.version}
        # Applied against the version it was written for: an op on something changed since is rejected on
        # its own, and the planner is told in its next call.
        report = await self.wm(ApplyOps(ops=reply.ops, system=False, base_version=request.tree.version,
                                        max_new=request.max_actions), tag=tag)
        rejected = report.rejected
        if rejected:
            self.on_line(f"planner ({request.kind}): {len(rejected)} of {len(reply.ops)} ops rejected: "
                         + "; ".join(f"{r.op}: {r.reason}" for r in rejected[:3]))
        return reply, report

    async def generate(self, request: CodeRequest, round_: int, where: Where) -> Attempt | None:
        """Ask the coder for round `round_`'s code and record the candidate (with code, or why none).
        None, and the round given back, when the budget ran out while the provider was failing."""
        reply: CodeReply = await self._policy_call("coder", request.kind, request, where.key)
        failed = error_class(reply.failed_call.error_kind) if reply.failed_call is not None else None
        if failed == "transient":
            self.give_back_round(round_)
            return None
        if failed == "rejected":
            self.give_back_round(round_)
            raise Refused(f"the provider refused the coder's {request.kind} call "
                          f"{REFUSAL_RETRIES + 1} times: {reply.error or ''}"[:300])
        error = reply.error if reply.solution is None else None
        solution_id = None
        started_from = {s.id for s in (request.current, request.base) if s is not None}
        if reply.solution is not None and reply.solution.id in started_from:
            error = "the reply's code is the code it started from, unchanged: the action was not implemented"
        elif reply.solution is not None and (earlier := self.view.results.get(reply.solution.id)) is not None:
            # Content-addressed: the same sources were judged already in this run; measuring them again
            # would spend an evaluation to learn nothing.
            error = (f"the reply's code is identical to solution {reply.solution.id}, already evaluated in this run "
                     f"({earlier.status.value}{': ' + clip(earlier.message, 200) if earlier.message else ''}): "
                     "not evaluated again")
        elif reply.solution is not None:
            solution_id = self.store.save_solution(reply.solution)
            self._solutions[solution_id] = reply.solution
        elif error is None:
            error = "the coder returned no code"
        self.record(Candidate(round=round_, attempt_kind=request.kind, solution_id=solution_id, error=error,
                              reply_start=(reply.reply_start or "")[:REPLY_START_CHARS], **where.fields(), **where.tags))
        attempt = self.view.attempt_at(round_, where.cycle)
        assert attempt is not None
        if solution_id is None:
            said = f" (the reply began: {clip(reply.reply_start, 120)!r})" if reply.reply_start else ""
            self.on_line(f"round {round_} ({where.key}, {request.kind}): no code: {clip(error, 160)}{said}")
        return attempt

    # --- solutions ------------------------------------------------------------------------------------

    def solution(self, solution_id: str) -> Solution:
        if solution_id not in self._solutions:
            self._solutions[solution_id] = self.store.load_solution(solution_id)
        return self._solutions[solution_id]

    def save_solution(self, solution: Solution) -> str:
        self._solutions[solution.id] = solution
        return self.store.save_solution(solution)

    def _tree_solutions(self, tree: Tree, attempts: list[Any]) -> dict[str, Solution]:
        ids = {n.solution.solution_id for n in tree.nodes.values() if n.solution}
        if tree.root.solution:
            ids.add(tree.root.solution.solution_id)
        ids |= {a.solution_id for a in attempts if a.solution_id}
        return {i: self.solution(i) for i in ids if self.store.has_solution(i)}

    def seeds(self) -> dict[str, Solution]:
        """The task's seed kernels (those declaring tunables) and its baseline; read once."""
        if self._seed_solutions is None:
            self._seed_solutions = {}
            for name in self.task.solution_names():
                sol = self.task.solution(name)
                if any(read_tunables(text) for text in sol.sources.values()) or name == self.task.definition.baseline:
                    self._seed_solutions[name] = sol
        return self._seed_solutions

    # --- evaluation -------------------------------------------------------------------------------------

    @property
    def workload_set(self) -> str:
        return self.config.evaluation.workloads or self.task.definition.default_workloads

    async def measure(self, solution: Solution) -> tuple[EvalResult, int, float | None]:
        """A verdict from whichever evaluator is free, which one it was, and the speedup (None unless it passed)."""
        result, evaluator = await self.pool.evaluate(solution, self.workload_set)
        await self._baseline_now_and_then(evaluator, result.seconds)
        return result, evaluator, self.speedup_of(result, evaluator) if result.passed else None

    async def _baseline_now_and_then(self, evaluator: int, seconds: float) -> None:
        """Make up the baseline measurements the session's start left out for its time budget: until the
        evaluator has measured the baseline `search.noise_repeats` times this session, measure it again
        once it has spent (1 - share) / share times the baseline's own time on other kernels since it last
        did (`search.noise_share`). An evaluator whose start made them all spends nothing here: every
        second of it goes to candidates (issue 40's candidates per GPU-hour; docs/architecture.md)."""
        share = self.config.search.noise_share
        base = self.view.session_baselines.get(evaluator)
        if share <= 0 or evaluator == BUILDER or base is None or base.seconds <= 0:
            return
        if self._baselines_made.get(evaluator, 0) >= self.config.search.noise_repeats:
            return
        since = self._since_baseline.get(evaluator, 0.0) + seconds
        if since < base.seconds * (1.0 - share) / share:
            self._since_baseline[evaluator] = since
            return
        self._since_baseline[evaluator] = 0.0
        baseline = self.task.baseline()
        try:
            again = await self.pool.evaluate_on(evaluator, baseline, self.workload_set)
        except SearchError as exc:  # the evaluator was lost meanwhile: the kernel just measured must not be lost too
            self.on_line(f"WARNING: the baseline could not be measured again for the noise on evaluator {evaluator} "
                         f"({clip(str(exc), 160)}); the search goes on")
            return
        self.record(Remeasure(role="baseline", solution_id=baseline.id, evaluator=evaluator, gpu=self.gpu_of[evaluator],
                              result=again))
        self._baselines_made[evaluator] = self._baselines_made.get(evaluator, 0) + 1
        if not again.passed:
            self.on_line(f"WARNING: the baseline, measured again for the noise on evaluator {evaluator}, "
                         f"{again.status.value}: {clip(again.message, 160)}")

    async def evaluate(self, attempt: Attempt, where: Where) -> None:
        """The one place a candidate is evaluated and recorded: measure, record, tune, note a new best."""
        assert attempt.solution_id is not None
        result, evaluator, value = await self.measure(self.solution(attempt.solution_id))
        self.record(Evaluation(round=attempt.round, evaluator=evaluator, gpu=self.gpu_name(evaluator),
                               solution_id=attempt.solution_id, result=result, speedup=value, **where.fields()))
        shown = with_noise(value, self.noise(evaluator)) if result.passed else clip(result.message, 160)
        self.on_line(f"round {attempt.round} ({where.key}, {attempt.kind}): {result.status.value} {shown}")
        await autotune(self, attempt, where)
        if attempt.solution_id is not None and attempt.evaluator is not None:
            await self.note_best(attempt.solution_id, attempt.speedup, where.node or where.method or "", attempt.round,
                                 attempt.evaluator)

    def speedup_of(self, result: EvalResult, evaluator: int) -> float | None:
        """Against the baseline measured this session on the same evaluator (so the same GPU)."""
        if evaluator == BUILDER:  # a compile error from a CPU build task: no GPU measured it
            return None
        base = self.view.session_baselines.get(evaluator)
        return speedup(self.task.definition, base, result) if base is not None else None

    def gpu_name(self, evaluator: int) -> str | None:
        return None if evaluator == BUILDER else self.gpu_of[evaluator]

    def noise(self, evaluator: int | None = None) -> Noise | None:
        """How far repeated measurements of one kernel disagree this session, on this evaluator's GPU type."""
        if not self.infos:
            return None
        gpu = self.gpu_name(evaluator if evaluator is not None and evaluator != BUILDER else 0)
        return self.view.noise(gpu)

    def baseline_for(self, evaluator: int | None) -> EvalResult | None:
        baselines = self.view.session_baselines
        return baselines.get(evaluator if evaluator is not None else 0) or baselines.get(0)

    # --- the best -----------------------------------------------------------------------------------------

    async def note_best(self, solution_id: str, value: float | None, node: str, round_: int, evaluator: int) -> None:
        """A candidate becomes the best only beyond the noise and once an independent re-timing agrees."""
        gpu = self.gpu_name(evaluator)
        if value is None or gpu is None:
            return
        current = self.view.best_by_gpu.get(gpu)
        if current is not None:
            if value <= current.speedup:
                return
            noise = self.noise(evaluator)
            if not beyond_noise(value, current.speedup, noise):
                self.on_line(f"round {round_}: {with_noise(value, noise)} is within the noise of the best "
                             f"({current.speedup:.3g}x): a candidate, not a new best")
                return
        if self.config.search.retime_best and not await self._confirmed_by_retiming(solution_id, evaluator):
            return
        self._set_best(Best(solution_id=solution_id, speedup=value, node=node, round=round_, gpu=gpu))
        self.on_line(f"new best: {with_noise(value, self.noise(evaluator))} over the baseline ({node}, round {round_})")
        result = self.view.results.get(solution_id)
        if result is not None and self.view.best is not None and self.view.best.solution_id == solution_id:
            times = workload_times(result, None, self.baseline_for(evaluator))
            await self.wm(ApplyOps(ops=[SetBestOp(
                op="set_best", solution_id=solution_id, speedup=value,
                time_ms={t.workload: t.ms for t in times},
                baseline_ms={t.workload: t.baseline_ms for t in times if t.baseline_ms is not None},
            )]))

    def _set_best(self, best: Best) -> None:
        """Record a best and, when it is the run's best, write best.json and best/."""
        self.record(best)
        self._profile_later(best)
        run_best = self.view.best
        if run_best is None or run_best.solution_id != best.solution_id or run_best.gpu != best.gpu:
            return  # a better kernel on another GPU type stays the run's best
        solution = self.solution(best.solution_id)
        payload = {**best.model_dump(mode="json", exclude={"kind"}), "policy": self.policy_name,
                   "solution": solution.model_dump(mode="json")}
        self.store.write_best(payload, solution)

    async def _confirmed_by_retiming(self, solution_id: str, evaluator: int) -> bool:
        """A new best is believed only once a second, independent measurement in a fresh sandbox
        agrees with the first (evaluation/retime.py): a kernel that fooled one clock must fool two."""
        primary = self.view.results.get(solution_id)
        if primary is None:
            return True
        check = await self.pool.retime_on(evaluator, self.solution(solution_id), primary)
        self.record(Retime(solution_id=solution_id, evaluator=evaluator, agreed=check.agreed, status=check.status,
                           message=check.message, workloads=[w.model_dump(mode="json") for w in check.workloads]))
        if not check.agreed:
            self.on_line(f"not recorded as a best: the independent re-timing disagrees ({clip(check.message, 200)})")
        return check.agreed

    # --- profiles of the bests (--profile-bests) ---------------------------------------------------------

    def _note_profiler(self) -> None:
        """Say in one line which profiler the evaluators have, or why none can profile (the run goes on)."""
        able = [i for i, info in enumerate(self.infos) if info.profiler]
        if able:
            tool = self.infos[able[0]].profiler
            self.record(ProfilerNote(tool=tool, evaluators=able))
            self.on_line(f"profiling each new best once with {tool} (evaluators {', '.join(map(str, able))}), "
                         "outside the timed measurements")
            return
        problem = next((info.profiler_problem for info in self.infos if info.profiler_problem), None) \
            or "no evaluator reported a profiler"
        self.record(ProfilerNote(problem=problem))
        self.on_line(f"profiling (--profile-bests): {problem}; the run goes on without profiles")

    def _profile_later(self, best: Best) -> None:
        """Profile a new best once (per GPU type), beside the search: the evaluator takes it between
        measurements, never inside one."""
        note = self.view.profiler
        if not self.config.evaluation.profile.bests or note is None or not note.evaluators:
            return
        if (best.solution_id, best.gpu) in self.view.profiles:
            return  # profiled already (the seed given back, a best re-measured in a later session)
        index = next((i for i in note.evaluators if i < len(self.infos) and self.infos[i].name == best.gpu), None)
        measured = self.view.results.get(best.solution_id)
        if index is None or measured is None:
            return
        limit = self.config.evaluation.profile.limit_s
        left = self._wall_left()
        if left is not None:  # within the wall budget, beside the room kept for the final re-timing
            limit = min(limit, left - self.confirm_estimate_s())
            if limit < PROFILE_MIN_S:
                self.on_line(f"not profiling the best {best.solution_id}: the wall budget leaves {max(limit, 0):.0f} s")
                return
        task = asyncio.get_running_loop().create_task(self._profile(best, index, measured, limit))
        self._profiling[best.solution_id] = task
        solution_id = best.solution_id

        def done(_task: asyncio.Task[None]) -> None:
            self._profiling.pop(solution_id, None)
        task.add_done_callback(done)

    async def _profile(self, best: Best, index: int, measured: EvalResult, limit_s: float) -> None:
        key = f"profile {best.solution_id}"
        self.working(key, f"profiling the best {best.solution_id} with Nsight Compute")
        try:
            result = await self.pool.profile_on(index, self.solution(best.solution_id), measured, limit_s)
        except SearchError as exc:  # the evaluator was lost meanwhile: a profile is evidence, the search goes on
            result = ProfileResult(status="failed", solution_id=best.solution_id, workload="",
                                   message=f"its evaluator failed: {clip(str(exc), 200)}")
        finally:
            self.working(key, None)
        self.record(Profile(solution_id=best.solution_id, evaluator=index, gpu=best.gpu, result=result))
        if result.ok and result.kernels:
            top = result.kernels[0]
            self.on_line(f"profiled the best {best.solution_id} on {result.workload} in {result.seconds:.0f} s: "
                         f"{result.kernel_count} kernel(s); the slowest: {kernel_line(top, result.kernels_ms)}")
        else:
            self.on_line(f"WARNING: profiling the best {best.solution_id} {result.status}: {result.message}; "
                         "the search goes on")

    async def _profiles_done(self) -> None:
        """Wait for the profiles in flight (before the planner's first call, and before the final re-timing)."""
        while self._profiling:
            await asyncio.gather(*list(self._profiling.values()))

    # --- budgets ------------------------------------------------------------------------------------------

    def wall_s(self) -> float:
        """Active running time of the whole run: the log's, plus the time since its last event."""
        last = self.view.last_t
        return self.view.active_s + (max(0.0, time.time() - last) if last is not None else 0.0)

    def budget_left(self) -> str | None:
        """None while the budget lasts, else why it ran out. Spend is counted from the event log."""
        if self.view.rounds_used + len(self._outstanding) >= self.config.budget.rounds:
            return "rounds"
        return self._spend_left()

    def _spend_left(self) -> str | None:
        """The budget without the rounds (a call that holds a round waits on these alone)."""
        b, v = self.config.budget, self.view
        if b.max_cost_usd is not None and v.llm_cost_usd >= b.max_cost_usd:
            return "cost"
        if b.max_llm_tokens is not None and v.llm_tokens >= b.max_llm_tokens:
            return "tokens"
        if b.max_wall_s is not None and self.wall_s() + self.confirm_reserve_s() >= b.max_wall_s:
            return "wall clock"
        return None

    def confirm_reserve_s(self) -> float:
        """The wall time the method leaves for the final re-timing when the run has a wall budget."""
        return self.confirm_estimate_s() if self.config.budget.max_wall_s is not None else 0.0

    def confirm_estimate_s(self) -> float:
        """The wall time the final re-timing will need, from this session's measurements, and room for
        one candidate in flight when the method stops (its evaluation and re-timing): the method's wall
        budget ends this much early, so the re-timing fits in the run's."""
        repeats = self.config.search.confirm_repeats
        if repeats <= 0:
            return 0.0
        seed = self.view.seed.solution_id if self.view.seed else None
        total = 0.0
        for gpu, best in self.view.best_by_gpu.items():
            if gpu not in self.gpu_of:
                continue
            base = self.view.session_baselines.get(self.gpu_of.index(gpu))
            kernels = {best.solution_id, seed} - {None}
            seconds = [r.seconds for k in kernels if (r := self.view.results.get(k or "")) is not None]
            total += repeats * ((base.seconds if base else 0.0) + sum(seconds)) + 2 * max(seconds, default=0.0)
        return total

    async def take_round(self) -> int | None:
        async with self._round_lock:
            if self.budget_left():
                return None
            number = 1
            while number in self.view.candidates or number in self._outstanding:
                number += 1
            self._outstanding.add(number)
            return number

    def give_back_round(self, round_: int) -> None:
        """A round taken and not spent (the call failed for the provider's reasons): it goes back to the budget."""
        self._outstanding.discard(round_)

    # --- the run --------------------------------------------------------------------------------------------

    async def run(self) -> RunView:
        try:
            await self.setup()
            await self._measure_baselines()  # also a check, on resume, that the sandbox still works
            if self.view.seed is None:
                await self._seed()
            elif self.view.session > 0:
                await self._remeasure_best()
            await self._profiles_done()  # the first plan is made with the starting kernel's profile
            self._say_estimate()
            spent = self.budget_left()
            if spent:
                self.on_line(f"the run's budget is spent ({spent}); `ksearch resume {self.store.root} "
                             f"{EXTEND_FLAG[spent]}` extends it")
            reason = await self.method.run(self)
            await self._profiles_done()
            await self._confirm()
            await self._profiles_done()  # a best given back to the seed is profiled already; anything else, now
            best = self.view.best
            self.record(RunEnd(
                reason=reason, rounds=self.view.rounds_used, best=best.model_dump(mode="json") if best else None,
                session_wall_s=time.monotonic() - self.started, wm_s=self.wm_s,
                evaluator_busy_s={str(k): v for k, v in sorted(self.pool.busy_s.items())},
            ))
            return self.view
        finally:
            for task in list(self._profiling.values()):
                task.cancel()
            self.release()

    def _say_estimate(self) -> None:
        """How long the rest of the budget will take here, from this session's measurements."""
        measured = [r.seconds for r in (*self.view.session_baselines.values(),
                                        *(self.view.results.get(b.solution_id) for b in self.view.best_by_gpu.values()))
                    if r is not None and r.seconds > 0]
        rounds = self.config.budget.rounds - self.view.rounds_used
        if not measured or rounds <= 0:
            return
        each = max(measured)
        lanes = max(1, min(self.config.search.width, self.pool.size))
        total = rounds * each / lanes + self.confirm_estimate_s()
        hours = total / 3600
        said = f"{total / 60:.0f} min" if hours < 2 else f"{hours:.1f} h"
        self.on_line(f"one evaluation takes about {each:.0f} s here: {rounds} more round(s) at width "
                     f"{self.config.search.width} on {self.pool.size} evaluator(s) and the final re-timing take about "
                     f"{said} of evaluations (LLM time not counted; --rounds, --max-wall-s or a smaller --workloads "
                     "set shorten it)")

    def release(self) -> None:
        """Give back what the backends hold (Ray actors, GPUs, sandboxes), however the session ends: a
        driver that lives on (a notebook, a test suite, an experiment) must not keep a finished run's GPUs."""
        for backend in (self.world_model, self.backends.planner, self.backends.coder, self.pool):
            if backend is not None:
                backend.release()

    async def _measure_baselines(self) -> None:
        """Every evaluator measures the baseline on its own GPU, each session; more than once the
        first time, so the run knows its measurement noise from the start."""
        solution = self.task.baseline()
        self.store.save_solution(solution)
        # Every session, a resumed one too: after one warm-up that is not recorded (a fresh sandbox's first
        # measurement ran 2-11x slow on CPUs: imports, caches, clocks), `noise_repeats` measurements, or fewer
        # (at least NOISE_LEAST) once they have taken `noise_budget_s`: a noise figure that a second run
        # reproduces within a factor of two needs two dozen, cheap where the baseline is fast.
        most, budget_s = self.config.search.noise_repeats, self.config.search.noise_budget_s
        least = min(most, NOISE_LEAST)
        self.set_phase(f"measuring the baseline on {self.pool.size} evaluator(s), after a warm-up"
                       + (f", {least}-{most}x each (up to {budget_s:.0f} s)" if most > least else
                          f", {most}x each" if most > 1 else ""))

        async def on(index: int) -> None:
            if self.config.search.warmup:
                warm = await self.pool.evaluate_on(index, solution, self.workload_set)
                log.info("evaluator %d warmed up on the baseline: %s, score %s", index, warm.status.value, warm.score)
            spent_s = 0.0
            for repeat in range(most):
                if repeat >= least and spent_s + spent_s / repeat > budget_s:
                    break  # the next one, as long as those so far took on average, would overrun the budget
                result = await self.pool.evaluate_on(index, solution, self.workload_set)
                spent_s += result.seconds
                if not result.passed:
                    raise SearchError(f"the task's baseline does not pass on evaluator {index} ({self.gpu_of[index]}): "
                                      f"{result.status.value}: {result.message}")
                self.record(Baseline(solution_id=solution.id, evaluator=index, gpu=self.gpu_of[index], result=result))
                self._baselines_made[index] = self._baselines_made.get(index, 0) + 1

        began = time.monotonic()
        await asyncio.gather(*(on(i) for i in range(self.pool.size)))
        base = self.view.session_baselines[0]
        made = sorted(set(self._baselines_made.values()))
        times = f"{made[0]}x" if len(made) == 1 else f"{made[0]}-{made[-1]}x"
        self.on_line((f"baseline: {base.score:.4g} ({base.score_kind})" if base.score is not None else "baseline passed")
                     + f"; measured {times} on each of {self.pool.size} evaluator(s)"
                     + (" after a warm-up" if self.config.search.warmup else "")
                     + f" in {time.monotonic() - began:.1f} s")

    def _start_solution(self) -> Solution | None:
        """What the run starts from: --from-solution, else (unless it starts from the specification) the
        task's seed in the language searched: its default_seed where that is in the language, else the
        first seed by name in it, else the first seed by name."""
        name = self.config.search.from_solution
        if name is None:
            if self.config.search.start == "spec":
                return None
            choices = {n: s for n, s in self.seeds().items() if n != self.task.definition.baseline}
            preferred = self.task.definition.default_seed
            if preferred is not None:
                choices.setdefault(preferred, self.task.solution(preferred))
            # name order, then the default seed first, then the language searched first (stable sorts)
            seeds = sorted(choices, key=lambda n: n != preferred)
            seeds.sort(key=lambda n: choices[n].language != self.config.search.language)
            if not seeds:
                return None
            name = seeds[0]
        if name in self.task.solution_names():
            return self.task.solution(name)
        return solution_from_file(Path(name), self.task)

    async def _seed(self) -> None:
        """Evaluate the starting solution beside the baseline, attach it to the root, make it the first best."""
        solution = self._start_solution()
        if solution is None:
            self.record(Seed(solution_id=None, start="spec"))
            self.on_line("starting from the specification: no seed kernel (the first kernel is written from the task)")
            return
        self.store.save_solution(solution)
        self.set_phase(f"evaluating the seed {solution.name}")
        result, evaluator, value = await self.measure(solution)
        if not result.passed:
            self.record(SeedFailed(solution_id=solution.id, result=result))
            raise SearchError(f"the starting solution {solution.name} does not pass: {result.status.value}: {result.message}")
        gpu = self.gpu_of[evaluator]
        self.record(Seed(solution_id=solution.id, result=result, speedup=value, evaluator=evaluator, gpu=gpu))
        # The same kernel again: how much do its timings wander? (At most twice: a seed can take a minute.)
        for _ in range(min(self.config.search.noise_repeats, SEED_REPEATS) - 1):
            again = await self.pool.evaluate_on(evaluator, solution, self.workload_set)
            self.record(Remeasure(role="seed", solution_id=solution.id, evaluator=evaluator, gpu=gpu, result=again,
                                  speedup=self.speedup_of(again, evaluator) if again.passed else None))
        self.on_line(f"starting from the seed {solution.name}: {with_noise(value, self.noise(evaluator))} over the baseline; "
                     f"{format_noise(self.noise(evaluator))}")
        await self.wm(ApplyOps(ops=[AttachSolutionOp(
            op="attach_solution", node="root", solution_id=solution.id, evaluation=eval_summary(result, value),
        )]))
        if value is not None:  # the seed is the first best: a run that never beats it hands out the seed
            self._set_best(Best(solution_id=solution.id, speedup=value, node=ROOT_ID, round=0, gpu=gpu, why="the seed"))

    async def _remeasure_best(self) -> None:
        """A resumed session measures each GPU type's best beside its new baseline: its candidates must
        beat that number, not one measured in another session against another baseline."""
        for gpu, best in sorted(self.view.best_by_gpu.items()):
            if gpu not in self.gpu_of:
                continue
            index = self.gpu_of.index(gpu)
            self.set_phase(f"re-measuring the best ({best.solution_id}) beside this session's baseline on {gpu}")
            result = await self.pool.evaluate_on(index, self.solution(best.solution_id), self.workload_set)
            value = self.speedup_of(result, index) if result.passed else None
            self.record(Remeasure(role="best", solution_id=best.solution_id, evaluator=index, gpu=gpu, result=result,
                                  speedup=value))
            if value is None:
                raise SearchError(f"the best so far ({best.solution_id}) no longer passes: {result.status.value}: {result.message}")
            self._set_best(best.model_copy(update={"speedup": value, "why": "re-measured this session"}))
            self.on_line(f"the best so far, re-measured beside this session's baseline: {with_noise(value, self.noise(index))}")

    # --- the end: re-timing the best -----------------------------------------------------------------------

    async def _confirm(self) -> None:
        """Re-time the best against the baseline (and the seed, when the best is not the seed),
        interleaved, on one evaluator of each GPU type: the numbers a user should quote. It stays within
        the wall budget and stops once the verdict cannot change; a best that does not beat the seed in
        every repeat gives way to the seed."""
        repeats = self.config.search.confirm_repeats
        if not self.view.best_by_gpu or repeats <= 0:
            return
        baseline = self.task.baseline()
        seed_id = self.view.seed.solution_id if self.view.seed else None
        for gpu, best in sorted(self.view.best_by_gpu.items()):
            if gpu not in self.gpu_of:
                continue  # measured in an earlier session on a GPU this session does not have
            index = self.gpu_of.index(gpu)
            self.set_phase(f"re-timing the best against the baseline (up to {repeats}x, interleaved, on {gpu})")
            kernels = {"best": self.solution(best.solution_id)}
            if seed_id and seed_id != best.solution_id:
                kernels["seed"] = self.solution(seed_id)
            rows: list[ConfirmRow] = []
            failure = cut = None
            round_s = 0.0
            for repeat in range(repeats):
                left = self._wall_left()
                if left is not None and repeat > 0 and round_s > left:
                    cut = f"the wall budget: {repeat} of {repeats} repeats fit"
                    break
                t0 = time.monotonic()
                row = await self._confirm_round(index, baseline, kernels)
                round_s = max(round_s, time.monotonic() - t0)
                rows.append(row)
                failure = failure or next((f"the {role} kernel failed when re-timed" for role in kernels
                                           if row.scores.get(role) is None), None)
                if failure or self._decided(rows, repeats):
                    cut = None if failure or repeat + 1 == repeats else "decisive"
                    break
            best_spread = Spread.of([s for r in rows if (s := r.speedups.get("best"))])
            over_seed = Spread.of([b / s for r in rows if (b := r.speedups.get("best")) and (s := r.speedups.get("seed"))])
            beats = None if "seed" not in kernels or failure else over_seed is not None and over_seed.low > 1.0
            verdict = failure or confirm_verdict(best_spread, over_seed, best_is_seed=best.solution_id == seed_id)
            self.record(Confirm(gpu=gpu, evaluator=index, solution_id=best.solution_id, repeats=rows, verdict=verdict,
                                best_speedup=best_spread, over_seed=over_seed, beats_seed=beats, cut_short=cut))
            self.on_line(f"re-timed on {gpu}: {verdict}" + (f" (stopped early: {cut})" if cut else ""))
            seed_best = self.view.seed
            if (beats is False or failure) and seed_best is not None and seed_best.solution_id and seed_id != best.solution_id:
                seed_speedup = Spread.of([s for r in rows if (s := r.speedups.get("seed"))])
                if seed_speedup is not None:
                    self._set_best(Best(solution_id=seed_best.solution_id, speedup=seed_speedup.median, node=ROOT_ID,
                                        round=0, gpu=gpu, why="back to the seed: the re-timing did not confirm the best"))

    async def _confirm_round(self, index: int, baseline: Solution, kernels: dict[str, Solution]) -> ConfirmRow:
        base = await self.pool.evaluate_on(index, baseline, self.workload_set)
        row = ConfirmRow(ids={"baseline": baseline.id, **{role: s.id for role, s in kernels.items()}},
                         scores={"baseline": base.score if base.passed else None})
        for role, solution in kernels.items():
            result = await self.pool.evaluate_on(index, solution, self.workload_set)
            row.scores[role] = result.score if result.passed else None
            row.speedups[role] = speedup(self.task.definition, base, result) if result.passed and base.passed else None
        return row

    @staticmethod
    def _decided(rows: list[ConfirmRow], repeats: int) -> bool:
        """The verdict (does the best beat the seed in every repeat?) cannot change any more: a repeat
        where it did not is final; otherwise it needs every repeat."""
        ratios = [(r.speedups.get("best") or 0) / s for r in rows if (s := r.speedups.get("seed"))]
        return any(x <= 1.0 for x in ratios)

    def _wall_left(self) -> float | None:
        b = self.config.budget.max_wall_s
        return None if b is None else b - self.wall_s()
