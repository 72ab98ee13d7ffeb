"""Profiles of the bests (`--profile-bests`): each new best profiled once per GPU type, beside the search.

An evaluator takes a profile between measurements, never inside one (with evaluation.overlap, the profiler's
start-up overlaps an evaluation, and the candidate runs in a turn of its own on the device); the planner's next
call waits for the best's profile in flight, and the run's end waits for every one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ksearch_ray.config import RunConfig
from ksearch_ray.evaluation.describe import EvaluatorInfo
from ksearch_ray.evaluation.profiling import ProfileResult, kernel_line
from ksearch_ray.events import Best, Profile, ProfilerNote
from ksearch_ray.methods.context import RunRecord
from ksearch_ray.models import EvalResult, Solution
from ksearch_ray.run.backends import EvaluatorBackend
from ksearch_ray.run.budget import Budget
from ksearch_ray.run.errors import SearchError
from ksearch_ray.text import clip

PROFILE_MIN_S = 30.0
"""A profile is not started with less wall budget than this left (a TriMul best takes 10 to 15 s on an H200)."""


class BestProfiles:
    def __init__(self, config: RunConfig, run: RunRecord, pool: EvaluatorBackend, budget: Budget,
                 infos: Callable[[], list[EvaluatorInfo]], solution: Callable[[str], Solution]):
        self.config = config
        self.run = run
        self.pool = pool
        self.budget = budget
        self.infos = infos
        self.solution = solution
        self.in_flight: dict[str, asyncio.Task[None]] = {}  # solution id -> its profile (between measurements)

    def note_profiler(self) -> None:
        """Say in one line which profiler the evaluators have, or why none can profile (the run goes on)."""
        infos = self.infos()
        able = [i for i, info in enumerate(infos) if info.profiler]
        if able:
            tool = infos[able[0]].profiler
            self.run.record(ProfilerNote(tool=tool, evaluators=able))
            self.run.say(f"profiling each new best once with {tool} (evaluators {', '.join(map(str, able))}), "
                         "outside the timed measurements")
            return
        problem = next((info.profiler_problem for info in infos if info.profiler_problem), None) \
            or "no evaluator reported a profiler"
        self.run.record(ProfilerNote(problem=problem))
        self.run.say(f"profiling (--profile-bests): {problem}; the run goes on without profiles")

    def later(self, best: Best) -> None:
        """Profile a new best once (per GPU type), beside the search: the evaluator takes it between
        measurements, never inside one."""
        view = self.run.view
        note = view.profiler
        if not self.config.evaluation.profile.bests or note is None or not note.evaluators:
            return
        if (best.solution_id, best.gpu) in view.profiles:
            return  # profiled already (the seed given back, a best re-measured in a later session)
        infos = self.infos()
        index = next((i for i in note.evaluators if i < len(infos) and infos[i].name == best.gpu), None)
        measured = view.results.get(best.solution_id)
        if index is None or measured is None:
            return
        limit = self.config.evaluation.profile.limit_s
        left = self.budget.wall_left()
        if left is not None:  # within the wall budget, beside the room kept for the final re-timing
            limit = min(limit, left - self.budget.confirm_estimate_s())
            if limit < PROFILE_MIN_S:
                self.run.say(f"not profiling the best {best.solution_id}: the wall budget leaves {max(limit, 0):.0f} s")
                return
        task = asyncio.get_running_loop().create_task(self._profile(best, index, measured, limit))
        self.in_flight[best.solution_id] = task
        solution_id = best.solution_id

        def done(_task: asyncio.Task[None]) -> None:
            self.in_flight.pop(solution_id, None)
        task.add_done_callback(done)

    async def _profile(self, best: Best, index: int, measured: EvalResult, limit_s: float) -> None:
        key = f"profile {best.solution_id}"
        self.run.working(key, f"profiling the best {best.solution_id} with Nsight Compute")
        try:
            result = await self.pool.profile_on(index, self.solution(best.solution_id), measured, limit_s)
        except SearchError as exc:  # the evaluator was lost meanwhile: a profile is evidence, the search goes on
            result = ProfileResult(status="failed", solution_id=best.solution_id, workload="",
                                   message=f"its evaluator failed: {clip(str(exc), 200)}")
        finally:
            self.run.working(key, None)
        self.run.record(Profile(solution_id=best.solution_id, evaluator=index, gpu=best.gpu, result=result))
        if result.ok and result.kernels:
            top = result.kernels[0]
            self.run.say(f"profiled the best {best.solution_id} on {result.workload} in {result.seconds:.0f} s: "
                         f"{result.kernel_count} kernel(s); the slowest: {kernel_line(top, result.kernels_ms)}")
        else:
            self.run.say(f"WARNING: profiling the best {best.solution_id} {result.status}: {result.message}; "
                         "the search goes on")

    async def of(self, solution_id: str) -> bool:
        """Wait for this solution's profile if it is on its way (at most one profile's limit); whether it was."""
        if solution_id not in self.in_flight:
            return False
        await asyncio.shield(self.in_flight[solution_id])
        return True

    async def done(self) -> None:
        """Wait for the profiles in flight (before the planner's first call, and before the final re-timing)."""
        while self.in_flight:
            await asyncio.gather(*list(self.in_flight.values()))

    def cancel(self) -> None:
        for task in list(self.in_flight.values()):
            task.cancel()
