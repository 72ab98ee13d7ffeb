"""Both figures on a real GPU (skipped without one): the call figure reproduces an independent
GPUMode-style loop, and a worker's memory stays bounded through any number of graph captures.

Run on the H200 with `pytest -m gpu tests/test_two_timings_gpu.py -x`.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from ksearch_ray.evaluation.evaluator import Evaluator
from ksearch_ray.evaluation.sandbox.isolation import Isolation
from ksearch_ray.evaluation.settings import Limits, TimingPolicy
from ksearch_ray.models import EvalResult, Status
from ksearch_ray.taskspec.task import Task, find_task

pytestmark = pytest.mark.gpu
DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).parent.parent
ROUNDS = 3  # evaluations and fresh loop processes of `triton_fused` in the reproduction check, alternating


def gpumode_loop(solution: str) -> dict[str, dict[str, float]]:
    """Per benchmark workload from tests/gpumode_loop.py (GPUMode's leaderboard loop, written plainly there),
    run in a fresh process as eval.py runs its benchmarks: mean_ms, median_ms, host_median_ms, count."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    done = subprocess.run([sys.executable, str(Path(__file__).parent / "gpumode_loop.py"), "--task", "trimul",
                           "--solution", solution], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def evaluator_rows(result: EvalResult) -> dict[str, dict[str, float]]:
    """The evaluator's call figure per workload, in gpumode_loop.py's terms."""
    rows = {}
    for w in result.workloads:
        t = w.call_timing
        assert t is not None and t.host_median_ms is not None, w.workload
        rows[w.workload] = {"mean_ms": t.mean_ms, "median_ms": t.median_ms, "host_median_ms": t.host_median_ms,
                            "count": t.count, "kernel_ms": w.kernel_ms or 0.0}
    return rows


def pooled(runs: list[dict[str, dict[str, float]]], key: str) -> dict[str, float]:
    """Per workload, the mean over runs (processes) of one statistic."""
    return {name: statistics.fmean(run[name][key] for run in runs) for name in runs[0]}


def agreement(ours: list[dict[str, dict[str, float]]], theirs: list[dict[str, dict[str, float]]]) -> tuple[float, list[str]]:
    """(geomean over workloads of pooled evaluator mean / pooled loop mean, the lines that show it)."""
    names = list(ours[0])
    assert all(run.keys() == set(names) for run in ours + theirs)
    lines = []
    for r, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        lines.append(f"  round {r + 1}: geomean of means {geomean([a[k]['mean_ms'] for k in names]):.4g} against "
                     f"{geomean([b[k]['mean_ms'] for k in names]):.4g} ms "
                     f"({geomean([a[k]['mean_ms'] / b[k]['mean_ms'] for k in names]) - 1:+.1%}), of medians "
                     f"{geomean([a[k]['median_ms'] / b[k]['median_ms'] for k in names]) - 1:+.1%}, of host medians "
                     f"{geomean([a[k]['host_median_ms'] / b[k]['host_median_ms'] for k in names]) - 1:+.1%}")
    stats = {key: (pooled(ours, key), pooled(theirs, key)) for key in ("mean_ms", "median_ms", "host_median_ms")}
    ratio = {key: geomean([a[k] / b[k] for k in names]) for key, (a, b) in stats.items()}
    lines.append(f"  pooled over {len(ours)} round(s): means {ratio['mean_ms'] - 1:+.1%}, medians "
                 f"{ratio['median_ms'] - 1:+.1%}, host medians {ratio['host_median_ms'] - 1:+.1%}")
    lines.append(f"  {'workload':<36} {'evaluator mean / median / host':>31} {'loop mean / median / host':>27} "
                 f"{'mean':>7} {'median':>7}  kernel  (ms, pooled)")
    (am, bm), (ad, bd), (ah, bh) = stats["mean_ms"], stats["median_ms"], stats["host_median_ms"]
    kernel = pooled(ours, "kernel_ms")
    for k in names:
        lines.append(f"  {k:<36} {am[k]:>9.4f} {ad[k]:>9.4f} {ah[k]:>9.4f}   {bm[k]:>7.4f} {bd[k]:>7.4f} {bh[k]:>7.4f}"
                     f"   {am[k] / bm[k] - 1:>+6.1%} {ad[k] / bd[k] - 1:>+6.1%}  {kernel[k]:.4f}")
    return ratio["mean_ms"], lines


def test_gpu_the_call_figure_reproduces_a_gpumode_style_loop_on_trimul(tmp_path):
    """The evaluator's call figure (GPUMode's leaderboard rule: fresh inputs, every output checked) against
    tests/gpumode_loop.py in fresh processes, alternating, ROUNDS times for `triton_fused` (whose small
    shapes are host-bound: one process's host ran them 10-35 % faster than another's on the H200) and once
    for the baseline (device-bound). The figure that must agree is the mean (GPUMode's), pooled per workload
    over the rounds; medians and the calls' host times are shown beside it, per workload and per round."""
    trimul = find_task("trimul")
    objective = trimul.definition.objective
    assert objective.timed == "call" and not objective.flush_l2 and not objective.recheck  # on below, as the loop
    rounds = {"triton_fused": ROUNDS, trimul.definition.baseline: 1}
    ours: dict[str, list[dict[str, dict[str, float]]]] = {name: [] for name in rounds}
    theirs: dict[str, list[dict[str, dict[str, float]]]] = {name: [] for name in rounds}
    ev = Evaluator("cuda", isolation=Isolation.REQUIRE, timing=TimingPolicy(recheck=True))  # as the loop checks
    try:
        for name, count in rounds.items():
            for r in range(count):
                first_loop = r % 2 == 1  # alternate which goes first: drift over the call falls on both
                if first_loop:
                    theirs[name].append(gpumode_loop(name))
                result = ev.evaluate(trimul, trimul.solution(name))
                assert result.status is Status.PASSED, (name, result.message, result.log[-1000:])
                assert result.objective == "call"
                ours[name].append(evaluator_rows(result))
                if not first_loop:
                    theirs[name].append(gpumode_loop(name))
    finally:
        ev.close()
    lines, ratios = [], {}
    for name in rounds:
        ratios[name], shown = agreement(ours[name], theirs[name])
        lines += [f"{name}: evaluator call {ratios[name] - 1:+.1%} against the GPUMode-style loop (pooled means)", *shown]
    text = "\n".join(lines)
    print(text)
    print(json.dumps({"evaluator": ours, "loop": theirs}))
    assert all(abs(r - 1) <= 0.03 for r in ratios.values()), text


def test_gpu_worker_memory_stays_bounded_through_a_capture_per_input_set(tmp_path):
    """A trusted solution with a per-input `prepare` is captured again for every fresh input set; the
    graphs it leaves behind must go back to the device (they held 127.8 GiB on MLA prefill `all`)."""
    root = tmp_path / "toy_prepared"
    shutil.copytree(DATA / "toy", root)
    (root / "workloads.jsonl").write_text(json.dumps({"name": "n16m", "axes": {"N": 1 << 24}, "params": {"seed": 1}}) + "\n")
    sol = root / "solutions" / "planned"
    sol.mkdir()
    (sol / "planned.py").write_text(
        "def plan(x, a, b):\n    pass\n\n"
        "def run(x, a, b):\n    return (a * x + b) * 1.0\n")
    (sol / "solution.json").write_text(json.dumps({
        "name": "planned", "language": "python", "entry_file": "planned.py", "entry_point": "run", "prepare": "plan"}))
    task = Task.load(root)
    free0, total = torch.cuda.mem_get_info()
    peak = [0]
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            free, _ = torch.cuda.mem_get_info()
            peak[0] = max(peak[0], free0 - free)
            time.sleep(0.005)

    ev = Evaluator("cuda", limits=Limits(idle=120), timing=TimingPolicy(min_calls=100, max_calls=100, target_rel_err=1e-9))
    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        result = ev.evaluate(task, task.solution("planned"), mode="fresh")
    finally:
        done.set()
        thread.join()
        ev.close()
    assert result.status is Status.PASSED, (result.message, result.log[-1000:])
    assert result.prepared_untimed
    [w] = result.workloads
    assert w.kernel_timing is not None and w.kernel_timing.count == 100  # 100 input sets, 100 captures
    # One capture's outputs are 64 MiB: 100 kept would be 6.4 GiB beside the inputs and the reference.
    assert peak[0] < 3 * 2**30, f"device memory grew by {peak[0] / 2**30:.2f} GiB of {total / 2**30:.0f}"


@pytest.mark.parametrize("objective", ["kernel", "call"])
def test_gpu_side_streams_and_memorized_answers_are_caught_under_both_objectives(objective, tmp_path):
    toy = Task.load(DATA / "toy")
    from ksearch_ray.taskspec.task import solution_from_file

    ev = Evaluator("cuda", tmp_path, timing=TimingPolicy(objective=objective))
    try:
        side = ev.evaluate(toy, solution_from_file(DATA / "candidates" / "side_stream.py", toy))
        memo = ev.evaluate(toy, solution_from_file(DATA / "candidates" / "memorize.py", toy))
        thread = ev.evaluate(toy, solution_from_file(DATA / "candidates" / "leave_thread.py", toy))
    finally:
        ev.close()
    # Work left on a side stream is seen by the device-busy check after a timed call (INTEGRITY_VIOLATION), or,
    # when the call's own re-check comes first, its late write fails the output (INCORRECT_NUMERICAL, seen on the
    # H200 under the call objective): either way it does not pass.
    assert side.status in (Status.INTEGRITY_VIOLATION, Status.INCORRECT_NUMERICAL), side.message
    assert side.status is not Status.INTEGRITY_VIOLATION or "escapes the timing stream" in side.message, side.message
    # Caught as wrong either way; at which check first (a correctness call or a timed call's re-check) varied
    # between two H200 runs.
    assert memo.status is Status.INCORRECT_NUMERICAL, memo.message
    assert thread.status is Status.INTEGRITY_VIOLATION, thread.message


