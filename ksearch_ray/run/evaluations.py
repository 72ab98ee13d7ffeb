"""Kernels measured and judged: the solution cache, verdicts and speedups, the noise, the best.

Every speedup of a session is against the baseline measured this session on the same evaluator. A
candidate becomes the best only when it beats the best by more than the measured noise and an independent
re-timing in a fresh sandbox agrees (`note_best`); the run's best is written to best.json and best/. An
evaluator whose session start measured the baseline fewer than `noise_repeats` times makes up the count
between candidates (`search.noise_share` of its time), for the noise only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from ksearch_ray.config import RunConfig
from ksearch_ray.evaluation.describe import EvaluatorInfo
from ksearch_ray.evaluation.scoring import speedup
from ksearch_ray.events import Best, Evaluation, Remeasure, Retime
from ksearch_ray.measure import Noise, beyond_noise, with_noise
from ksearch_ray.methods.context import RunRecord, Where, WorldModel
from ksearch_ray.methods.evidence import workload_times
from ksearch_ray.models import EvalResult, Solution
from ksearch_ray.policies.contract import Attempt
from ksearch_ray.run.backends import BUILDER, EvaluatorBackend
from ksearch_ray.run.budget import Budget
from ksearch_ray.run.errors import SearchError
from ksearch_ray.run.profiles import BestProfiles
from ksearch_ray.store import RunStore
from ksearch_ray.taskspec.tunables import read_tunables
from ksearch_ray.text import clip
from ksearch_ray.worldmodel.api import ApplyOps
from ksearch_ray.worldmodel.ops import SetBestOp


class Evaluations:
    def __init__(self, config: RunConfig, run: RunRecord, store: RunStore, pool: EvaluatorBackend, budget: Budget,
                 world: WorldModel, policy_name: Callable[[], str]):
        self.config = config
        self.run = run
        self.task = run.task
        self.view = run.view
        self.store = store
        self.pool = pool
        self.world = world
        self.policy_name = policy_name
        self.infos: list[EvaluatorInfo] = []  # this session's evaluators, by index
        self.profiles = BestProfiles(config, run, pool, budget, lambda: self.infos, self.solution)
        self.baselines_made: dict[int, int] = {}  # evaluator -> its baseline measurements this session (noise only)
        self._since_baseline: dict[int, float] = {}  # evaluator -> its seconds on other kernels since its last baseline
        self.measuring = 0  # candidates handed to the evaluators and not yet judged: waiting for one, or measured
        self._solutions: dict[str, Solution] = {}
        self._seed_solutions: dict[str, Solution] | None = None
        self._noting: set[str] = set()  # solutions whose claim to be the best is being decided (note_best)

    async def describe(self) -> None:
        self.infos = await self.pool.describe_all()

    @property
    def hardware(self) -> str:
        return self.infos[0].hardware if self.infos else ""

    @property
    def gpu_of(self) -> list[str]:
        return [info.name for info in self.infos]

    @property
    def screening(self) -> bool:
        """New candidates are timed by the coarser screening rule (`evaluation.screen`); a would-be best is
        measured again by the full rule before it counts (`note_best`)."""
        return self.config.evaluation.screen is not None

    @property
    def workload_set(self) -> str:
        return self.config.evaluation.workloads or self.task.definition.default_workloads

    # --- solutions ------------------------------------------------------------------------------------

    def solution(self, solution_id: str) -> Solution:
        if solution_id not in self._solutions:
            self._solutions[solution_id] = self.store.load_solution(solution_id)
        return self._solutions[solution_id]

    def uncache(self, solution_ids: Iterable[str]) -> None:
        """These solutions' code leaves memory (a later need, if any, reads it from the store)."""
        for solution_id in solution_ids:
            self._solutions.pop(solution_id, None)

    def save_solution(self, solution: Solution) -> str:
        self._solutions[solution.id] = solution
        return self.store.save_solution(solution)

    def seeds(self) -> dict[str, Solution]:
        """The task's seed kernels (those declaring tunables) and its baseline; read once."""
        if self._seed_solutions is None:
            self._seed_solutions = {}
            for name in self.task.solution_names():
                sol = self.task.solution(name)
                if any(read_tunables(text) for text in sol.sources.values()) or name == self.task.definition.baseline:
                    self._seed_solutions[name] = sol
        return self._seed_solutions

    # --- verdicts -------------------------------------------------------------------------------------

    async def measure(self, solution: Solution, *, full: bool = False) -> tuple[EvalResult, int, float | None]:
        """A verdict from whichever evaluator is free, which one it was, and the speedup (None unless it passed).
        Timed by the screening rule where the run has one, unless `full` (the seed)."""
        self.measuring += 1
        try:
            result, evaluator = await self.pool.evaluate(solution, self.workload_set, screen=self.screening and not full)
        finally:
            self.measuring -= 1
        await self._baseline_now_and_then(evaluator, result.seconds)
        return result, evaluator, self.speedup_of(result, evaluator) if result.passed else None

    async def measure_spare(self, index: int, solution: Solution, prepared: Any) -> tuple[EvalResult, float | None] | None:
        """A verdict from evaluator `index`, lent by the pool because it would otherwise idle (`pool.take_spare`), and
        the speedup (None unless it passed); None if the evaluator died meanwhile. Nothing recorded."""
        result = await self.pool.evaluate_spare(index, solution, self.workload_set, prepared, screen=self.screening)
        if result is None:
            return None
        await self._baseline_now_and_then(index, result.seconds)
        return result, self.speedup_of(result, index) if result.passed else None

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
        if self.baselines_made.get(evaluator, 0) >= self.config.search.noise_repeats:
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
            self.run.say(f"WARNING: the baseline could not be measured again for the noise on evaluator {evaluator} "
                         f"({clip(str(exc), 160)}); the search goes on")
            return
        self.run.record(Remeasure(role="baseline", solution_id=baseline.id, evaluator=evaluator,
                                  gpu=self.gpu_of[evaluator], result=again))
        self.baselines_made[evaluator] = self.baselines_made.get(evaluator, 0) + 1
        if not again.passed:
            self.run.say(f"WARNING: the baseline, measured again for the noise on evaluator {evaluator}, "
                         f"{again.status.value}: {clip(again.message, 160)}")

    async def judge(self, attempt: Attempt, where: Where) -> None:
        """The one place a candidate is measured and its `evaluation` recorded (then tuned, then maybe a best:
        `methods.attempts.evaluate`)."""
        assert attempt.solution_id is not None
        result, evaluator, value = await self.measure(self.solution(attempt.solution_id))
        self.run.record(Evaluation(round=attempt.round, evaluator=evaluator, gpu=self.gpu_name(evaluator),
                                   solution_id=attempt.solution_id, result=result, speedup=value, **where.fields()))
        shown = with_noise(value, self.noise(evaluator)) if result.passed else clip(result.message, 160)
        self.run.say(f"round {attempt.round} ({where.key}, {attempt.kind}): {result.status.value} {shown}")

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
        """A candidate becomes the best only beyond the noise and once an independent re-timing agrees. One claim
        per code at a time: a policy repeats code, even while its first copy is being decided, and the best's
        own code measured again (luckier) is no new best."""
        gpu = self.gpu_name(evaluator)
        best = self.view.best_by_gpu.get(gpu) if gpu is not None else None
        if solution_id in self._noting or (best is not None and best.solution_id == solution_id):
            return
        self._noting.add(solution_id)
        try:
            await self._note_best(solution_id, value, node, round_, evaluator, gpu)
        finally:
            self._noting.discard(solution_id)

    async def _note_best(self, solution_id: str, value: float | None, node: str, round_: int, evaluator: int,
                         gpu: str | None) -> None:
        if value is None or gpu is None or not self._beats_best(value, gpu, evaluator, round_):
            return
        result = self.view.results.get(solution_id)
        if self.screening:
            # Its figure was screened: the full rule measures it again, and only that figure counts.
            result = await self.pool.evaluate_on(evaluator, self.solution(solution_id), self.workload_set)
            screened, value = value, self.speedup_of(result, evaluator) if result.passed else None
            self.run.record(Remeasure(role="full", solution_id=solution_id, evaluator=evaluator, gpu=gpu, result=result,
                                      speedup=value))
            if value is None:
                self.run.say(f"round {round_}: screened at {screened:.3g}x, but measured again by the full timing rule "
                             f"it {result.status.value}: {clip(result.message, 160)}")
                return
            self.run.say(f"round {round_}: screened at {screened:.3g}x; by the full timing rule {value:.3g}x")
            if not self._beats_best(value, gpu, evaluator, round_):
                return
        if self.config.search.retime_best and not await self._confirmed_by_retiming(solution_id, evaluator, result):
            return
        self.set_best(Best(solution_id=solution_id, speedup=value, node=node, round=round_, gpu=gpu))
        self.run.say(f"new best: {with_noise(value, self.noise(evaluator))} over the baseline ({node}, round {round_})")
        if result is not None and self.view.best is not None and self.view.best.solution_id == solution_id:
            times = workload_times(result, None, self.baseline_for(evaluator))
            await self.world.wm(ApplyOps(ops=[SetBestOp(
                op="set_best", solution_id=solution_id, speedup=value,
                time_ms={t.workload: t.ms for t in times},
                baseline_ms={t.workload: t.baseline_ms for t in times if t.baseline_ms is not None},
            )]))

    def set_best(self, best: Best) -> None:
        """Record a best and, when it is the run's best, write best.json and best/."""
        self.run.record(best)
        self.profiles.later(best)
        run_best = self.view.best
        if run_best is None or run_best.solution_id != best.solution_id or run_best.gpu != best.gpu:
            return  # a better kernel on another GPU type stays the run's best
        solution = self.solution(best.solution_id)
        payload = {**best.model_dump(mode="json", exclude={"kind"}), "policy": self.policy_name(),
                   "solution": solution.model_dump(mode="json")}
        self.store.write_best(payload, solution)

    def _beats_best(self, value: float, gpu: str, evaluator: int, round_: int) -> bool:
        """Whether `value` beats this GPU type's best beyond the noise (true where there is no best yet)."""
        current = self.view.best_by_gpu.get(gpu)
        if current is None:
            return True
        if value <= current.speedup:
            return False
        noise = self.noise(evaluator)
        if not beyond_noise(value, current.speedup, noise):
            self.run.say(f"round {round_}: {with_noise(value, noise)} is within the noise of the best "
                         f"({current.speedup:.3g}x): a candidate, not a new best")
            return False
        return True

    async def _confirmed_by_retiming(self, solution_id: str, evaluator: int, primary: EvalResult | None) -> bool:
        """A new best is believed only once a second, independent measurement in a fresh sandbox
        agrees with the first (`primary`, evaluation/retime.py): a kernel that fooled one clock must fool two."""
        if primary is None:
            return True
        check = await self.pool.retime_on(evaluator, self.solution(solution_id), primary)
        self.run.record(Retime(solution_id=solution_id, evaluator=evaluator, agreed=check.agreed, status=check.status,
                               message=check.message, workloads=[w.model_dump(mode="json") for w in check.workloads],
                               seconds=check.seconds))
        if not check.agreed:
            self.run.say(f"not recorded as a best: the independent re-timing disagrees ({clip(check.message, 200)})")
        return check.agreed
