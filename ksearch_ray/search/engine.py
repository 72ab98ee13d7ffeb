"""A search run in plain Python: the event log, budgets, baselines, the seed, the best, the end.

`Search` is what every search method runs on (`search/ksearch.py` is the K-Search method): it owns
the run's state and is the only writer of events.jsonl. It reaches the world model, the planner,
the coder and the evaluators through small backend interfaces, so the same logic runs on Ray
(`search/driver.py` builds actor-backed backends) and in one process in tests.

The world model is mirrored here: every change goes through `wm()`, which applies the named call
on the backend (the authority: the WorldModelActor on Ray), applies the same call to a local
replica with the same pure functions, and logs it with its arguments (the clock included). Reading
the tree never crosses a process boundary, and a resumed run rebuilds the exact tree by replay.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ksearch_ray.config import RunConfig
from ksearch_ray.evaluation.retime import RetimeResult
from ksearch_ray.evaluation.scoring import speedup
from ksearch_ray.llm.types import fatal_error
from ksearch_ray.models import EvalResult, Solution
from ksearch_ray.search.errors import SearchError
from ksearch_ray.search.evaluators import BUILDER
from ksearch_ray.search.evidence import workload_times
from ksearch_ray.search.measure import Spread, confirm_verdict, format_noise, with_noise
from ksearch_ray.search.policy import CodeReply, CodeRequest, PlanReply, PlanRequest
from ksearch_ray.search.runstate import RunState, fold
from ksearch_ray.search.store import RunStore
from ksearch_ray.taskspec.task import Task, solution_from_file
from ksearch_ray.taskspec.tunables import read_tunables
from ksearch_ray.worldmodel.state import WorldModelState
from ksearch_ray.worldmodel.tree import ROOT_ID, EvalSummary, Tree, new_tree

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------- backends


class WorldModelBackend(Protocol):
    async def call(self, name: str, args: dict[str, Any]) -> Any: ...


class PolicyBackend(Protocol):
    async def name(self) -> str: ...

    async def plan(self, request: PlanRequest) -> PlanReply: ...

    async def code(self, request: CodeRequest) -> CodeReply: ...


class EvaluatorBackend(Protocol):
    size: int
    done: int
    busy_s: dict[int, float]
    in_flight: dict[int, tuple[str, float]]

    async def describe_all(self) -> list[dict[str, Any]]: ...

    async def evaluate(self, solution: Solution, workload_set: str) -> tuple[EvalResult, int]: ...

    async def evaluate_on(self, index: int, solution: Solution, workload_set: str) -> EvalResult: ...

    async def retime_on(self, index: int, solution: Solution, primary: EvalResult) -> RetimeResult: ...


@dataclass
class Backends:
    world_model: Callable[[Tree], WorldModelBackend]
    """Builds the world-model backend from the tree it starts with."""
    planner: PolicyBackend
    coder: PolicyBackend
    evaluators: EvaluatorBackend


class Method(Protocol):
    """A search method: what it does with the rounds of a run (K-Search, evolve, refine)."""

    name: str

    async def run(self, search: Search) -> str:
        """Search until the budget or the ideas run out; returns why it stopped."""
        ...


# ------------------------------------------------------------------------------------------ the run


class Search:
    def __init__(self, config: RunConfig, task: Task, store: RunStore, backends: Backends, method: Method, *,
                 on_change: Callable[[Search], None] | None = None, on_line: Callable[[str], None] | None = None,
                 budget_change: dict[str, Any] | None = None, clock: Callable[[], float] = time.time):
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
        self.state = RunState()
        self.started = time.monotonic()
        self.phase = "starting"
        self.policy_name = ""
        self.hardware = ""
        self.in_flight: dict[str, str] = {}  # cycle id -> action title, for the progress view
        self.llm_in_flight: dict[int, tuple[str, str, float]] = {}  # call token -> (role, kind, monotonic start)
        self._llm_tokens = 0
        self.baselines: dict[int, EvalResult] = {}  # evaluator -> baseline measured on it this session
        self.gpu_of: list[str] = []  # evaluator -> the name of its device
        self.results: dict[str, EvalResult] = {}  # solution id -> its latest evaluation (for per-workload times)
        self._round_lock = asyncio.Lock()
        self._seed_solutions: dict[str, Solution] | None = None
        self.wm_s = 0.0  # time spent on world-model calls (backend and mirror)
        self.pool = backends.evaluators

    # --- set-up -------------------------------------------------------------------------------

    def set_phase(self, text: str) -> None:
        """What the run is doing now, for the live view and as a line in logs."""
        self.phase = text
        self.on_line(text)
        self.on_change(self)

    async def setup(self) -> None:
        self.state = fold(self.store.read_events(), self.store.has_solution)
        self.results = dict(self.state.results)
        self.set_phase("starting evaluators")
        infos = await self.pool.describe_all()
        for index, info in enumerate(infos):
            for warning in info.get("isolation_warnings") or []:
                self.on_line(f"WARNING: evaluator {index}: {warning}")
                self.store.append("isolation_warning", evaluator=index, warning=warning)
        self.gpu_of = [str(info["name"]) for info in infos]
        self.hardware = infos[0]["hardware"]
        self.policy_name = await self.backends.planner.name()
        tree = self.state.tree
        if tree is None:
            tree = new_tree(self.task.name, self.task.definition.description)
            self.store.append("wm_init", tree=tree.model_dump(mode="json"))
            self.state.tree = tree
        else:
            self.store.append("resume", open_cycles=[c.cycle_id for c in self.state.open_cycles], budget=self.budget_change)
        self.mirror = WorldModelState(tree, self.store.has_solution)
        self.world_model = self.backends.world_model(tree)

    # --- the world model ------------------------------------------------------------------------

    async def wm(self, call: str, *, tag: dict[str, Any] | None = None, **args: Any) -> Any:
        t0 = time.monotonic()
        result = await self.world_model.call(call, args)
        mirrored = self.mirror.call(call, args)
        if mirrored != result:  # both applied the same pure function to the same tree
            raise SearchError(f"the world-model replica disagrees with its actor after {call}; the run log is the truth")
        self.wm_s += time.monotonic() - t0
        self.store.append("wm", call=call, args=args, **(tag or {}))
        self.state.tree = self.mirror.tree
        return result

    def tree(self) -> Tree:
        return self.mirror.tree

    # --- LLM calls ------------------------------------------------------------------------------

    async def _policy_call(self, role: str, kind: str, request: Any, cycle: str | None) -> Any:
        """A planner or coder call: visible in the live view while it waits, logged when it returns."""
        backend = self.backends.planner if role == "planner" else self.backends.coder
        self._llm_tokens += 1
        token = self._llm_tokens
        self.llm_in_flight[token] = (role, kind, time.monotonic())
        self.on_change(self)
        try:
            reply = await (backend.plan(request) if role == "planner" else backend.code(request))
        finally:
            self.llm_in_flight.pop(token, None)
        self._log_calls(reply, role, cycle)
        return reply

    def _log_calls(self, reply: PlanReply | CodeReply, role: str, cycle: str | None) -> None:
        for call in reply.calls:
            self.store.append("llm_call", role=role, cycle=cycle, call=call.model_dump(mode="json"))
            self.state.note_llm_call(call.model_dump(mode="json"))
        self.on_change(self)
        fatal = next((call for call in reply.calls if fatal_error(call)), None)
        if fatal is not None:
            # A rejected key, an unknown model, a refused request: every further call would fail
            # the same way, so stop now instead of spending the budget on failures.
            raise SearchError(f"the {role}'s LLM call failed and retrying cannot fix it: {fatal.error}")

    def plan_request(self, kind: str, **fields: Any) -> PlanRequest:
        tree = self.tree()
        attempts = fields.get("attempts") or []
        return PlanRequest(
            kind=kind, task=self.task.definition, tree=tree, hardware=self.hardware,  # type: ignore[arg-type]
            language=self.config.language, solutions=self.solutions(tree, attempts), seeds=self.seeds(),
            max_actions=max(self.config.width, 4), noise=self.noise(), prompt_budget_tokens=self.config.prompt_budget_tokens,
            **fields,
        )

    async def plan(self, request: PlanRequest, *, cycle: str | None = None) -> tuple[PlanReply, dict[str, Any] | None]:
        """Ask the planner and apply its ops; returns the reply and the apply report (None when nothing applied)."""
        reply: PlanReply = await self._policy_call("planner", request.kind, request, cycle)
        for note in reply.notes:
            self.on_line(f"planner ({request.kind}): {note}")
        if reply.error:
            self.store.append("plan_failed", plan_kind=request.kind, cycle=cycle, error=reply.error, notes=reply.notes)
            self.on_line(f"planner ({request.kind}): no usable reply: {reply.error}")
            return reply, None
        if not reply.ops:
            self.store.append("plan_empty", plan_kind=request.kind, cycle=cycle, notes=reply.notes)
            return reply, None
        tag = {"cycle": cycle, "plan_kind": request.kind, "focus": request.node_id, "source": reply.source,
               "notes": reply.notes}
        report = await self.wm("apply", ops=reply.ops, system=False, tag=tag)
        rejected = [r for r in report["results"] if not r["ok"]]
        if rejected:
            self.on_line(f"planner ({request.kind}): {len(rejected)} of {len(reply.ops)} ops rejected: "
                         + "; ".join(f"{r['op']}: {r['reason']}" for r in rejected[:3]))
        return reply, report

    async def code(self, request: CodeRequest, cycle: str) -> CodeReply:
        reply: CodeReply = await self._policy_call("coder", request.kind, request, cycle)
        return reply

    def solutions(self, tree: Tree, attempts: list[Any]) -> dict[str, Solution]:
        ids = {n.solution.solution_id for n in tree.nodes.values() if n.solution}
        if tree.root.solution:
            ids.add(tree.root.solution.solution_id)
        ids |= {a.solution_id for a in attempts if a.solution_id}
        return {i: self.store.load_solution(i) for i in ids if self.store.has_solution(i)}

    def seeds(self) -> dict[str, Solution]:
        """The task's seed kernels (those declaring tunables) and its baseline; read once."""
        if self._seed_solutions is None:
            self._seed_solutions = {}
            for name in self.task.solution_names():
                sol = self.task.solution(name)
                if any(read_tunables(text) for text in sol.sources.values()) or name == self.task.definition.baseline:
                    self._seed_solutions[name] = sol
        return self._seed_solutions

    # --- evaluation -------------------------------------------------------------------------------

    @property
    def workload_set(self) -> str:
        return self.config.workloads or self.task.definition.default_workloads

    async def evaluate(self, solution: Solution) -> tuple[EvalResult, int]:
        """The verdict, and which evaluator gave it."""
        result, evaluator = await self.pool.evaluate(solution, self.workload_set)
        self.results[solution.id] = result
        return result, evaluator

    def speedup_of(self, result: EvalResult, evaluator: int) -> float | None:
        """Against the baseline measured this session on the same evaluator (so the same GPU)."""
        if evaluator == BUILDER:  # a compile error from a CPU build task: no GPU measured it
            return None
        return speedup(self.task.definition, self.baselines[evaluator], result)

    def gpu_name(self, evaluator: int) -> str | None:
        return None if evaluator == BUILDER else self.gpu_of[evaluator]

    def noise(self, evaluator: int = 0) -> float | None:
        """How far repeated measurements of one kernel disagree on this evaluator's kind of GPU."""
        gpu = self.gpu_name(evaluator) if self.gpu_of else None
        return self.state.noise(gpu) if gpu is not None else None

    def baseline_for(self, evaluator: int | None) -> EvalResult | None:
        return self.baselines.get(evaluator if evaluator is not None else 0) or self.baselines.get(0)

    def summary(self, result: EvalResult, value: float | None) -> EvalSummary:
        latency = result.score if result.score_kind.startswith("geomean") else None
        return EvalSummary(status=result.status, score=result.score, latency_ms=latency, speedup=value,
                           log=(result.message + "\n" + result.log).strip())

    async def note_best(self, solution_id: str, value: float | None, node: str, round_: int, evaluator: int) -> None:
        gpu = self.gpu_name(evaluator)
        if value is None or gpu is None:
            return
        current = self.state.best_by_gpu.get(gpu)
        if current and value <= current["speedup"]:
            return
        if node != ROOT_ID and self.config.retime_best and not await self._confirmed_by_retiming(solution_id, evaluator):
            return
        best = {"solution_id": solution_id, "speedup": value, "node": node, "round": round_, "gpu": gpu}
        self.store.append("best", **best)
        self.state.note_best(best)
        self.on_line(f"new best: {with_noise(value, self.noise(evaluator))} over the baseline ({node}, round {round_})")
        if self.state.best != best:
            return  # a better kernel on another GPU type stays the run's best
        solution = self.store.load_solution(solution_id)
        self.store.write_best({**best, "policy": self.policy_name, "solution": solution.model_dump(mode="json")}, solution)
        result = self.results.get(solution_id)
        if result is not None:
            times = workload_times(result, None, self.baseline_for(evaluator))
            await self.wm("apply", ops=[{
                "op": "set_best", "solution_id": solution_id, "speedup": value,
                "time_ms": {t.workload: t.ms for t in times},
                "baseline_ms": {t.workload: t.baseline_ms for t in times if t.baseline_ms is not None},
            }])

    async def _confirmed_by_retiming(self, solution_id: str, evaluator: int) -> bool:
        """A new best is believed only once a second, independent measurement in a fresh sandbox
        agrees with the first (evaluation/retime.py): a kernel that fooled one clock must fool two."""
        primary = self.results.get(solution_id)
        if primary is None:
            return True
        check = await self.pool.retime_on(evaluator, self.store.load_solution(solution_id), primary)
        self.store.append("retime", solution_id=solution_id, evaluator=evaluator, agreed=check.agreed,
                          status=check.status.value, message=check.message,
                          workloads=[w.model_dump(mode="json") for w in check.workloads])
        if not check.agreed:
            self.on_line(f"not recorded as a best: the independent re-timing disagrees ({check.message[:200]})")
        return check.agreed

    # --- budgets -----------------------------------------------------------------------------------

    def wall_s(self) -> float:
        return self.state.wall_s + (time.monotonic() - self.started)

    def budget_left(self) -> str | None:
        """None while the budget lasts, else why it ran out. Spend is counted from the event log."""
        c = self.config
        if self.state.rounds_used >= c.rounds:
            return "rounds"
        if c.max_cost_usd is not None and self.state.llm_cost_usd >= c.max_cost_usd:
            return "cost"
        if c.max_llm_tokens is not None and self.state.llm_tokens >= c.max_llm_tokens:
            return "tokens"
        if c.max_wall_s is not None and self.wall_s() >= c.max_wall_s:
            return "wall clock"
        return None

    async def take_round(self) -> int | None:
        async with self._round_lock:
            if self.budget_left():
                return None
            self.state.rounds_used += 1
            return self.state.rounds_used

    # --- the run -----------------------------------------------------------------------------------

    async def run(self) -> RunState:
        try:
            await self.setup()
            await self._measure_baselines()  # also a check, on resume, that the sandbox still works
            if not self.state.seeded:
                await self._seed()
            spent = self.budget_left()
            if spent:
                self.on_line(f"the run's budget is spent ({spent}); `ksearch resume {self.store.root} --rounds N` extends it")
            reason = await self.method.run(self)
            await self._confirm()
            self.store.append(
                "run_end", reason=reason, rounds=self.state.rounds_used, best=self.state.best,
                session_wall_s=time.monotonic() - self.started, wm_s=self.wm_s,
                evaluator_busy_s={str(k): v for k, v in sorted(self.pool.busy_s.items())},
            )
            self.state.finished = reason
            self.on_change(self)
            return self.state
        finally:
            self.release()

    def release(self) -> None:
        """Give back what the backends hold (Ray actors, GPUs), however the session ends: a driver
        that lives on (a notebook, a test suite, an experiment) must not keep a finished run's GPUs."""
        for backend in (getattr(self, "world_model", None), self.backends.planner, self.backends.coder, self.pool):
            release = getattr(backend, "release", None)
            if release is not None:
                release()

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

    async def _seed(self) -> None:
        """Evaluate the starting solution, if any, and attach it to the root."""
        name = self.config.from_solution
        if name is None and self.config.model is None:
            seeds = [n for n in self.seeds() if n != self.task.definition.baseline]
            seeds.sort(key=lambda n: self.seeds()[n].language != self.config.language)  # the language searched first
            name = seeds[0] if seeds else None
        if name is None:
            self.store.append("seed", solution_id=None)
            self.state.seeded = True
            return
        solution = self.task.solution(name) if name in self.task.solution_names() else solution_from_file(Path(name), self.task)
        self.store.save_solution(solution)
        self.set_phase(f"evaluating the seed {solution.name}")
        result, evaluator = await self.evaluate(solution)
        value = self.speedup_of(result, evaluator)
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
            "evaluation": self.summary(result, value).model_dump(mode="json"),
        }])
        # The seed is the first best: a run that never beats it hands out the seed, not a slower kernel.
        await self.note_best(solution.id, value, "root", 0, evaluator)
        self.state.seeded = True

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
