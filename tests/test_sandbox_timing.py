"""Hostile candidates against the measurements, and candidates whose own numeric settings are legal.

Timings come from the native stopwatch through a pipe to the evaluator, so what a candidate
reaches from Python (its callers' frames, the garbage collector, the harness's module globals)
holds no timings to rescale; a candidate that drives the stopwatch itself is caught; times below
the physical floor are refused; and Evaluator.retime measures again from outside the worker.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ksearch_ray.evaluation.evaluator import Evaluator
from ksearch_ray.evaluation.floors import DevicePeaks
from ksearch_ray.evaluation.retime import RetimeMethod
from ksearch_ray.evaluation.settings import Limits, TimingPolicy
from ksearch_ray.models import Status
from ksearch_ray.taskspec.task import Task, solution_from_file

DATA = Path(__file__).parent / "data"
CANDIDATES = DATA / "candidates"


@pytest.fixture(scope="module")
def toy() -> Task:
    return Task.load(DATA / "toy")


@pytest.fixture(scope="module")
def evaluator():
    ev = Evaluator("cpu", limits=Limits(setup=120, build_python=60, idle=20, total=120),
                   timing=TimingPolicy(max_calls=8, max_total_s=0.5))
    yield ev
    ev.close()


def candidate(task: Task, name: str, target: str, tmp_path: Path):
    path = tmp_path / f"{name}-{target}.py"
    path.write_text((CANDIDATES / f"{name}.py").read_text().replace("@TARGET@", target))
    return solution_from_file(path, task, name=name)


@pytest.mark.parametrize("name", ["rescale_frames", "gc_reach"])
def test_python_reach_into_the_harness_finds_no_timings_to_rescale(evaluator, toy, tmp_path, name):
    honest = evaluator.evaluate(toy, candidate(toy, name, "honest", tmp_path))
    cheat = evaluator.evaluate(toy, candidate(toy, name, "cheat", tmp_path))
    assert honest.status is Status.PASSED and cheat.status is Status.PASSED, (honest.message, cheat.message)
    for h, c in zip(honest.workloads, cheat.workloads, strict=True):
        assert h.timing and c.timing
        # A 1000x rescale that landed would put the cheat far below its honest twin.
        assert c.timing.mean_ms > h.timing.mean_ms / 5, (h.timing, c.timing)


@pytest.mark.parametrize("target", ["generate_inputs", "arguments"])
def test_moving_work_into_the_harness_untimed_task_code_is_caught(evaluator, toy, tmp_path, target):
    """The harness generates each timed call's inputs and packs its arguments in the candidate's process,
    outside the timed window (as eval.py does); a candidate that replaces that task code to compute its
    answers there is an integrity violation, as one that replaces the clocks is."""
    result = evaluator.evaluate(toy, candidate(toy, "work_in_the_generator", target, tmp_path))
    assert result.status is Status.INTEGRITY_VIOLATION, result.message
    assert f"replaced Task.{target}" in result.message, result.message


def test_replacing_the_harness_module_globals_is_caught(evaluator, toy):
    result = evaluator.evaluate(toy, solution_from_file(CANDIDATES / "module_globals.py", toy))
    assert result.status is Status.INTEGRITY_VIOLATION, result.message
    assert "the stopwatch recorded 0" in result.message


def test_driving_the_native_stopwatch_from_the_candidate_is_caught(evaluator, toy):
    result = evaluator.evaluate(toy, solution_from_file(CANDIDATES / "native_reach.py", toy))
    assert result.status is Status.INTEGRITY_VIOLATION, result.message
    assert "stopwatch was driven out of order" in result.message


def test_patched_timers_remain_violations(evaluator, toy):
    result = evaluator.evaluate(toy, solution_from_file(CANDIDATES / "patch_timer.py", toy))
    assert result.status is Status.INTEGRITY_VIOLATION
    assert "replaced time.perf_counter" in result.message


@pytest.mark.parametrize("mode", ["fresh", "reuse"])
def test_a_kernel_that_switches_tf32_and_matmul_precision_passes(evaluator, toy, mode):
    result = evaluator.evaluate(toy, solution_from_file(CANDIDATES / "tf32_switch.py", toy), mode=mode)
    assert result.status is Status.PASSED, result.message
    assert result.score is not None and all(w.timing for w in result.workloads)


def test_times_below_the_physical_floor_are_refused(toy, tmp_path):
    # Peaks no device has (one byte per millisecond): every honest call now "beats physics".
    slow = DevicePeaks("test device", flops_per_s=1e3, bytes_per_s=1e3)
    ev = Evaluator("cpu", tmp_path / "sb", timing=TimingPolicy(max_calls=3), peaks=slow)
    try:
        result = ev.evaluate(toy, toy.baseline())
    finally:
        ev.close()
    assert result.status is Status.INTEGRITY_VIOLATION
    assert "below the physical floor" in result.message


def test_task_cost_formulas_evaluate_over_workload_axes(toy):
    flops, nbytes = toy.workload_cost(toy.workloads("tests")[0])
    assert (flops, nbytes) == (2000.0, 12000.0)


def test_retime_confirms_an_honest_measurement_and_refuses_an_inflated_one(evaluator, toy, tmp_path):
    honest = candidate(toy, "rescale_frames", "honest", tmp_path)  # a millisecond of work per call
    primary = evaluator.evaluate(toy, honest)
    assert primary.status is Status.PASSED
    check = evaluator.retime(toy, honest, primary)
    assert check.agreed, check.message
    assert {w.method for w in check.workloads} == {RetimeMethod.CALLS}
    # Its seconds on the evaluator (a run's busy time counts them): a fresh worker, checks, and the timed batches.
    assert check.seconds is not None and sum(w.retimed_ms * w.reps for w in check.workloads) / 1e3 < check.seconds < 120
    # A primary figure 1000x too fast, as a fooled in-process measurement would report it.
    fooled = primary.model_copy(deep=True)
    for w in fooled.workloads:
        assert w.timing is not None
        w.timing.mean_ms /= 1000
    refused = evaluator.retime(toy, honest, fooled)
    assert not refused.agreed
    assert "below the re-timed" in refused.message
