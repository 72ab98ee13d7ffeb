"""Idle tuning (`--tune-when-idle`, run/idle_tuning.py): evaluators that would otherwise idle tune the fastest passed
candidates' tunables while the coder waits for its model; never ahead of a candidate; a faster variant becomes the
best; variants are evaluations, not rounds."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from local_backends import DATA, FakeEvaluators
from test_methods import Recording, by_tunables, run, search

from ksearch_ray.config import SearchConfig
from ksearch_ray.events import RunView, Tune
from ksearch_ray.models import Solution, Status
from ksearch_ray.policies.offline.offline_policy import OfflinePolicy
from ksearch_ray.run.backends import IdleEvaluators
from ksearch_ray.taskspec.task import find_task
from ksearch_ray.taskspec.tunables import read_tunables, with_values


class Queued(FakeEvaluators):
    """`size` evaluators, one evaluation at a time each, each `seconds` long; a candidate waits for a free one.
    It counts the evaluations that ended while a candidate waited (`ended_in_waits`)."""

    def __init__(self, judge, size: int, seconds: float):  # type: ignore[no-untyped-def]
        super().__init__(judge, size)
        self.seconds = seconds
        self.idle = IdleEvaluators()
        for index in range(size):
            self.idle.put(index)
        self.ended = 0
        self.ended_in_waits: list[int] = []
        self.spares: list[Solution] = []

    async def evaluate(self, solution, workload_set, *, screen=False):  # type: ignore[no-untyped-def]
        before = self.ended
        index = await self.idle.get()
        self.ended_in_waits.append(self.ended - before)
        try:
            return await self._timed(index, solution, workload_set), index
        finally:
            self.idle.put(index)

    async def _timed(self, index, solution, workload_set):  # type: ignore[no-untyped-def]
        self.in_flight[index] = (solution.name, time.monotonic())
        try:
            await asyncio.sleep(self.seconds)
            return await self.evaluate_on(index, solution, workload_set)
        finally:
            self.in_flight.pop(index, None)
            self.ended += 1

    def take_spare(self):  # type: ignore[no-untyped-def]
        return self.idle.spare()

    async def prepare(self, solution, workload_set):  # type: ignore[no-untyped-def]
        return None, None

    async def evaluate_spare(self, index, solution, workload_set, prepared, *, screen=False):  # type: ignore[no-untyped-def]
        self.spares.append(solution)
        try:
            return await self._timed(index, solution, workload_set)
        finally:
            self.idle.put(index)


class SlowCoder(Recording):
    """The offline coder behind a model that takes `seconds` to reply: the evaluators wait meanwhile."""

    def __init__(self, seconds: float):
        super().__init__(OfflinePolicy())
        self.seconds = seconds

    async def code(self, request):  # type: ignore[no-untyped-def]
        await asyncio.sleep(self.seconds)
        return await super().code(request)


def values(solution: Solution) -> dict[str, object]:
    return {n: t.value for n, t in read_tunables(solution.sources["axpy.py"]).items()}


def test_an_evaluator_is_lent_to_spare_work_only_while_no_evaluation_waits() -> None:
    async def scenario() -> list[object]:
        idle = IdleEvaluators()
        seen: list[object] = []
        idle.on_free = lambda: seen.append("freed")
        idle.put(0)
        seen.append(idle.spare())  # free, nobody waiting: lent
        waiter = asyncio.create_task(idle.get())
        await asyncio.sleep(0)
        idle.put(0)  # comes back while a candidate waits: the candidate's, even before it runs again
        seen.append(idle.spare())
        seen.append(await waiter)
        seen.append(idle.spare())  # taken by the candidate: nothing to lend
        return seen

    assert asyncio.run(scenario()) == ["freed", 0, "freed", None, 0, None]


def test_idle_evaluators_climb_to_the_fastest_tunables_while_the_coder_waits_and_never_ahead_of_a_candidate(tmp_path):
    # Larger blocks and fewer warps are faster (by_tunables). The offline coder's first kernel sets BLOCK 256 with
    # 4 warps; while the coder waits on its model for the next one, the two evaluators climb from there.
    evaluators = Queued(by_tunables(), size=2, seconds=0.02)
    s = search(tmp_path, SlowCoder(0.8), evaluators, method="refine", width=1, rounds=3, tune_when_idle=True)
    state = run(s)
    events = s.store.read_events()
    tunes = [e for e in events if isinstance(e, Tune)]
    candidates = [e for e in events if e.kind == "candidate"]
    assert tunes and all(e.idle for e in tunes) and not [e for e in events if e.kind == "tuned"]
    # Variants are not rounds. (The offline coder searches the same grid: a kernel of its that idle tuning measured
    # already is declined, as any repeat.)
    assert state.rounds_used == 3 == len(candidates)
    assert state.evaluations == len([c for c in candidates if c.solution_id]) >= 1
    assert state.tune_evaluations == len(tunes) == len(evaluators.spares)
    for tune in tunes:  # a variant is its candidate with other tunable values, nothing else
        original, measured = s.store.load_solution(tune.original), s.store.load_solution(tune.solution_id)
        assert measured.sources["axpy.py"] == with_values(original, {**values(original), **tune.values})["axpy.py"]
        assert measured.author == "tuner" and tune.speedup is not None
    assert state.best is not None and values(s.store.load_solution(state.best.solution_id)) == {"BLOCK": 1024, "NUM_WARPS": 2}
    assert state.best.solution_id in {t.solution_id for t in tunes}  # found by idle tuning
    # A candidate waited for at most the variant that held each evaluator when it came; spare work never queued
    # ahead of it (a queue would show as several evaluations ending during one wait).
    assert max(evaluators.ended_in_waits) <= evaluators.size
    # A reader of the log sees every variant; the live view let go of the results of those that never were a best.
    replayed = RunView.of(events, s.store.has_solution)
    assert replayed.tune_evaluations == len(tunes) and all(t.solution_id in replayed.results for t in tunes)
    bests = {e.solution_id for e in events if e.kind == "best"}
    kept = {t.solution_id for t in tunes if t.solution_id in s.view.results}
    assert state.best.solution_id in kept and kept <= bests and len(kept) < len(tunes)


def test_no_idle_tuning_unless_asked(tmp_path):
    assert SearchConfig.model_fields["tune_when_idle"].default is False
    evaluators = Queued(by_tunables(), size=2, seconds=0.02)
    state = run(search(tmp_path, SlowCoder(0.3), evaluators, method="refine", width=1, rounds=2))
    assert state.tune_evaluations == 0 and not evaluators.spares


def test_idle_tuning_starts_where_autotune_left_a_candidate_and_steps_past_variants_that_fail(tmp_path):
    evaluators = Queued(by_tunables(broken={"NUM_WARPS": 2}), size=2, seconds=0.02)
    s = search(tmp_path, SlowCoder(0.8), evaluators, method="refine", width=1, rounds=3, tune_when_idle=True,
               autotune_variants=2)
    state = run(s)
    events = s.store.read_events()
    tuned = [e for e in events if e.kind == "tuned"]
    idle = [e for e in events if isinstance(e, Tune) and e.idle]
    assert tuned and idle
    assert idle[0].original == tuned[0].solution_id  # the climb began at the tuner's choice, not the coder's kernel
    failed = [e for e in idle if not e.result.passed]
    assert failed and all(e.values.get("NUM_WARPS") == 2 or values(s.store.load_solution(e.solution_id))["NUM_WARPS"] == 2
                          for e in failed)
    assert values(s.store.load_solution(state.best.solution_id)) == {"BLOCK": 1024, "NUM_WARPS": 4}


@pytest.mark.slow
def test_idle_tuning_from_the_command_line_with_a_model_that_takes_its_time(tmp_path: Path) -> None:
    """`ksearch run --tune-when-idle --no-ray` against the stand-in on loopback (litellm's real client, replies of
    0.5-1 s) and the sandboxed evaluator (real Triton kernels in the interpreter): the evaluator tunes while the
    coder waits, and the run says so."""
    from cli_runner import ksearch
    from test_provider_habits import QUIET

    from ksearch_ray.policies.standin.habits import Habits
    from ksearch_ray.policies.standin.server import StandIn
    from ksearch_ray.store import RunStore

    with StandIn(habits=Habits(**QUIET, latency_s=(0.5, 1.0))) as server:
        done = ksearch(tmp_path, "run", "--task", "toy_axpy", "--task-dir", str(DATA), "--device", "cpu", "--no-ray",
                       "--model", "hosted_vllm/standin", "--api-base", server.api_base, "--from-solution", "triton_seed",
                       "--rounds", "3", "--width", "1", "--tune-when-idle", "--noise-repeats", "1",
                       "--confirm-repeats", "0", "--run-dir", "run", "--no-progress")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    events = RunStore(tmp_path / "run").read_events()
    idle = [e for e in events if isinstance(e, Tune)]
    assert idle and all(e.idle and e.result.timed for e in idle if e.result.passed)
    said = done.stdout + done.stderr
    assert f"idle tuning: {len(idle)} variant(s) measured by evaluators that would have idled" in said


def test_a_climb_on_a_local_optimum_looks_farther_out_nearest_first(tmp_path):
    from ksearch_ray.run.idle_tuning import _nearest_first
    from ksearch_ray.taskspec.tunables import declared_tunables

    seed = find_task("toy_axpy", [str(DATA)]).solution("triton_seed")
    grid = {n: t.choices for n, t in declared_tunables(seed).items()}
    start = {"BLOCK": 256, "NUM_WARPS": 4}
    order = list(_nearest_first(seed, start))
    distance = [sum(abs(grid[n].index(v[n]) - grid[n].index(start[n])) for n in grid) for v in order]
    assert len(order) == len({repr(sorted(v.items())) for v in order}) == 5 * 3 - 1 and start not in order
    assert distance == sorted(distance) and distance[0] == 1

    # Every neighbour of BLOCK 256 / 4 warps is slower; two steps out, BLOCK 1024 is much faster.
    def judge(solution: Solution):  # type: ignore[no-untyped-def]
        if "axpy.py" not in solution.sources:
            return 1.0, Status.PASSED, ""
        v = values(solution)
        return (0.1 if v == {"BLOCK": 1024, "NUM_WARPS": 4} else 0.5 if v == start else 0.8), Status.PASSED, ""

    s = search(tmp_path, SlowCoder(0.8), Queued(judge, size=2, seconds=0.02), method="refine", width=1, rounds=2,
               tune_when_idle=True)
    state = run(s)
    assert values(s.store.load_solution(state.best.solution_id)) == {"BLOCK": 1024, "NUM_WARPS": 4}
    assert state.best.solution_id in {e.solution_id for e in s.store.read_events() if isinstance(e, Tune) and e.idle}
