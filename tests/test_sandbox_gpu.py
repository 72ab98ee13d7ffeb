"""The sandbox's isolation and measurement checks on a real GPU (skipped without one).

Run by experiments/gpu/h200_integrity.sh on the H200: GPU access through the namespaces, the CUDA
path of the native stopwatch, the physical floor of a known GPU, CUDA-graph re-timing, and a
TF32-switching TriMul kernel in both timing modes; every test under both objectives (kernel, call).
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from ksearch_ray.evaluation.evaluator import Evaluator
from ksearch_ray.evaluation.floors import peaks_for
from ksearch_ray.evaluation.retime import RetimeMethod
from ksearch_ray.evaluation.sandbox.isolation import Isolation
from ksearch_ray.evaluation.settings import Limits, TimingPolicy
from ksearch_ray.models import Status
from ksearch_ray.taskspec.task import Task, find_task, solution_from_file

pytestmark = pytest.mark.gpu
DATA = Path(__file__).parent / "data"
CANDIDATES = DATA / "candidates"


@pytest.fixture(scope="module")
def toy() -> Task:
    return Task.load(DATA / "toy")


@pytest.fixture(scope="module", params=["kernel", "call"])
def gpu(toy, request):
    """An evaluator scoring by each objective in turn: every check below must hold under both."""
    ev = Evaluator("cuda", limits=Limits(idle=120, hang_floor=5), isolation=Isolation.REQUIRE,
                   timing=TimingPolicy(objective=request.param))
    assert ev.evaluate(toy, toy.baseline()).passed  # the baseline's waits scale the limits
    yield ev
    ev.close()


def hostile(task: Task, name: str, target: str, tmp_path: Path):
    path = tmp_path / f"{name}.py"
    path.write_text((CANDIDATES / f"{name}.py").read_text().replace("@TARGET@", target))
    return solution_from_file(path, task)


def test_gpu_works_inside_the_namespaces_and_the_floor_knows_this_gpu(gpu, toy):
    assert gpu.sandbox.report.isolated
    result = gpu.evaluate(toy, toy.baseline())
    assert result.status is Status.PASSED, (result.message, result.log[-1000:])
    assert all(w.timing and w.timing.clock == "cuda_events" for w in result.workloads)
    assert gpu.peaks is not None and gpu.peaks == peaks_for(result.device_name)


def test_gpu_outputs_reach_the_judge_in_device_memory_and_both_figures_are_timed(gpu, toy):
    result = gpu.evaluate(toy, toy.baseline())
    assert result.passed, result.message
    assert result.transport == "cuda_vmm"
    assert result.objective == gpu.timing.objective
    for w in result.workloads:
        assert w.kernel_timing and w.kernel_timing.method == "graph_replay", w
        assert w.call_timing and w.call_timing.method == "calls", w
        assert w.timing == (w.kernel_timing if result.objective == "kernel" else w.call_timing)
        assert w.call_timing.robust_rel_err is not None and w.kernel_timing.robust_rel_err is not None
    assert "CUDA graph" in result.timing_rule and f"the score uses the {result.objective} figure" in result.timing_rule


def test_gpu_a_handed_over_buffer_cannot_be_rewritten_from_a_side_stream(gpu, toy):
    result = gpu.evaluate(toy, solution_from_file(CANDIDATES / "overwrite_handover.py", toy), workload_set="tests")
    assert result.status is Status.INCORRECT_NUMERICAL, (result.message, result.log[-800:])
    assert result.message.startswith("n4096")


def test_gpu_a_spinning_kernel_is_judged_after_the_scaled_limit_and_the_gpu_recovers(gpu, toy):
    result = gpu.evaluate(toy, solution_from_file(CANDIDATES / "spin_kernel.py", toy))
    assert result.status is Status.TIMEOUT, (result.message, result.log[-800:])
    assert "x the baseline's" in result.message and result.seconds < 60
    assert gpu.evaluate(toy, toy.baseline()).passed


def test_gpu_candidates_cannot_reach_home_or_loopback(gpu, toy, tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("s3cr3t")
    planted = tmp_path / "planted"
    assert gpu.evaluate(toy, hostile(toy, "read_home", str(secret), tmp_path)).status is Status.PASSED
    assert gpu.evaluate(toy, hostile(toy, "write_home", str(planted), tmp_path)).status is Status.PASSED
    assert not planted.exists()
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        server.settimeout(0.5)
        gpu.evaluate(toy, hostile(toy, "loopback", str(server.getsockname()[1]), tmp_path))
        with pytest.raises(TimeoutError):
            server.accept()


@pytest.mark.parametrize("name", ["rescale_frames", "gc_reach"])
def test_gpu_python_reach_finds_no_timings(gpu, toy, tmp_path, name):
    honest = gpu.evaluate(toy, hostile(toy, name, "honest", tmp_path))
    cheat = gpu.evaluate(toy, hostile(toy, name, "cheat", tmp_path))
    assert honest.passed and cheat.passed, (honest.message, cheat.message)
    for h, c in zip(honest.workloads, cheat.workloads, strict=True):
        assert h.timing and c.timing and c.timing.mean_ms > h.timing.mean_ms / 5


@pytest.mark.parametrize("name", ["module_globals", "native_reach"])
def test_gpu_stopwatch_tampering_is_caught(gpu, toy, name):
    assert gpu.evaluate(toy, solution_from_file(CANDIDATES / f"{name}.py", toy)).status is Status.INTEGRITY_VIOLATION


def test_gpu_retime_follows_the_objective_and_agrees(gpu, toy):
    primary = gpu.evaluate(toy, toy.baseline())
    check = gpu.retime(toy, toy.baseline(), primary)
    assert check.agreed, check.message
    expected = RetimeMethod.GRAPH_REPLAY if gpu.timing.objective == "kernel" else RetimeMethod.CALLS
    assert {w.method for w in check.workloads} == {expected}


@pytest.mark.parametrize("mode", ["fresh", "reuse"])
def test_gpu_trimul_kernel_that_switches_tf32_passes(gpu, mode):
    trimul = find_task("trimul")
    result = gpu.evaluate(trimul, solution_from_file(CANDIDATES / "trimul_tf32.py", trimul), workload_set="smoke", mode=mode)
    assert result.status is Status.PASSED, (result.message, result.log[-1000:])
