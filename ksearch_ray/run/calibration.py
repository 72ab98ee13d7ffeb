"""What a session measures side by side, so that its numbers can be trusted: the baseline on every evaluator
at its start (after a warm-up, enough times for the noise), the kernel it starts from beside it (the seed, in
the first session; each GPU type's best, later), and at its end the best re-timed against the baseline and the
seed, interleaved, within the wall budget, stopping once the verdict cannot change. A best that does not beat
the seed in every repeat gives way to the seed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from ksearch_ray.config import RunConfig
from ksearch_ray.evaluation.scoring import speedup
from ksearch_ray.events import Baseline, Best, Confirm, ConfirmRow, Remeasure, Seed, SeedFailed
from ksearch_ray.measure import Spread, confirm_verdict, format_noise, with_noise
from ksearch_ray.methods.context import RunRecord, WorldModel
from ksearch_ray.methods.evidence import eval_summary
from ksearch_ray.models import Solution
from ksearch_ray.run.budget import Budget
from ksearch_ray.run.errors import SearchError
from ksearch_ray.run.evaluations import Evaluations
from ksearch_ray.store import RunStore
from ksearch_ray.taskspec.task import solution_from_file
from ksearch_ray.worldmodel.api import ApplyOps
from ksearch_ray.worldmodel.ops import AttachSolutionOp
from ksearch_ray.worldmodel.tree import ROOT_ID

log = logging.getLogger(__name__)

NOISE_LEAST = 3
"""Baseline measurements a session makes at its start however long they take (`search.noise_repeats` caps them)."""
SEED_REPEATS = 2
"""Measurements of the seed at the start: TriMul's, in the CPU interpreter, takes a minute each."""


class Calibration:
    def __init__(self, config: RunConfig, run: RunRecord, store: RunStore, evals: Evaluations, world: WorldModel,
                 budget: Budget):
        self.config = config
        self.run = run
        self.store = store
        self.evals = evals
        self.world = world
        self.budget = budget

    # --- the start ----------------------------------------------------------------------------------------

    async def baselines(self) -> None:
        """Every evaluator measures the baseline on its own GPU, each session; more than once the
        first time, so the run knows its measurement noise from the start."""
        solution = self.run.task.baseline()
        self.store.save_solution(solution)
        # Every session, a resumed one too: after one warm-up that is not recorded (a fresh sandbox's first
        # measurement ran 2-11x slow on CPUs: imports, caches, clocks), `noise_repeats` measurements, or fewer
        # (at least NOISE_LEAST) once they have taken `noise_budget_s`: a noise figure that a second run
        # reproduces within a factor of two needs two dozen, cheap where the baseline is fast.
        most, budget_s = self.config.search.noise_repeats, self.config.search.noise_budget_s
        least = min(most, NOISE_LEAST)
        self.run.set_phase(f"measuring the baseline on {self.evals.pool.size} evaluator(s), after a warm-up"
                       + (f", {least}-{most}x each (up to {budget_s:.0f} s)" if most > least else
                          f", {most}x each" if most > 1 else ""))

        async def on(index: int) -> None:
            if self.config.search.warmup:
                warm = await self.evals.pool.evaluate_on(index, solution, self.evals.workload_set)
                log.info("evaluator %d warmed up on the baseline: %s, score %s", index, warm.status.value, warm.score)
            spent_s = 0.0
            for repeat in range(most):
                if repeat >= least and spent_s + spent_s / repeat > budget_s:
                    break  # the next one, as long as those so far took on average, would overrun the budget
                result = await self.evals.pool.evaluate_on(index, solution, self.evals.workload_set)
                spent_s += result.seconds
                if not result.passed:
                    raise SearchError(f"the task's baseline does not pass on evaluator {index} ({self.evals.gpu_of[index]}): "
                                      f"{result.status.value}: {result.message}")
                self.run.record(Baseline(solution_id=solution.id, evaluator=index, gpu=self.evals.gpu_of[index], result=result))
                self.evals.baselines_made[index] = self.evals.baselines_made.get(index, 0) + 1

        began = time.monotonic()
        ahead = asyncio.ensure_future(self._build_ahead())
        try:
            await asyncio.gather(*(on(i) for i in range(self.evals.pool.size)))
        except BaseException:
            if not ahead.cancel() and not ahead.cancelled():
                ahead.exception()  # already ended: the baselines' error is the one to tell
            raise
        base = self.run.view.session_baselines[0]
        made = sorted(set(self.evals.baselines_made.values()))
        times = f"{made[0]}x" if len(made) == 1 else f"{made[0]}-{made[-1]}x"
        self.run.say((f"baseline: {base.score:.4g} ({base.score_kind})" if base.score is not None else "baseline passed")
                     + f"; measured {times} on each of {self.evals.pool.size} evaluator(s)"
                     + (" after a warm-up" if self.config.search.warmup else "")
                     + f" in {time.monotonic() - began:.1f} s")
        await ahead  # the starting kernel's build, which its evaluation would wait for anyway (and its errors)

    async def _build_ahead(self) -> None:
        """The build of what this session measures after the baselines (cluster.build_ahead): the seed in the first
        session, each GPU type's best on a resume. Its evaluation joins the build; a compile error is its verdict."""
        ahead = self.config.cluster.build_ahead
        if not (self.config.evaluation.device == "cuda" if ahead is None else ahead):
            return
        if self.run.view.seed is None:
            seed = self._start_solution()
            solutions = [seed] if seed is not None else []
        else:
            ids = {best.solution_id for best in self.run.view.best_by_gpu.values()}
            solutions = [self.evals.solution(solution_id) for solution_id in sorted(ids)]
        for solution in solutions:
            await self.evals.pool.build_ahead(solution, self.evals.workload_set)

    def _start_solution(self) -> Solution | None:
        """What the run starts from: --from-solution, else (unless it starts from the specification) the
        task's seed in the language searched: its default_seed where that is in the language, else the
        first seed by name in it, else the first seed by name."""
        name = self.config.search.from_solution
        if name is None:
            if self.config.search.start == "spec":
                return None
            choices = {n: s for n, s in self.evals.seeds().items() if n != self.run.task.definition.baseline}
            preferred = self.run.task.definition.default_seed
            if preferred is not None:
                choices.setdefault(preferred, self.run.task.solution(preferred))
            # name order, then the default seed first, then the language searched first (stable sorts)
            seeds = sorted(choices, key=lambda n: n != preferred)
            seeds.sort(key=lambda n: choices[n].language != self.config.search.language)
            if not seeds:
                return None
            name = seeds[0]
        if name in self.run.task.solution_names():
            return self.run.task.solution(name)
        return solution_from_file(Path(name), self.run.task)

    async def seed(self) -> None:
        """Evaluate the starting solution beside the baseline, attach it to the root, make it the first best."""
        solution = self._start_solution()
        if solution is None:
            self.run.record(Seed(solution_id=None, start="spec"))
            self.run.say("starting from the specification: no seed kernel (the first kernel is written from the task)")
            return
        self.store.save_solution(solution)
        self.run.set_phase(f"evaluating the seed {solution.name}")
        result, evaluator, value = await self.evals.measure(solution, full=True)
        if not result.passed:
            self.run.record(SeedFailed(solution_id=solution.id, result=result))
            raise SearchError(f"the starting solution {solution.name} does not pass: {result.status.value}: {result.message}")
        gpu = self.evals.gpu_of[evaluator]
        self.run.record(Seed(solution_id=solution.id, result=result, speedup=value, evaluator=evaluator, gpu=gpu))
        # The same kernel again: how much do its timings wander? (At most twice: a seed can take a minute.)
        for _ in range(min(self.config.search.noise_repeats, SEED_REPEATS) - 1):
            again = await self.evals.pool.evaluate_on(evaluator, solution, self.evals.workload_set)
            self.run.record(Remeasure(role="seed", solution_id=solution.id, evaluator=evaluator, gpu=gpu, result=again,
                                  speedup=self.evals.speedup_of(again, evaluator) if again.passed else None))
        self.run.say(f"starting from the seed {solution.name}: {with_noise(value, self.evals.noise(evaluator))} over the baseline; "
                     f"{format_noise(self.evals.noise(evaluator))}")
        await self.world.wm(ApplyOps(ops=[AttachSolutionOp(
            op="attach_solution", node="root", solution_id=solution.id, evaluation=eval_summary(result, value),
        )]))
        if value is not None:  # the seed is the first best: a run that never beats it hands out the seed
            self.evals.set_best(Best(solution_id=solution.id, speedup=value, node=ROOT_ID, round=0, gpu=gpu, why="the seed"))

    async def remeasure_best(self) -> None:
        """A resumed session measures each GPU type's best beside its new baseline: its candidates must
        beat that number, not one measured in another session against another baseline."""
        for gpu, best in sorted(self.run.view.best_by_gpu.items()):
            if gpu not in self.evals.gpu_of:
                continue
            index = self.evals.gpu_of.index(gpu)
            self.run.set_phase(f"re-measuring the best ({best.solution_id}) beside this session's baseline on {gpu}")
            result = await self.evals.pool.evaluate_on(index, self.evals.solution(best.solution_id), self.evals.workload_set)
            value = self.evals.speedup_of(result, index) if result.passed else None
            self.run.record(Remeasure(role="best", solution_id=best.solution_id, evaluator=index, gpu=gpu, result=result,
                                  speedup=value))
            if value is None:
                raise SearchError(f"the best so far ({best.solution_id}) no longer passes: {result.status.value}: {result.message}")
            self.evals.set_best(best.model_copy(update={"speedup": value, "why": "re-measured this session"}))
            self.run.say(f"the best so far, re-measured beside this session's baseline: {with_noise(value, self.evals.noise(index))}")

    # --- the end: re-timing the best -----------------------------------------------------------------------

    async def confirm(self) -> None:
        """Re-time the best against the baseline (and the seed, when the best is not the seed),
        interleaved, on one evaluator of each GPU type: the numbers a user should quote. It stays within
        the wall budget and stops once the verdict cannot change; a best that does not beat the seed in
        every repeat gives way to the seed."""
        repeats = self.config.search.confirm_repeats
        if not self.run.view.best_by_gpu or repeats <= 0:
            return
        baseline = self.run.task.baseline()
        seed_id = self.run.view.seed.solution_id if self.run.view.seed else None
        for gpu, best in sorted(self.run.view.best_by_gpu.items()):
            if gpu not in self.evals.gpu_of:
                continue  # measured in an earlier session on a GPU this session does not have
            index = self.evals.gpu_of.index(gpu)
            self.run.set_phase(f"re-timing the best against the baseline (up to {repeats}x, interleaved, on {gpu})")
            kernels = {"best": self.evals.solution(best.solution_id)}
            if seed_id and seed_id != best.solution_id:
                kernels["seed"] = self.evals.solution(seed_id)
            rows: list[ConfirmRow] = []
            failure = cut = None
            round_s = 0.0
            for repeat in range(repeats):
                left = self.budget.wall_left()
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
            self.run.record(Confirm(gpu=gpu, evaluator=index, solution_id=best.solution_id, repeats=rows, verdict=verdict,
                                best_speedup=best_spread, over_seed=over_seed, beats_seed=beats, cut_short=cut))
            self.run.say(f"re-timed on {gpu}: {verdict}" + (f" (stopped early: {cut})" if cut else ""))
            seed_best = self.run.view.seed
            if (beats is False or failure) and seed_best is not None and seed_best.solution_id and seed_id != best.solution_id:
                seed_speedup = Spread.of([s for r in rows if (s := r.speedups.get("seed"))])
                if seed_speedup is not None:
                    self.evals.set_best(Best(solution_id=seed_best.solution_id, speedup=seed_speedup.median, node=ROOT_ID,
                                        round=0, gpu=gpu, why="back to the seed: the re-timing did not confirm the best"))

    async def _confirm_round(self, index: int, baseline: Solution, kernels: dict[str, Solution]) -> ConfirmRow:
        base = await self.evals.pool.evaluate_on(index, baseline, self.evals.workload_set)
        row = ConfirmRow(ids={"baseline": baseline.id, **{role: s.id for role, s in kernels.items()}},
                         scores={"baseline": base.score if base.passed else None})
        for role, solution in kernels.items():
            result = await self.evals.pool.evaluate_on(index, solution, self.evals.workload_set)
            row.scores[role] = result.score if result.passed else None
            row.speedups[role] = speedup(self.run.task.definition, base, result) if result.passed and base.passed else None
        return row

    @staticmethod
    def _decided(rows: list[ConfirmRow], repeats: int) -> bool:
        """The verdict (does the best beat the seed in every repeat?) cannot change any more: a repeat
        where it did not is final; otherwise it needs every repeat."""
        ratios = [(r.speedups.get("best") or 0) / s for r in rows if (s := r.speedups.get("seed"))]
        return any(x <= 1.0 for x in ratios)
