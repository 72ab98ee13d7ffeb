"""A search run in plain Python: its life, its event log, its budget; the services a method uses.

`Search` is the only writer of events.jsonl: `record(event)` appends an event and applies it to the run's
read model (`events.RunView`), the same reducer every reader of the run directory uses, then to the method
and the observers. It is the `run` a method sees (`methods.context.RunRecord`: the log, the live view, the
budget) and builds the other services of its `SearchContext`:

* `world` (`run.mirror`): the world model, one typed command at a time, applied on the backend and mirrored;
* `llm` (`run.llm_calls`): the planner's and the coder's calls, their retries, outages and prompt facts;
* `evals` (`run.evaluations`): the solution cache, verdicts, the noise, the best (`run.profiles`: profiles
  of the bests);

`idle_tuning` (`run.idle_tuning`, with `search.tune_when_idle`: evaluators that would idle tune the fastest
passed candidates while the method runs), and, for its own start and end, `calibration` (`run.calibration`: the
baselines, the seed or the best beside them, the final re-timing) and `budget` (`run.budget`). It reaches the
world model, the planner, the coder and the evaluators through small interfaces (`run.backends`), so the same logic
runs in this process (`run.local`) and on Ray (`distributed`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from ksearch_ray.config import RunConfig
from ksearch_ray.events import Candidate, Event, IsolationWarning, Resume, RunEnd, RunView, WmInit
from ksearch_ray.methods.context import Method, SearchContext
from ksearch_ray.run.backends import Backends
from ksearch_ray.run.budget import Budget
from ksearch_ray.run.calibration import Calibration
from ksearch_ray.run.evaluations import Evaluations
from ksearch_ray.run.idle_tuning import IdleTuning
from ksearch_ray.run.llm_calls import LlmCalls
from ksearch_ray.run.mirror import WorldModelMirror
from ksearch_ray.run.outcome import EXTEND_FLAG
from ksearch_ray.store import RunStore
from ksearch_ray.taskspec.task import Task
from ksearch_ray.worldmodel.state import WorldModelState
from ksearch_ray.worldmodel.tree import new_tree


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
        self.view = RunView(solution_exists=store.has_solution, live=True)  # the log stays on disk
        self.started = time.monotonic()
        self.phase = "starting"
        self.working_on: dict[str, str] = {}  # cycle or lane -> what it does, for the live view
        self.evaluations_before = 0  # candidate evaluations of earlier sessions (the live view's rate is this session's)
        self.budget = Budget(config, self.view, lambda: self.evals.gpu_of)
        self.world = WorldModelMirror(self.view, self.record)
        self.evals = Evaluations(config, self, store, backends.evaluators, self.budget, self.world,
                                 lambda: self.llm.policy_name)
        self.llm = LlmCalls(config, self, store, backends.planner, backends.coder, self.budget, self.world,
                            self.evals, self.changed)
        self.calibration = Calibration(config, self, store, self.evals, self.world, self.budget)
        self.context = SearchContext(run=self, world=self.world, llm=self.llm, evals=self.evals)
        self.idle_tuning = IdleTuning(self, self.evals) if config.search.tune_when_idle else None

    # --- the log: the run's record ----------------------------------------------------------------------

    def record(self, event: Event) -> Event:
        """Append to events.jsonl, then apply to the read model and the method: the one way state changes."""
        self.store.append(event)
        self.view.apply(event)
        self.method.observe(event)
        if self.idle_tuning is not None:
            self.idle_tuning.observe(event)
        for observer in self.observers:
            observer(event, self.view)
        if isinstance(event, Candidate):
            self.budget.outstanding.discard(event.round)
        self.on_change(self)
        return event

    def say(self, text: str) -> None:
        self.on_line(text)

    def changed(self) -> None:
        """What the live view shows changed."""
        self.on_change(self)

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

    # --- the budget -------------------------------------------------------------------------------------

    def budget_left(self) -> str | None:
        """None while the budget lasts, else why it ran out. Spend is counted from the event log."""
        return self.budget.left()

    async def take_round(self) -> int | None:
        return await self.budget.take_round()

    def give_back_round(self, round_: int) -> None:
        """A round taken and not spent (the call failed for the provider's reasons): it goes back to the budget."""
        self.budget.give_back_round(round_)

    # --- the run ----------------------------------------------------------------------------------------

    async def setup(self) -> None:
        for event in self.store.read_events():
            self.view.apply(event)
            self.method.observe(event)
        self.evaluations_before = self.view.evaluations
        self.set_phase("starting evaluators")
        await self.evals.describe()
        await self.llm.start()
        self.on_line(f"planner and coder: {self.llm.policy_name}; evaluators: {len(self.evals.infos)} on "
                     f"{self.evals.hardware}")
        self.on_line(self.objective_line())
        if self.config.evaluation.screen is not None:
            self.on_line("new candidates are screened (timed by the full rule with " + ", ".join(
                f"{k} {v}" for k, v in sorted(self.config.evaluation.screen.items())) + "); a would-be best is "
                "measured again by the full rule before it counts (evaluation.screen: null times every one fully)")
        if self.config.evaluation.overlap:
            cpu = (self.config.evaluation.device or "cpu") == "cpu"
            self.on_line("each evaluator takes two evaluations at once (evaluation.overlap): the second's worker starts "
                         "while the first is timed and runs its checks while the first's outputs are judged; timed "
                         "calls keep the device to themselves" + ("; on the CPU path the CPU is that device, and a "
                         "worker's start-up shares it with the other's timed calls" if cpu else ""))
        tree = self.view.tree
        if tree is None:
            self.record(WmInit(tree=new_tree(self.task.name, self.task.definition.description)))
        else:
            self.record(Resume(open_cycles=[c.cycle_id for c in self.view.open_cycles], budget=self.budget_change))
        for index, info in enumerate(self.evals.infos):
            for warning in info.isolation_warnings:
                self.on_line(f"WARNING: evaluator {index}: {warning}")
                self.record(IsolationWarning(evaluator=index, warning=warning))
        if self.config.evaluation.profile.bests:
            self.evals.profiles.note_profiler()
        assert self.view.tree is not None
        replica = WorldModelState(self.view.tree, self.store.has_solution)
        self.world.start(self.backends.world_model(self.view.tree), replica)

    async def run(self) -> RunView:
        profiles = self.evals.profiles
        try:
            await self.setup()
            await self.calibration.baselines()  # also a check, on resume, that the sandbox still works
            if self.view.seed is None:
                await self.calibration.seed()
            elif self.view.session > 0:
                await self.calibration.remeasure_best()
            await profiles.done()  # the first plan is made with the starting kernel's profile
            self._say_estimate()
            spent = self.budget_left()
            if spent:
                self.on_line(f"the run's budget is spent ({spent}); `ksearch resume {self.store.root} "
                             f"{EXTEND_FLAG[spent]}` extends it")
            if self.idle_tuning is not None:
                self.idle_tuning.start()
            reason = await self.method.run(self.context)
            if self.idle_tuning is not None:
                await self.idle_tuning.stop()
            await profiles.done()
            await self.calibration.confirm()
            await profiles.done()  # a best given back to the seed is profiled already; anything else, now
            best = self.view.best
            self.record(RunEnd(
                reason=reason, rounds=self.view.rounds_used, best=best.model_dump(mode="json") if best else None,
                session_wall_s=time.monotonic() - self.started, wm_s=self.world.wm_s,
                evaluator_busy_s={str(k): v for k, v in sorted(self.evals.pool.busy_s.items())},
            ))
            return self.view
        finally:
            profiles.cancel()
            if self.idle_tuning is not None:
                self.idle_tuning.cancel()
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
        lanes = max(1, min(self.config.search.width, self.evals.pool.size))
        total = rounds * each / lanes + self.budget.confirm_estimate_s()
        hours = total / 3600
        said = f"{total / 60:.0f} min" if hours < 2 else f"{hours:.1f} h"
        self.on_line(f"one evaluation takes about {each:.0f} s here: {rounds} more round(s) at width "
                     f"{self.config.search.width} on {self.evals.pool.size} evaluator(s) and the final re-timing take about "
                     f"{said} of evaluations (LLM time not counted; --rounds, --max-wall-s or a smaller --workloads "
                     "set shorten it)")

    def release(self) -> None:
        """Give back what the backends hold (Ray actors, GPUs, sandboxes), however the session ends: a
        driver that lives on (a notebook, a test suite, an experiment) must not keep a finished run's GPUs."""
        self.world.release()
        self.llm.release()
        self.evals.pool.release()

    def objective_line(self) -> str:
        """Which figure scores the search (kernel or call), and why: one of the run's first lines."""
        rule = self.task.definition.objective
        chosen = self.config.evaluation.objective
        objective = chosen or rule.timed
        why = "set by --objective / evaluation.objective" if chosen else f"the task's rule: {rule.source or 'the default'}"
        cpu = "; on the CPU there is no graph replay: the call figure is the only one" \
            if (self.config.evaluation.device or "cpu") == "cpu" else ""
        return f"objective: {objective} ({why}){cpu}"
