"""The search driver: W action cycles in parallel against one shared world model, on Ray.

The driver is the only writer of events.jsonl. Every world-model change goes through `wm()`,
which calls the WorldModelActor and logs the call with its arguments (the clock included), so
a resumed run rebuilds the exact tree by replay (runstate.fold). Actors that die cost the call
in flight: it is retried on a fresh actor.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import ray
from ray.exceptions import RayActorError

from ksearch_ray.config import RunConfig
from ksearch_ray.evaluation.scoring import speedup
from ksearch_ray.models import EvalResult, Solution
from ksearch_ray.search.errors import SearchError
from ksearch_ray.search.evaluators import EvaluatorPool
from ksearch_ray.search.policy import Attempt, CodeKind, CodeRequest, PlanKind, PlanReply, PlanRequest
from ksearch_ray.search.runstate import CycleRecord, RunState, fold
from ksearch_ray.search.store import RunStore
from ksearch_ray.taskspec.task import Task
from ksearch_ray.taskspec.tunables import read_tunables
from ksearch_ray.worldmodel.tree import ActionNode, EvalSummary, Tree, new_tree

log = logging.getLogger(__name__)
T = TypeVar("T")

LEASE_TTL_S = 6 * 3600.0
ACTOR_RETRIES = 3


@dataclass
class Budget:
    rounds: int
    max_cost_usd: float | None
    max_wall_s: float | None


class Search:
    def __init__(self, config: RunConfig, task: Task, store: RunStore, *, on_change: Callable[[Search], None] | None = None):
        self.config = config
        self.task = task
        self.store = store
        self.on_change = on_change or (lambda _s: None)
        self.state = RunState()
        self.started = time.monotonic()
        self.in_flight: dict[str, str] = {}  # cycle id -> action title, for the progress view
        self.policy_name = ""
        self.hardware = ""
        self.device = config.device or "cpu"
        self._round_lock = asyncio.Lock()
        self._stop_reason: str | None = None
        self._seed_solutions: dict[str, Solution] | None = None
        self.wm_s = 0.0  # driver time waiting on the world model

    # --- set-up ------------------------------------------------------------------------------

    def _pinned(self) -> dict[str, Any]:
        """Driver-side actors live on the driver's node: they read and write the run directory."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        node = ray.get_runtime_context().get_node_id()
        return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id=node, soft=False)}

    def _make_policy_actor(self, role: str) -> Any:
        from ksearch_ray.actors.policy import PolicyActor

        llm_json = None
        if self.config.model:
            from ksearch_ray.llm.client import LLMConfig

            llm_json = LLMConfig(
                model=self.config.model, api_base=self.config.api_base, api_key_env=self.config.api_key_env,
                temperature=self.config.temperature, max_tokens=self.config.max_tokens,
                reasoning_effort=self.config.reasoning_effort, timeout_s=self.config.llm_timeout_s,
                max_retries=self.config.llm_max_retries, backoff_base_s=self.config.llm_backoff_base_s,
                max_concurrency=self.config.llm_concurrency,
            ).model_dump_json()
        return PolicyActor.options(max_concurrency=self.config.llm_concurrency, **self._pinned()).remote(
            role, llm_json, str(self.store.cache_dir), None
        )

    def _make_wm_actor(self, tree: Tree) -> Any:
        from ksearch_ray.actors.world_model import WorldModelActor

        return WorldModelActor.options(**self._pinned()).remote(str(self.store.root), tree.model_dump_json())

    async def setup(self) -> None:
        events = self.store.read_events()
        self.state = fold(events, self.store.has_solution)
        self.pool = EvaluatorPool(
            self.config, self.store.root.name, str(self.store.root / "sandbox"),
            on_lost=lambda index, solution_id: self.store.append("evaluator_lost", evaluator=index, solution_id=solution_id),
        )
        self.planner = self._make_policy_actor("planner")
        self.coder = self._make_policy_actor("coder")
        info = await self.pool.describe()
        self.hardware = info["hardware"]
        self.policy_name = await self.planner.name.remote()
        tree = self.state.tree
        if tree is None:
            tree = new_tree(self.task.name, self.task.definition.description)
            self.store.append("wm_init", tree=tree.model_dump(mode="json"))
            self.state.tree = tree
        else:
            self.store.append("resume", open_cycles=[c.cycle_id for c in self.state.open_cycles])
        self.wm_actor = self._make_wm_actor(tree)

    # --- actor calls with retry ------------------------------------------------------------------

    async def _actor_call(self, make: Callable[[], Awaitable[T]], what: str, replace: Callable[[], None]) -> T:
        for attempt in range(1, ACTOR_RETRIES + 1):
            try:
                return await make()
            except RayActorError as exc:
                log.warning("%s actor died (%s); retrying on a fresh one (%d/%d)", what, type(exc).__name__, attempt, ACTOR_RETRIES)
                replace()
        raise SearchError(f"{what} actor died {ACTOR_RETRIES} times in a row")

    async def wm(self, call: str, *, tag: dict[str, Any] | None = None, **args: Any) -> Any:
        def rebuild() -> None:
            # The log holds every change: a new actor gets the exact tree by replay.
            state = fold(self.store.read_events(), self.store.has_solution)
            assert state.tree is not None
            self.wm_actor = self._make_wm_actor(state.tree)

        t0 = time.monotonic()
        result = await self._actor_call(lambda: self.wm_actor.call.remote(call, args), "world-model", rebuild)
        self.wm_s += time.monotonic() - t0
        self.store.append("wm", call=call, args=args, **(tag or {}))
        return result

    async def tree(self) -> Tree:
        text = await self._actor_call(lambda: self.wm_actor.tree_json.remote(), "world-model", lambda: None)
        return Tree.model_validate_json(text)

    def _log_calls(self, reply: Any, role: str, cycle: str | None) -> None:
        for call in reply.calls:
            self.store.append("llm_call", role=role, cycle=cycle, call=call.model_dump(mode="json"))
            self.state.llm_calls += 1
            self.state.llm_cost_usd += call.cost_usd
            self.state.llm_tokens += call.prompt_tokens + call.completion_tokens
            self.state.llm_failed_calls += call.error is not None
        self.on_change(self)

    async def plan(self, kind: PlanKind, *, node_id: str | None = None, attempts: list[Attempt] | None = None,
                   cycle: str | None = None) -> PlanReply:
        tree = await self.tree()
        request = PlanRequest(
            kind=kind, task=self.task.definition, tree=tree, hardware=self.hardware, language=self.config.language,
            node_id=node_id, attempts=attempts or [], solutions=self._solutions(tree, attempts or []),
            seeds=self._seeds(), max_actions=max(self.config.width, 4),
        )
        reply: PlanReply = await self._actor_call(
            lambda: self.planner.plan.remote(request), "planner", lambda: setattr(self, "planner", self._make_policy_actor("planner"))
        )
        self._log_calls(reply, "planner", cycle)
        if reply.error:
            self.store.append("plan_failed", plan_kind=kind, cycle=cycle, error=reply.error)
        elif reply.ops:
            report = await self.wm("apply", ops=reply.ops, tag={"cycle": cycle, "plan_kind": kind})
            rejected = [r for r in report["results"] if not r["ok"]]
            if rejected:
                log.info("planner ops rejected: %s", "; ".join(f"{r['op']}: {r['reason']}" for r in rejected))
        return reply

    def _solutions(self, tree: Tree, attempts: list[Attempt]) -> dict[str, Solution]:
        ids = {n.solution.solution_id for n in tree.nodes.values() if n.solution}
        if tree.root.solution:
            ids.add(tree.root.solution.solution_id)
        ids |= {a.solution_id for a in attempts if a.solution_id}
        return {i: self.store.load_solution(i) for i in ids if self.store.has_solution(i)}

    def _seeds(self) -> dict[str, Solution]:
        """The task's seed kernels (those declaring tunables) and its baseline; read once."""
        if self._seed_solutions is None:
            self._seed_solutions = {}
            for name in self.task.solution_names():
                sol = self.task.solution(name)
                if read_tunables(sol.sources[sol.entry_file]) or name == self.task.definition.baseline:
                    self._seed_solutions[name] = sol
        return self._seed_solutions

    # --- evaluation --------------------------------------------------------------------------------

    @property
    def workload_set(self) -> str:
        return self.config.workloads or self.task.definition.default_workloads

    async def evaluate(self, solution: Solution) -> tuple[EvalResult, int]:
        """The verdict, and which evaluator gave it."""
        return await self.pool.evaluate(solution, self.workload_set)

    def _speedup(self, result: EvalResult) -> float | None:
        assert self.state.baseline is not None
        return speedup(self.task.definition, self.state.baseline, result)

    def _note_best(self, solution_id: str, value: float | None, node: str, round_: int) -> None:
        if value is None or (self.state.best and value <= self.state.best["speedup"]):
            return
        self.state.best = {"solution_id": solution_id, "speedup": value, "node": node, "round": round_}
        self.store.append("best", **self.state.best)
        solution = self.store.load_solution(solution_id)
        self.store.write_best({**self.state.best, "policy": self.policy_name, "solution": solution.model_dump(mode="json")})

    # --- budgets ---------------------------------------------------------------------------------

    def wall_s(self) -> float:
        return self.state.wall_s + (time.monotonic() - self.started)

    def budget_left(self) -> str | None:
        """None while the budget lasts, else why it ran out."""
        c = self.config
        if self.state.rounds_used >= c.rounds:
            return "rounds"
        if c.max_cost_usd is not None and self.state.llm_cost_usd >= c.max_cost_usd:
            return "cost"
        if c.max_wall_s is not None and self.wall_s() >= c.max_wall_s:
            return "wall clock"
        return None

    async def take_round(self) -> int | None:
        async with self._round_lock:
            reason = self.budget_left()
            if reason:
                self._stop_reason = self._stop_reason or reason
                return None
            self.state.rounds_used += 1
            return self.state.rounds_used

    # --- the run -----------------------------------------------------------------------------------

    async def run(self) -> RunState:
        await self.setup()
        if self.state.baseline is None:
            baseline, _ = await self.evaluate(self.task.baseline())
            if not baseline.passed:
                raise SearchError(f"the task's baseline does not pass: {baseline.status.value}: {baseline.message}")
            self.store.save_solution(self.task.baseline())
            self.store.append("baseline", solution_id=self.task.baseline().id, result=baseline.model_dump(mode="json"))
            self.state.baseline = baseline
        if not self.state.seeded:
            await self._seed()
        tree = await self.tree()
        if not tree.nodes:
            await self.plan("initialize_tree")
        running: dict[asyncio.Task[None], str] = {}
        for record in self.state.open_cycles:  # cycles a killed driver left half-done
            running[asyncio.create_task(self.cycle(record))] = record.cycle_id
        while True:
            if self.budget_left() and not running:
                break
            free = self.config.width - len(running)
            if free > 0 and not self.budget_left():
                started = await self._start_cycles(free, running)
                if not started and not running:
                    await self.plan("propose_actions")
                    started = await self._start_cycles(free, running)
                    if not started:
                        self._stop_reason = "the planner has no open actions left"
                        break
            if not running:
                break
            done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                running.pop(t)
                t.result()  # a bug in a cycle stops the run loudly
            frontier_low = len(self._frontier_ids(await self.tree())) < self.config.width
            if frontier_low and not self.budget_left():
                await self.plan("propose_actions")
        reason = self._stop_reason or self.budget_left() or "done"
        self.state.tree = await self.tree()
        self.store.append(
            "run_end", reason=reason, rounds=self.state.rounds_used, best=self.state.best,
            session_wall_s=time.monotonic() - self.started, wm_s=self.wm_s,
            evaluator_busy_s={str(k): v for k, v in sorted(self.pool.busy_s.items())},
        )
        self.state.finished = reason
        self.on_change(self)
        return self.state

    def _frontier_ids(self, tree: Tree) -> list[str]:
        from ksearch_ray.worldmodel.select import frontier

        return [n.id for n in frontier(tree)]

    async def _start_cycles(self, free: int, running: dict[asyncio.Task[None], str]) -> int:
        started = 0
        for _ in range(free):
            cycle_id = f"c{len(self.state.cycles) + 1}"
            ids = await self.wm(
                "select_and_lease", k=1, holder=cycle_id, now=time.time(), ttl=LEASE_TTL_S,
                max_difficulty=self.config.max_difficulty, relax_at=self.config.relax_difficulty_at_speedup,
            )
            if not ids:
                break
            record = CycleRecord(cycle_id, ids[0])
            self.state.cycles[cycle_id] = record
            self.store.append("cycle_start", cycle=cycle_id, node=ids[0])
            running[asyncio.create_task(self.cycle(record))] = cycle_id
            started += 1
        return started

    async def _seed(self) -> None:
        """Evaluate the starting solution, if any, and attach it to the root."""
        name = self.config.from_solution
        if name is None and self.config.model is None:
            seeds = [n for n, s in self._seeds().items() if n != self.task.definition.baseline]
            name = seeds[0] if seeds else None
        if name is None:
            self.store.append("seed", solution_id=None)
            self.state.seeded = True
            return
        from ksearch_ray.taskspec.task import solution_from_file

        solution = self.task.solution(name) if name in self.task.solution_names() else solution_from_file(Path(name), self.task)
        self.store.save_solution(solution)
        result, _ = await self.evaluate(solution)
        value = self._speedup(result)
        self.store.append("seed", solution_id=solution.id, result=result.model_dump(mode="json"), speedup=value)
        if not result.passed:
            raise SearchError(f"the starting solution {name} does not pass: {result.status.value}: {result.message}")
        await self.wm("apply", ops=[{
            "op": "attach_solution", "node": "root", "solution_id": solution.id,
            "evaluation": self._summary(result, value).model_dump(mode="json"),
        }])
        self.state.seeded = True

    def _summary(self, result: EvalResult, value: float | None) -> EvalSummary:
        latency = result.score if result.score_kind.startswith("geomean") else None
        return EvalSummary(status=result.status, score=result.score, latency_ms=latency, speedup=value,
                           log=(result.message + "\n" + result.log).strip())

    # --- one action cycle --------------------------------------------------------------------------

    async def cycle(self, rec: CycleRecord) -> None:
        tree = await self.tree()
        node = tree.nodes[rec.node_id]
        self.in_flight[rec.cycle_id] = node.title
        self.on_change(self)
        try:
            if not rec.steps:
                await self._attempts(rec, tree, node)
            await self._finish(rec)
        finally:
            self.in_flight.pop(rec.cycle_id, None)
            self.on_change(self)

    def _base(self, tree: Tree, node: ActionNode) -> tuple[Solution | None, float | None]:
        parent = tree.get(node.parent)
        ref = parent.solution if parent is not None else None
        if ref is None:
            return None, None
        return self.store.load_solution(ref.solution_id), ref.evaluation.speedup

    def _stagnation(self, rec: CycleRecord) -> int:
        best, streak = None, 0
        for a in rec.attempts:
            if a.passed and a.speedup is not None and (best is None or a.speedup > best):
                best, streak = a.speedup, 0
            else:
                streak += 1
        return streak

    async def _attempts(self, rec: CycleRecord, tree: Tree, node: ActionNode) -> None:
        base, base_speedup = self._base(tree, node)
        while self._stagnation(rec) < self.config.stagnation_window:
            pending = rec.attempts[-1] if rec.attempts and rec.attempts[-1].solution_id and rec.attempts[-1].result is None else None
            if pending is None:
                round_ = await self.take_round()
                if round_ is None:
                    break
                pending = await self._generate(rec, tree, node, base, base_speedup, round_)
            if pending.solution_id is not None:
                await self._evaluate_attempt(rec, pending)

    def _next_kind(self, rec: CycleRecord, base: Solution | None) -> CodeKind:
        if not rec.attempts:
            return "generate_from_base" if base else "generate_from_spec"
        return "improve" if any(a.passed for a in rec.attempts) else "debug"

    async def _generate(self, rec: CycleRecord, tree: Tree, node: ActionNode, base: Solution | None,
                        base_speedup: float | None, round_: int) -> Attempt:
        kind = self._next_kind(rec, base)
        current = self._current(rec)
        sols = {a.solution_id: self.store.load_solution(a.solution_id) for a in rec.attempts if a.solution_id}
        request = CodeRequest(
            kind=kind, task=self.task.definition, tree=await self.tree(), node_id=node.id, hardware=self.hardware,
            language=self.config.language, base=base, base_speedup=base_speedup,
            current=sols.get(current.solution_id) if current and current.solution_id else None,
            current_result=current.result if current else None, history=list(rec.attempts), solutions=sols,
            seeds=self._seeds(),
        )
        reply = await self._actor_call(
            lambda: self.coder.code.remote(request), "coder", lambda: setattr(self, "coder", self._make_policy_actor("coder"))
        )
        self._log_calls(reply, "coder", rec.cycle_id)
        attempt = Attempt(round=round_, kind=kind, error=reply.error if reply.solution is None else None)
        if reply.solution is not None:
            attempt.solution_id = self.store.save_solution(reply.solution)
        elif attempt.error is None:
            attempt.error = "the coder returned no code"
        self.store.append("candidate", cycle=rec.cycle_id, node=node.id, round=round_, attempt_kind=kind,
                          solution_id=attempt.solution_id, error=attempt.error)
        rec.attempts.append(attempt)
        await self.wm("renew", ids=[node.id], holder=rec.cycle_id, now=time.time(), ttl=LEASE_TTL_S)
        return attempt

    def _current(self, rec: CycleRecord) -> Attempt | None:
        """What attempt N+1 works from: the best passing attempt, else the last one with code."""
        passing = [a for a in rec.attempts if a.passed]
        if passing:
            return max(passing, key=lambda a: a.speedup or 0.0)
        with_code = [a for a in rec.attempts if a.solution_id]
        return with_code[-1] if with_code else None

    async def _evaluate_attempt(self, rec: CycleRecord, attempt: Attempt) -> None:
        assert attempt.solution_id is not None
        solution = self.store.load_solution(attempt.solution_id)
        result, evaluator = await self.evaluate(solution)
        attempt.result = result
        attempt.speedup = self._speedup(result)
        self.state.evaluations += 1
        self.store.append("evaluation", cycle=rec.cycle_id, node=rec.node_id, round=attempt.round, evaluator=evaluator,
                          solution_id=attempt.solution_id, result=result.model_dump(mode="json"), speedup=attempt.speedup)
        self._note_best(attempt.solution_id, attempt.speedup, rec.node_id, attempt.round)
        self.on_change(self)

    async def _finish(self, rec: CycleRecord) -> None:
        """Attach the best passing attempt and refine, or mark the action too hard; each step once."""
        best = self._current(rec)
        passed = best is not None and best.passed
        tag = {"cycle": rec.cycle_id}
        if not rec.attempts:
            # The budget ran out before the first attempt: the action goes back to the frontier.
            await self.wm("release", ids=[rec.node_id], holder=rec.cycle_id, tag=tag)
        elif passed and "attached" not in rec.steps:
            assert best is not None and best.result is not None and best.solution_id is not None
            await self.wm("apply", tag=tag, ops=[{
                "op": "attach_solution", "node": rec.node_id, "solution_id": best.solution_id,
                "evaluation": self._summary(best.result, best.speedup).model_dump(mode="json"),
            }])
            self._step(rec, "attached")
        elif not passed and "marked" not in rec.steps:
            last = rec.attempts[-1]
            reason = last.error or (f"{last.result.status.value}: {last.result.message}" if last.result else "no result")
            await self.wm("apply", tag=tag, ops=[{
                "op": "mark_too_hard", "node": rec.node_id,
                "reason": f"no passing attempt in {len(rec.attempts)}; last: {reason}"[:500],
            }])
            self._step(rec, "marked")
        if rec.attempts and "planned" not in rec.steps and not (self.config.max_cost_usd is not None and self.budget_left() == "cost"):
            await self.plan("refine" if passed else "too_hard", node_id=rec.node_id, attempts=rec.attempts, cycle=rec.cycle_id)
            self._step(rec, "planned")
        rec.ended = True
        self.store.append("cycle_end", cycle=rec.cycle_id, node=rec.node_id, passed=passed, attempts=len(rec.attempts))

    def _step(self, rec: CycleRecord, step: str) -> None:
        rec.steps.add(step)
        self.store.append("cycle_step", cycle=rec.cycle_id, step=step)
