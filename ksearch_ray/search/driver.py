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
from pathlib import Path
from typing import Any, TypeVar

import ray
from ray.exceptions import RayActorError

from ksearch_ray.config import RunConfig
from ksearch_ray.evaluation.scoring import speedup
from ksearch_ray.llm.types import fatal_error
from ksearch_ray.models import EvalResult, Solution
from ksearch_ray.search.errors import SearchError
from ksearch_ray.search.evaluators import BUILDER, EvaluatorPool
from ksearch_ray.search.measure import Spread, confirm_verdict, format_noise, with_noise
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


class Search:
    def __init__(self, config: RunConfig, task: Task, store: RunStore, *, on_change: Callable[[Search], None] | None = None,
                 on_line: Callable[[str], None] | None = None, budget_change: dict[str, Any] | None = None):
        self.config = config
        self.task = task
        self.store = store
        self.on_change = on_change or (lambda _s: None)
        self.on_line = on_line or (lambda _text: None)
        """Hears one line per notable event: phases, evaluations, new bests."""
        self.budget_change = budget_change or {}
        """Budget settings this session changes (`ksearch resume --rounds ...`), logged with `resume`."""
        self.state = RunState()
        self.started = time.monotonic()
        self.phase = "starting"
        self.in_flight: dict[str, str] = {}  # cycle id -> action title, for the progress view
        self.llm_in_flight: dict[int, tuple[str, str, float]] = {}  # call token -> (role, kind, monotonic start)
        self._llm_tokens = 0
        self.baselines: dict[int, EvalResult] = {}  # evaluator -> baseline measured on it this session
        self.gpu_of: list[str] = []  # evaluator -> the name of its device
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

    def set_phase(self, text: str) -> None:
        """What the run is doing now, for the live view and as a line in logs."""
        self.phase = text
        self.on_line(text)
        self.on_change(self)

    async def setup(self) -> None:
        events = self.store.read_events()
        self.state = fold(events, self.store.has_solution)
        self.set_phase("starting evaluators")
        self.pool = EvaluatorPool(
            self.config, self.store.root.name, str(self.store.root / "sandbox"),
            on_lost=lambda index, solution_id: self.store.append("evaluator_lost", evaluator=index, solution_id=solution_id),
        )
        self.planner = self._make_policy_actor("planner")
        self.coder = self._make_policy_actor("coder")
        infos = await self.pool.describe_all()
        self.gpu_of = [str(info["name"]) for info in infos]
        self.hardware = infos[0]["hardware"]
        self.policy_name = await self.planner.name.remote()
        tree = self.state.tree
        if tree is None:
            tree = new_tree(self.task.name, self.task.definition.description)
            self.store.append("wm_init", tree=tree.model_dump(mode="json"))
            self.state.tree = tree
        else:
            self.store.append("resume", open_cycles=[c.cycle_id for c in self.state.open_cycles], budget=self.budget_change)
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

    async def _policy_call(self, role: str, kind: str, make: Callable[[], Awaitable[T]]) -> T:
        """A planner or coder call, visible in the live view while it waits."""
        self._llm_tokens += 1
        token = self._llm_tokens
        self.llm_in_flight[token] = (role, kind, time.monotonic())
        self.on_change(self)
        try:
            return await self._actor_call(make, role, lambda: setattr(self, role, self._make_policy_actor(role)))
        finally:
            self.llm_in_flight.pop(token, None)

    def _log_calls(self, reply: Any, role: str, cycle: str | None) -> None:
        for call in reply.calls:
            self.store.append("llm_call", role=role, cycle=cycle, call=call.model_dump(mode="json"))
            self.state.llm_calls += 1
            self.state.llm_cost_usd += call.cost_usd
            self.state.llm_tokens += call.prompt_tokens + call.completion_tokens
            self.state.llm_failed_calls += call.error is not None
        self.on_change(self)
        fatal = next((call for call in reply.calls if fatal_error(call)), None)
        if fatal is not None:
            # A rejected key, an unknown model, a refused request: every further call would fail
            # the same way, so stop now instead of spending the budget on failures.
            raise SearchError(f"the {role}'s LLM call failed and retrying cannot fix it: {fatal.error}")

    async def plan(self, kind: PlanKind, *, node_id: str | None = None, attempts: list[Attempt] | None = None,
                   cycle: str | None = None) -> PlanReply:
        tree = await self.tree()
        request = PlanRequest(
            kind=kind, task=self.task.definition, tree=tree, hardware=self.hardware, language=self.config.language,
            node_id=node_id, attempts=attempts or [], solutions=self._solutions(tree, attempts or []),
            seeds=self._seeds(), max_actions=max(self.config.width, 4),
        )
        reply: PlanReply = await self._policy_call("planner", kind, lambda: self.planner.plan.remote(request))
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
                if any(read_tunables(text) for text in sol.sources.values()) or name == self.task.definition.baseline:
                    self._seed_solutions[name] = sol
        return self._seed_solutions

    # --- evaluation --------------------------------------------------------------------------------

    @property
    def workload_set(self) -> str:
        return self.config.workloads or self.task.definition.default_workloads

    async def evaluate(self, solution: Solution) -> tuple[EvalResult, int]:
        """The verdict, and which evaluator gave it."""
        return await self.pool.evaluate(solution, self.workload_set)

    def _speedup(self, result: EvalResult, evaluator: int) -> float | None:
        """Against the baseline measured this session on the same evaluator (so the same GPU)."""
        if evaluator == BUILDER:  # a compile error from a CPU build task: no GPU measured it
            return None
        return speedup(self.task.definition, self.baselines[evaluator], result)

    def noise(self, evaluator: int = 0) -> float | None:
        """How far repeated measurements of one kernel disagree on this evaluator's kind of GPU."""
        return self.state.noise(self.gpu_of[evaluator]) if self.gpu_of else None

    def _note_best(self, solution_id: str, value: float | None, node: str, round_: int, evaluator: int) -> None:
        gpu = self.gpu_of[evaluator]
        current = self.state.best_by_gpu.get(gpu)
        if value is None or (current and value <= current["speedup"]):
            return
        best = {"solution_id": solution_id, "speedup": value, "node": node, "round": round_, "gpu": gpu}
        self.store.append("best", **best)
        self.state.note_best(best)
        self.on_line(f"new best: {with_noise(value, self.noise(evaluator))} over the baseline ({node}, round {round_})")
        if self.state.best != best:
            return  # a better kernel on another GPU type stays the run's best
        solution = self.store.load_solution(solution_id)
        self.store.write_best({**best, "policy": self.policy_name, "solution": solution.model_dump(mode="json")}, solution)

    async def _measure_baselines(self) -> None:
        """Every evaluator measures the baseline on its own GPU, each session; more than once the
        first time, so the run knows its measurement noise from the start."""
        solution = self.task.baseline()
        self.store.save_solution(solution)
        repeats = 1 if self.state.baseline else self.config.noise_repeats
        self.set_phase(f"measuring the baseline on {self.pool.size} evaluator(s)" + (f", {repeats}x each" if repeats > 1 else ""))

        async def on(index: int) -> None:
            for _ in range(repeats):
                result = await self.pool.evaluate_on(index, solution, self.workload_set)
                if not result.passed:
                    raise SearchError(f"the task's baseline does not pass on evaluator {index} ({self.gpu_of[index]}): "
                                      f"{result.status.value}: {result.message}")
                self.store.append("baseline", solution_id=solution.id, evaluator=index, gpu=self.gpu_of[index],
                                  result=result.model_dump(mode="json"))
                self.state.baseline = self.state.baseline or result
                self.state.note_score(self.gpu_of[index], solution.id, result.score)
                self.baselines[index] = result

        await asyncio.gather(*(on(i) for i in range(self.pool.size)))
        base = self.baselines[0]
        self.on_line(f"baseline: {base.score:.4g} ({base.score_kind})" if base.score is not None else "baseline passed")

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
        await self._measure_baselines()  # also a check, on resume, that the sandbox still works
        if not self.state.seeded:
            await self._seed()
        tree = await self.tree()
        if not tree.nodes:
            self.set_phase("asking the planner for the first actions")
            await self.plan("initialize_tree")
        if self.budget_left():
            self.on_line(f"the run's budget is spent ({self.budget_left()}); `ksearch resume {self.store.root} --rounds N` "
                         "extends it")
        self.set_phase("searching")
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
        await self._confirm()
        self.store.append(
            "run_end", reason=reason, rounds=self.state.rounds_used, best=self.state.best,
            session_wall_s=time.monotonic() - self.started, wm_s=self.wm_s,
            evaluator_busy_s={str(k): v for k, v in sorted(self.pool.busy_s.items())},
        )
        self.state.finished = reason
        self.on_change(self)
        return self.state

    async def _confirm(self) -> None:
        """Re-time the best (and the seed, when the best is not the seed) against the baseline,
        interleaved, on one evaluator of each GPU type: the numbers a user should quote."""
        repeats = self.config.confirm_repeats
        if not self.state.best_by_gpu or repeats <= 0:
            return
        baseline = self.task.baseline()
        seed_id = (self.state.seed or {}).get("solution_id")
        for gpu, best in sorted(self.state.best_by_gpu.items()):
            if gpu not in self.gpu_of:
                continue  # measured in an earlier session on a GPU this session does not have
            index = self.gpu_of.index(gpu)
            self.set_phase(f"re-timing the best against the baseline ({repeats}x, interleaved, on {gpu})")
            kernels = {"best": self.store.load_solution(best["solution_id"])}
            if seed_id and seed_id != best["solution_id"]:
                kernels["seed"] = self.store.load_solution(seed_id)
            rows: list[dict[str, Any]] = []
            failure = None
            for _ in range(repeats):
                base = await self.pool.evaluate_on(index, baseline, self.workload_set)
                row: dict[str, Any] = {"baseline": base.score}
                for role, solution in kernels.items():
                    result = await self.pool.evaluate_on(index, solution, self.workload_set)
                    row[role] = result.score
                    row[f"{role}_speedup"] = speedup(self.task.definition, base, result)
                    if not result.passed and failure is None:
                        failure = f"the {role} kernel failed when re-timed: {result.status.value}: {result.message}"
                row["ids"] = {"baseline": baseline.id, **{role: s.id for role, s in kernels.items()}}
                rows.append(row)
                for role, solution_id in row["ids"].items():
                    self.state.note_score(gpu, solution_id, row.get(role))
            best_spread = Spread.of([r["best_speedup"] for r in rows if r.get("best_speedup")])
            over_seed = Spread.of([r["best_speedup"] / r["seed_speedup"] for r in rows
                                   if r.get("best_speedup") and r.get("seed_speedup")])
            verdict = failure or confirm_verdict(best_spread, over_seed, best_is_seed=best["solution_id"] == seed_id)
            event = self.store.append(
                "confirm", gpu=gpu, evaluator=index, solution_id=best["solution_id"], repeats=rows, verdict=verdict,
                best_speedup=best_spread.as_dict() if best_spread else None,
                over_seed=over_seed.as_dict() if over_seed else None,
            )
            self.state.confirms[gpu] = event
            self.on_line(f"re-timed on {gpu}: {verdict}")

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
            seeds.sort(key=lambda n: self._seeds()[n].language != self.config.language)  # the language searched first
            name = seeds[0] if seeds else None
        if name is None:
            self.store.append("seed", solution_id=None)
            self.state.seeded = True
            return
        from ksearch_ray.taskspec.task import solution_from_file

        solution = self.task.solution(name) if name in self.task.solution_names() else solution_from_file(Path(name), self.task)
        self.store.save_solution(solution)
        self.set_phase(f"evaluating the seed {solution.name}")
        result, evaluator = await self.evaluate(solution)
        value = self._speedup(result, evaluator)
        if not result.passed:
            self.store.append("seed_failed", solution_id=solution.id, result=result.model_dump(mode="json"))
            raise SearchError(f"the starting solution {name} does not pass: {result.status.value}: {result.message}")
        gpu = self.gpu_of[evaluator]
        self.store.append("seed", solution_id=solution.id, result=result.model_dump(mode="json"), speedup=value,
                          evaluator=evaluator, gpu=gpu)
        self.state.seed = {"solution_id": solution.id, "speedup": value}
        self.state.note_score(gpu, solution.id, result.score)
        for _ in range(self.config.noise_repeats - 1):  # the same kernel again: how much do its timings wander?
            again = await self.pool.evaluate_on(evaluator, solution, self.workload_set)
            self.store.append("seed_repeat", solution_id=solution.id, evaluator=evaluator, gpu=gpu, status=again.status.value,
                              score=again.score if again.passed else None)
            if again.passed:
                self.state.note_score(gpu, solution.id, again.score)
        self.on_line(f"seed {solution.name}: {with_noise(value, self.noise(evaluator))} over the baseline; "
                     f"{format_noise(self.noise(evaluator))} (repeated measurements of one kernel)")
        await self.wm("apply", ops=[{
            "op": "attach_solution", "node": "root", "solution_id": solution.id,
            "evaluation": self._summary(result, value).model_dump(mode="json"),
        }])
        # The seed is the first best: a run that never beats it hands out the seed, not a slower kernel.
        self._note_best(solution.id, value, "root", 0, evaluator)
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
        reply = await self._policy_call("coder", kind, lambda: self.coder.code.remote(request))
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
        attempt.speedup = self._speedup(result, evaluator)
        self.state.evaluations += 1
        self.store.append("evaluation", cycle=rec.cycle_id, node=rec.node_id, round=attempt.round, evaluator=evaluator,
                          gpu=self.gpu_of[evaluator] if evaluator != BUILDER else None, solution_id=attempt.solution_id,
                          result=result.model_dump(mode="json"),
                          speedup=attempt.speedup)
        outcome = with_noise(attempt.speedup, self.noise(evaluator)) if result.passed else result.message[:120]
        self.on_line(f"round {attempt.round} ({rec.cycle_id} on {rec.node_id}, {attempt.kind}): {result.status.value} {outcome}")
        self._note_best(attempt.solution_id, attempt.speedup, rec.node_id, attempt.round, evaluator)
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
