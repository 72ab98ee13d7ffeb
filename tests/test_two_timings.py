"""Two figures per workload (the graph-replayed kernel and the call), the objective that scores,
and the evaluator's own failures as statuses.

On the CPU path there is no graph replay: the call (the interpreter's) is the only figure, whatever
the objective. The GPU half of this lives in test_two_timings_gpu.py and test_sandbox_gpu.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from cli_runner import ksearch
from rich.console import Console

from ksearch_ray.analysis.records import figures
from ksearch_ray.evaluation.evaluator import Evaluator
from ksearch_ray.evaluation.judge import Judge
from ksearch_ray.evaluation.settings import Limits, TimingPolicy
from ksearch_ray.evaluation.timing import time_command
from ksearch_ray.evaluation.worker_session import RunSpec
from ksearch_ray.models import EvalResult, Status, Timing, WorkloadResult
from ksearch_ray.report.console import print_eval
from ksearch_ray.taskspec.flashinfer_traces import Environment, trace_records
from ksearch_ray.taskspec.task import Task, find_task, solution_from_file

DATA = Path(__file__).parent / "data"
CANDIDATES = DATA / "candidates"


@pytest.fixture(scope="module")
def toy() -> Task:
    return Task.load(DATA / "toy")


@pytest.fixture(scope="module")
def evaluator(tmp_path_factory: pytest.TempPathFactory):
    """No baseline evaluated: nothing scales its limits but the candidate itself."""
    ev = Evaluator("cpu", tmp_path_factory.mktemp("sandbox"),
                   limits=Limits(setup=120, build_python=60, idle=120, hang_floor=2, hang_margin=3, total=240),
                   timing=TimingPolicy(max_calls=6, max_total_s=0.5))
    yield ev
    ev.close()


def broken_reference_task(toy: Task, tmp_path: Path, error: str) -> Task:
    root = tmp_path / "toy_broken"
    shutil.copytree(toy.root, root)
    ref = root / "reference.py"
    ref.write_text(ref.read_text().replace(
        'def reference(inputs):\n', f'def reference(inputs):\n    raise RuntimeError({error!r})\n'))
    task = Task.load(root)
    # The judge's own boundary is the trusted path (a bundle of the package computes its references in the
    # evaluator); a bundle from elsewhere computes them in a sandboxed worker, whose failures are not verdicts
    # (tests/test_untrusted_tasks.py).
    task.__dict__["trusted"] = True
    return task


def honest(task: Task, tmp_path: Path):
    """Not the task's baseline, so evaluating it teaches the evaluator's limits nothing."""
    path = tmp_path / "axpy.py"
    path.write_text("def run(x, a, b):\n    return a * x + b\n")
    return solution_from_file(path, task)


def test_the_cpu_call_is_the_only_figure_and_scores_whatever_the_objective(evaluator, toy, tmp_path):
    assert toy.definition.objective.timed == "call"
    result = evaluator.evaluate(toy, honest(toy, tmp_path))
    assert result.passed, result.message
    assert result.objective == "call"
    for w in result.workloads:
        assert w.kernel_timing is None and w.call_timing is not None and w.timing == w.call_timing
        assert w.call_timing.method == "calls" and w.call_timing.robust_rel_err is not None
    kernel = Evaluator("cpu", evaluator.work_root / "k", timing=TimingPolicy(max_calls=4, max_total_s=0.3, objective="kernel"),
                       start=False)
    assert kernel.objective_for(toy) == "kernel"
    assert "no kernel figure" in kernel.timing.rule("cpu", "fresh", objective="kernel")
    kernel.close()


def test_a_recheck_judges_every_timed_call_before_the_next_as_gpumode_leaderboard_does(evaluator, toy, tmp_path):
    """GPUMode's leaderboard checks each timed call's output; a candidate wrong on one timed call but not
    on the last passes where only the last is checked, and fails where each is."""
    wrong_once = solution_from_file(CANDIDATES / "wrong_once_in_timing.py", toy)
    last_only = evaluator.evaluate(toy, wrong_once)
    assert last_only.status is Status.PASSED, last_only.message
    rechecking = Evaluator("cpu", evaluator.work_root / "recheck",
                           limits=Limits(setup=120, build_python=60, idle=120, hang_floor=2, hang_margin=3, total=240),
                           timing=TimingPolicy(max_calls=6, max_total_s=0.5, recheck=True))
    try:
        caught = rechecking.evaluate(toy, wrong_once)
        fine = rechecking.evaluate(toy, honest(toy, tmp_path))
        reused = rechecking.evaluate(toy, wrong_once, mode="reuse")  # GPUMode's benchmark mode checks once
    finally:
        rechecking.close()
    assert caught.status is Status.INCORRECT_NUMERICAL, caught.message
    assert "n1000 (during timing, call 0)" in caught.message, caught.message
    assert fine.passed, fine.message
    assert "each call's output checked against the reference before the next call" in fine.timing_rule
    assert all(w.call_timing and w.call_timing.count >= 3 for w in fine.workloads)
    assert reused.status is Status.PASSED, reused.message


def test_a_failure_inside_the_judge_is_a_status_and_one_line(toy, tmp_path):
    task = broken_reference_task(toy, tmp_path, "CUDA out of memory. Tried to allocate 2.00 GiB\nmore lines")
    judge = Judge("cpu", 1 << 20)
    try:
        workload = task.workloads("tests", "cpu")[0]
        inputs = task.generate_inputs(workload, 1, "cpu")
        verdict = judge.submit(task, workload, 1, frozenset(), {"y": inputs["a"] * inputs["x"]}).result()
    finally:
        judge.close()
    assert verdict.status is Status.RUNTIME_ERROR
    assert verdict.message == "the judge could not check it: RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"


def test_an_evaluation_whose_judge_fails_ends_in_a_status_not_a_traceback(evaluator, toy, tmp_path):
    task = broken_reference_task(toy, tmp_path, "CUDA error: an illegal memory access was encountered")
    result = evaluator.evaluate(task, task.baseline(), workload_set="tests")
    assert result.status is Status.RUNTIME_ERROR
    assert "\n" not in result.message and "the judge could not check it" in result.message, result.message


def test_a_hang_is_judged_soon_after_the_expected_wait_without_any_baseline(evaluator, toy):
    result = evaluator.evaluate(toy, solution_from_file(CANDIDATES / "hang_after_checks.py", toy))
    assert result.status is Status.TIMEOUT, result.message
    assert "during warm-up" in result.message and "this candidate's longest correctness wait" in result.message
    assert result.seconds < 60  # the ceiling (120 s) never came into it


def test_wait_limits_stay_within_the_margin_beyond_the_expected_wait(toy, tmp_path):
    ev = Evaluator("cpu", tmp_path, limits=Limits(idle=500, hang_floor=5, hang_factor=10, hang_margin=30), start=False)
    try:
        base = EvalResult(solution_id="b", solution_name="good", task=toy.name, status=Status.PASSED,
                          workload_set="benchmarks", mode="fresh", device="cpu",
                          stage_waits={"correctness": 2.0, "warmup": 100.0})
        ev.learn_stage_times(toy, base)
        assert ev.wait_limit(toy, "benchmarks", "correctness").seconds == 20  # 10 x 2 s
        assert ev.wait_limit(toy, "benchmarks", "warmup").seconds == 130  # 100 s + 30, not 10 x 100
        assert ev.wait_limit(toy, "benchmarks", "timing", session_waits={"correctness": 1.0}).seconds == 20  # 2 calls + 30 > floor
        assert ev.wait_limit(toy, "benchmarks", "timing").seconds == 500  # nothing known: the ceiling
    finally:
        ev.close()


def test_each_bundled_task_states_its_objective_after_its_source_benchmark(toy):
    trimul = find_task("trimul")
    assert trimul.definition.objective.timed == "call" and not trimul.definition.objective.flush_l2
    # eval.py's leaderboard mode checks every timed call's output; on the H200 that took an evaluation of
    # the benchmark set from 3 s to 10 s, so it is evaluation.timing.recheck's to ask for, and the rule says so.
    assert not trimul.definition.objective.recheck and "evaluation.timing.recheck: true" in trimul.definition.objective.source
    assert "eval.py" in trimul.definition.objective.source
    gqa = find_task("gqa_paged_decode_h32_kv4_d128_ps1")
    assert gqa.definition.objective.timed == "call" and gqa.definition.objective.flush_l2
    assert "#127" in gqa.definition.objective.source and "#427" in gqa.definition.objective.source
    # The L2 is flushed only where the task's rule flushes (and the policy allows it).
    policy = TimingPolicy()
    for task, flush in ((trimul, False), (gqa, True)):
        run = RunSpec(task, task.baseline(), "cuda", frozenset(), "fresh", [], [], [],
                      flush_l2=policy.flush_l2 and task.definition.objective.flush_l2,
                      recheck=True)
        assert time_command(run, policy).flush_l2 is flush
        assert time_command(run, policy).recheck  # carried to the worker's command where asked


def timing(ms: float, method: str) -> Timing:
    return Timing(mean_ms=ms, median_ms=ms, min_ms=ms, std_ms=0.0, count=5, wall_median_ms=ms, clock="cuda_events",
                  method=method, rel_err=0.001, robust_rel_err=0.002)  # type: ignore[arg-type]


def two_figure_result(task: Task, name: str, kernel: float, call: float, objective: str) -> EvalResult:
    kt, ct = timing(kernel, "graph_replay"), timing(call, "calls")
    w = WorkloadResult(workload=task.workloads("feedback", "cuda")[0].name, status=Status.PASSED, kernel_timing=kt,
                       call_timing=ct, timing=kt if objective == "kernel" else ct)
    return EvalResult(solution_id=name, solution_name=name, task=task.name, status=Status.PASSED, workload_set="feedback",
                      mode="fresh", device="cuda", objective=objective, workloads=[w], timed=True,  # type: ignore[arg-type]
                      score=w.timing.mean_ms if w.timing else None, score_kind="geomean of mean latency (ms)")


def test_both_figures_reach_the_table_the_trace_and_the_analysis():
    gqa = find_task("gqa_paged_decode_h32_kv4_d128_ps1")
    cand = two_figure_result(gqa, "fast_kernel", kernel=1.0, call=4.0, objective="call")
    base = two_figure_result(gqa, "library", kernel=2.0, call=2.0, objective="call")
    console = Console(record=True, width=250)
    print_eval(console, cand, base, 0.5)
    text = console.export_text()
    assert "kernel ms" in text and "call ms *" in text and "speedup (kernel)" in text
    assert "0.500" in text and "2.000" in text  # the call's speedup, and the kernel's beside it
    assert "the kernel figure beside it: geomean 1 ms" in text
    env = Environment(hardware="NVIDIA H200")
    [trace] = trace_records(gqa, "fast_kernel", cand, baseline=base, environment=env, when=0.0)
    perf = trace["evaluation"]["performance"]
    assert perf["latency_ms"] == 4.0 and perf["reference_latency_ms"] == 2.0 and perf["kernel_ms"] == 1.0
    assert figures(cand) == {"objective": "call", "kernel_ms": 1.0, "call_ms": 4.0}


def test_eval_says_which_objective_is_in_force_and_refuses_an_unknown_one(tmp_path):
    bad = ksearch(tmp_path, "eval", "good", "--task", str(DATA / "toy"), "--device", "cpu", "--objective", "wall")
    assert bad.returncode == 2 and "--objective must be kernel or call, not 'wall'" in bad.stderr
    assert "Traceback" not in bad.stderr
    done = ksearch(tmp_path, "eval", "good", "--task", str(DATA / "toy"), "--device", "cpu", "--objective", "kernel",
                   "--workloads", "tests", "--json")
    assert done.returncode == 0, done.stderr
    assert "objective: kernel (set by --objective); on the CPU there is no graph replay" in done.stderr
    payload = json.loads(done.stdout)
    assert payload["objective"] == "kernel" and payload["result"]["objective"] == "kernel"
