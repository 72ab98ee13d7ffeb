"""Noise that means something on every device: a warm-up before a session's first measurement, the
baseline measured twice in every session, outliers out of the noise estimate, the median baseline, and
re-timing limits that follow the candidate's own clock."""

from __future__ import annotations

import asyncio

import pytest
from local_backends import (
    DATA,
    FakeEvaluators,
    ScriptedPolicy,
    idea_planner,
    local_search,
    result,
    toy_kernel,
)

from ksearch_ray.evaluation.evaluator import Evaluator
from ksearch_ray.evaluation.settings import Limits
from ksearch_ray.events import Baseline, Resume
from ksearch_ray.measure import noise_of
from ksearch_ray.models import EvalResult, Solution, Status
from ksearch_ray.policies.contract import CodeReply
from ksearch_ray.taskspec.task import Task

BASELINE, SEED = "good", "triton_seed"


class Timed(FakeEvaluators):
    """ms per solution name, one figure per measurement in turn (the last repeated)."""

    def __init__(self, table: dict[str, list[float]]):
        super().__init__(lambda _s: (None, Status.PASSED, ""))
        self.table, self.seen = table, {}  # type: ignore[var-annotated]

    async def evaluate_on(self, index: int, solution: Solution, workload_set: str) -> EvalResult:
        await asyncio.sleep(0)
        self.done += 1
        n = self.seen.get(solution.name, 0)
        self.seen[solution.name] = n + 1
        figures = self.table.get(solution.name, [1.0])
        return result(solution, figures[min(n, len(figures) - 1)])


def coder() -> ScriptedPolicy:
    tags = iter(range(1, 1000))
    return ScriptedPolicy(code=lambda _r: CodeReply(solution=toy_kernel(f"k{next(tags)}")))


def test_a_sessions_first_measurement_is_a_warm_up_and_not_part_of_the_noise(tmp_path):
    # A fresh sandbox's first run of the baseline is 10x slow (72.8 against 6.8 ms, as measured on a CPU).
    evaluators = Timed({BASELINE: [72.8, 6.8, 6.9], SEED: [13.6, 13.8], "k1": [6.8]})
    search = local_search(tmp_path, idea_planner(), coder(), evaluators, rounds=1, noise_repeats=2, warmup=True)
    view = asyncio.run(search.run())
    baselines = [e.result.score for e in search.store.read_events() if isinstance(e, Baseline)]
    assert baselines == [6.8, 6.9]
    noise = view.noise()
    assert noise is not None and noise.value < 0.1, noise
    assert view.seed is not None and view.seed.speedup == pytest.approx(6.9 / 13.6, rel=0.02)


def test_a_resumed_session_measures_its_baseline_twice_and_takes_the_median(tmp_path):
    first = local_search(tmp_path, idea_planner(), coder(), Timed({SEED: [2.0]}), rounds=1, noise_repeats=2)
    asyncio.run(first.run())
    first.store.close()
    # The next session's first baseline measurement is the slow one (15.9 against 8.0 ms).
    second = local_search(tmp_path, idea_planner(), coder(), Timed({BASELINE: [15.9, 8.0], SEED: [16.0]}),
                          rounds=2, noise_repeats=2)
    asyncio.run(second.run())
    events = second.store.read_events()
    resumed = next(e.seq for e in events if isinstance(e, Resume))
    again = [e.result.score for e in events if isinstance(e, Baseline) and e.seq > resumed]
    assert again == [15.9, 8.0]
    # Speedups of the session are against the faster of the two, not against the slow one (which made
    # "new best: 0.0335x" of a 0.0039x seed): the best (1 ms) re-measured is 8x, not 15.9x.
    assert second.view.session_baselines[0].score == 8.0
    assert second.view.best is not None and second.view.best.speedup == pytest.approx(8.0, rel=0.02)


def test_one_wild_measurement_among_several_does_not_make_the_noise():
    noise = noise_of({"baseline": [72.8, 6.8, 6.9, 7.0], "seed": [13.6, 13.9, 13.7]})
    assert noise is not None and noise.value < 0.1, noise


def test_a_re_timing_waits_by_the_candidates_own_clock_not_only_the_baselines(tmp_path):
    """The PyTorch baseline's timing waits take 0.16 s; a candidate in Triton's interpreter takes 6 s per
    wait: its re-timing was refused at 20 s (10 x 0.16 s, the floor); now its limit is 10 x its own 6 s."""
    toy = Task.load(DATA / "toy")
    ev = Evaluator("cpu", tmp_path, limits=Limits(idle=180, hang_floor=20, hang_factor=10), start=False)
    try:
        ev.learn_stage_times(toy, _waits(toy, {"correctness": 0.2, "warmup": 0.16, "timing": 0.16}))
        assert ev.wait_limit(toy, "benchmarks", "timing").seconds == 20  # the baseline's clock: the floor
        own = {"correctness": 1.0, "warmup": 6.0, "timing": 3.0}
        limit = ev.wait_limit(toy, "benchmarks", "timing", own_waits=own)
        assert limit.seconds == 60 and "this candidate's own" in limit.why
        assert ev.wait_limit(toy, "benchmarks", "correctness", own_waits=own).seconds == 20  # the floor still
        assert ev.wait_limit(toy, "benchmarks", "timing", own_waits={"timing": 100.0}).seconds == 180  # the ceiling
    finally:
        ev.close()


def _waits(task: Task, waits: dict[str, float]) -> EvalResult:
    out = result(task.baseline(), 1.0)
    return out.model_copy(update={"stage_waits": waits})


def test_a_candidate_in_another_language_than_the_baseline_is_limited_by_its_languages_clock(tmp_path):
    """The TriMul seed (Triton, in the CPU interpreter) timed out in its first correctness check: 'no progress
    for 20 s (the limit: 10 x the baseline's 0.8 s, at least 20 s)', the baseline being PyTorch. The first
    measurement of a language has nothing to scale from (the ceiling); later ones scale from its own."""
    toy = Task.load(DATA / "toy")
    seed = toy.solution(SEED)
    ev = Evaluator("cpu", tmp_path / "sb", limits=Limits(setup=120, build_python=60, idle=180, hang_floor=20, hang_factor=10))
    try:
        assert ev.evaluate(toy, toy.baseline()).passed  # learns the baseline's (Python's) clock
        assert ev.wait_limit(toy, "benchmarks", "correctness").seconds == 20
        first = ev._language_waits(toy, seed)
        assert first == {} and ev._language_waits(toy, toy.baseline()) is None
        assert ev.wait_limit(toy, "benchmarks", "correctness", language_waits=first).seconds == 180
        assert ev.evaluate(toy, seed).passed
        learned = ev._language_waits(toy, seed)
        assert learned and "correctness" in learned
        slow = {"correctness": 6.0}
        assert ev.wait_limit(toy, "benchmarks", "correctness", language_waits=slow).seconds == 60
        assert ev.wait_limit(toy, "benchmarks", "correctness", language_waits={"correctness": 0.1}).seconds == 20
    finally:
        ev.close()
