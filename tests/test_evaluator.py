"""The evaluator against real candidates that fail, crash, hang and cheat, in a real sandbox.

Every candidate here is a file under tests/data/candidates, run through the same zygote and
worker processes a search uses, on the CPU path (Triton interpreter, no GPU).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ksearch_ray.evaluation.evaluator import Evaluator
from ksearch_ray.evaluation.sandbox.isolation import Isolation
from ksearch_ray.evaluation.seeds import derive_seed
from ksearch_ray.evaluation.settings import Limits, TimingPolicy
from ksearch_ray.models import Status
from ksearch_ray.taskspec.task import Task, solution_from_file

DATA = Path(__file__).parent / "data"
CANDIDATES = DATA / "candidates"


@pytest.fixture(scope="module")
def toy() -> Task:
    return Task.load(DATA / "toy")


@pytest.fixture(scope="module")
def evaluator(tmp_path_factory: pytest.TempPathFactory, toy: Task):
    ev = Evaluator(
        "cpu",
        tmp_path_factory.mktemp("sandbox"),
        limits=Limits(setup=120, build_python=60, idle=4, hang_floor=2, total=120),
        timing=TimingPolicy(max_calls=10),
    )
    # As every search does first: the baseline, whose waits scale this evaluator's limits for the task.
    assert ev.evaluate(toy, toy.baseline()).passed
    yield ev
    ev.close()


def evaluate(ev: Evaluator, task: Task, name: str, **kw):
    return ev.evaluate(task, solution_from_file(CANDIDATES / f"{name}.py", task), **kw)


def test_good_candidate_passes_with_timings_and_a_score(evaluator, toy):
    result = evaluator.evaluate(toy, toy.baseline(), workload_set="benchmarks")
    assert result.status is Status.PASSED, result.message
    assert [w.workload for w in result.workloads] == ["n1000", "n4096"]
    assert all(w.timing and w.timing.count >= 3 and w.timing.clock == "host_wall" for w in result.workloads)
    assert all(w.timing and w.timing.method == "calls" for w in result.workloads)  # no graphs on the CPU
    assert result.score is not None and result.score > 0
    # Where the time went, stage by stage, adding up to the whole; and how the calls were timed.
    assert {"start", "build", "correctness", "judging", "warmup", "timing", "judging_timed", "teardown"} <= set(result.stages)
    assert abs(sum(result.stages.values()) - result.seconds) < 0.05 + 0.05 * result.seconds
    assert 0 < result.timed_seconds < result.stages["timing"]
    assert "standard error of the mean" in result.timing_rule and result.transport == "memfd"


@pytest.mark.parametrize(
    ("name", "status", "fragment"),
    [
        ("syntax_error", Status.COMPILE_ERROR, "SyntaxError"),
        ("import_error", Status.COMPILE_ERROR, "module_that_does_not_exist"),
        ("no_entry", Status.COMPILE_ERROR, "no callable `run`"),
        ("runtime_error", Status.RUNTIME_ERROR, "TypeError"),
        ("wrong_shape", Status.INCORRECT_SHAPE, "shape [999]"),
        ("wrong_dtype", Status.INCORRECT_DTYPE, "torch.float64"),
        ("wrong_values", Status.INCORRECT_NUMERICAL, "first value outside tolerance at [7]"),
        ("hang", Status.TIMEOUT, "no progress for 2 s"),
        ("abort", Status.CRASHED, "signal 6"),
        ("segfault", Status.CRASHED, "signal 11"),
        ("exit_early", Status.CRASHED, "called sys.exit(0)"),
    ],
)
def test_each_failure_earns_its_status_with_a_specific_message(evaluator, toy, name, status, fragment):
    result = evaluate(evaluator, toy, name)
    assert result.status is status, (result.message, result.log)
    assert fragment in result.message + result.log


def test_a_hang_is_judged_after_a_multiple_of_the_baselines_wait_not_the_ceiling(evaluator, toy):
    result = evaluate(evaluator, toy, "hang")
    assert result.status is Status.TIMEOUT
    assert "x the baseline's" in result.message and "at least 2 s" in result.message, result.message
    assert result.seconds < evaluator.limits.idle  # the ceiling (4 s) never came into it


def test_wait_limits_scale_with_the_baseline_between_a_floor_and_a_ceiling(toy, tmp_path):
    ev = Evaluator("cpu", tmp_path, limits=Limits(idle=100, hang_floor=5, hang_factor=10, build_cuda=900), start=False)
    try:
        assert ev.wait_limit(toy, "benchmarks", "correctness").seconds == 100  # nothing known: the ceiling
        base = evaluate_result(toy, {"build": 0.2, "correctness": 2.0, "timing": 0.01, "warmup": 50.0})
        ev.learn_stage_times(toy, base)
        assert ev.wait_limit(toy, "benchmarks", "correctness").seconds == 20  # 10 x 2 s
        assert ev.wait_limit(toy, "benchmarks", "timing").seconds == 5  # the floor
        assert ev.wait_limit(toy, "benchmarks", "warmup").seconds == 80  # 50 s + the 30 s margin, not 10 x 50
        assert ev.wait_limit(toy, "smoke", "correctness").seconds == 20  # another set of the task
        assert ev.wait_limit(toy, "benchmarks", "build", compiles=True).seconds == 900  # nvcc: never scaled
        assert ev.wait_limit(toy, "benchmarks", "start").seconds == ev.limits.setup
    finally:
        ev.close()


def evaluate_result(task: Task, waits: dict[str, float]):
    from ksearch_ray.models import EvalResult

    return EvalResult(solution_id="b", solution_name="good", task=task.name, status=Status.PASSED,
                      workload_set="benchmarks", mode="fresh", device="cpu", stage_waits=waits)


def test_an_earlier_workloads_failure_decides_even_when_the_judge_is_still_working(evaluator, toy):
    # Wrong on n1000, killed on n4096 while the judge still compares n1000: the verdict is n1000's.
    result = evaluate(evaluator, toy, "wrong_then_crash", workload_set="tests")
    assert result.status is Status.INCORRECT_NUMERICAL, result.message
    assert result.message.startswith("n1000")


def test_a_reference_is_computed_once_per_input_set(evaluator, toy):
    evaluator.evaluate(toy, toy.baseline(), workload_set="tests")
    misses, hits = evaluator.judge.misses, evaluator.judge.hits
    reference_s, compare_s = evaluator.judge.reference_s, evaluator.judge.compare_s
    assert reference_s > 0 and compare_s > 0
    again = evaluator.evaluate(toy, toy.baseline(), workload_set="tests")
    assert again.passed
    assert evaluator.judge.misses == misses and evaluator.judge.hits == hits + 2
    assert evaluator.judge.compare_s > compare_s  # the judge's seconds, for what `judging` waits on


def test_the_checks_references_stay_cached_past_the_timed_calls(tmp_path, toy):
    """Room for the two check references only, and none for the timed calls': theirs (seeds that depend on
    the stop rule) never push the checks' out, and the next candidate's checks all hit."""
    ev = Evaluator("cpu", tmp_path, limits=Limits(setup=120, build_python=60, idle=4, hang_floor=2, total=120,
                                                  timed_reference_cache_mb=0),
                   timing=TimingPolicy(max_calls=4))
    try:
        ev.judge.cache_bytes = 4 * (1000 + 4096)  # n1000 and n4096, float32
        assert ev.evaluate(toy, toy.baseline(), workload_set="benchmarks").passed
        misses, hits = ev.judge.misses, ev.judge.hits
        assert misses == 4 and hits == 0  # two checks, then each workload's last timed call
        assert ev.evaluate(toy, toy.baseline(), workload_set="benchmarks").passed
        assert ev.judge.hits == 2 and ev.judge.misses == misses + 2
    finally:
        ev.close()


def test_a_timed_calls_reference_is_kept_when_the_stop_rule_ends_at_the_same_call(tmp_path, toy):
    """Every evaluation stops after 3 calls: the last call's inputs are the same each time, and the second
    evaluation's timed references all hit (they are kept apart from the checks', which stay)."""
    ev = Evaluator("cpu", tmp_path, limits=Limits(setup=120, build_python=60, idle=4, hang_floor=2, total=120),
                   timing=TimingPolicy(max_calls=3, min_calls=3))
    try:
        ev.judge.cache_bytes = 4 * (1000 + 4096)  # room for the checks' references only
        assert ev.evaluate(toy, toy.baseline(), workload_set="benchmarks").passed
        assert (ev.judge.misses, ev.judge.hits, ev.judge.timed_hits) == (4, 0, 0)
        assert ev.judge.timed.used == 4 * (1000 + 4096)
        again = ev.evaluate(toy, toy.baseline(), workload_set="benchmarks")
        assert again.passed and [w.call_timing.count for w in again.workloads] == [3, 3]
        assert (ev.judge.misses, ev.judge.hits, ev.judge.timed_hits) == (4, 4, 2)
    finally:
        ev.close()


def test_the_timed_references_cache_keeps_the_input_sets_seen_most_often():
    import torch

    from ksearch_ray.evaluation.judge import FrequentCache

    def ref(n: int) -> dict[str, torch.Tensor]:
        return {"out": torch.zeros(n, dtype=torch.uint8)}

    cache = FrequentCache(budget=100)
    for key in ("a", "a", "b"):  # a seen twice, b once
        if cache.get((key,)) is None:
            assert cache.put((key,), ref(50), 50)
    assert cache.get(("a",)) is not None and cache.used == 100
    # Full: a first sighting is not kept, and pushes nothing out.
    assert cache.get(("c",)) is None and not cache.put(("c",), ref(50), 50)
    assert set(cache.entries) == {("a",), ("b",)}
    # Seen again, c outnumbers b (seen once) and takes its place; never a's (seen three times).
    assert cache.get(("c",)) is None and cache.put(("c",), ref(50), 50)
    assert set(cache.entries) == {("a",), ("c",)} and cache.used == 100
    # Too big for the budget, whatever its count; an empty budget keeps nothing.
    assert not cache.put(("d",), ref(101), 101)
    assert not FrequentCache(budget=0).put(("e",), ref(1), 1)


def test_runtime_error_log_points_at_the_candidate_line(evaluator, toy):
    result = evaluate(evaluator, toy, "runtime_error")
    assert "runtime_error.py:2" in result.log


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("mutate_input", "modified its input `a`"),
        ("alias_output", "shares memory with input `x`"),
        ("subclass_output", "tensor subclass (Sneaky)"),
        ("patch_timer", "replaced time.perf_counter"),
        ("leave_thread", "left threads running: hidden-worker"),
        ("forge_channel", "forged message"),
        ("claim_passed", "a failure that claims PASSED"),  # the harness's own exception, raised by the candidate
        ("claim_passed_frame", "a failure cannot report PASSED"),  # a signed frame, on the worker's own channel
    ],
)
def test_cheats_are_integrity_violations(evaluator, toy, name, fragment):
    result = evaluate(evaluator, toy, name)
    assert result.status is Status.INTEGRITY_VIOLATION, (result.message, result.log)
    assert fragment in result.message


def test_global_state_is_restored_for_the_next_candidate(evaluator, toy):
    assert evaluate(evaluator, toy, "patch_timer").status is Status.INTEGRITY_VIOLATION
    # A fresh worker per candidate: the next one starts from a clean process either way.
    assert evaluator.evaluate(toy, toy.baseline()).status is Status.PASSED


def test_printed_verdicts_are_ignored(evaluator, toy):
    result = evaluate(evaluator, toy, "print_verdict")
    assert result.status is Status.INCORRECT_NUMERICAL


def test_reference_is_absent_from_the_candidate_process(evaluator, toy):
    result = evaluate(evaluator, toy, "steal_reference", workload_set="tests")
    assert result.status is Status.INCORRECT_NUMERICAL


def test_published_seed_does_not_pay_because_seeds_are_mixed_with_a_secret(evaluator, toy):
    result = evaluate(evaluator, toy, "published_seed", workload_set="tests")
    assert result.status is Status.INCORRECT_NUMERICAL
    assert derive_seed(1, "n1000", 1, "check") != derive_seed(2, "n1000", 1, "check")


def test_memorized_answers_fail_in_both_timing_modes(evaluator, toy):
    fresh = evaluate(evaluator, toy, "memorize", mode="fresh")
    assert fresh.status is Status.INCORRECT_NUMERICAL
    assert "during timing" in fresh.message
    # reuse times one input set, but not the one the correctness check used: still caught.
    reuse = evaluate(evaluator, toy, "memorize", mode="reuse")
    assert reuse.status is Status.INCORRECT_NUMERICAL
    assert "during timing" in reuse.message


def test_reuse_mode_times_a_good_candidate(evaluator, toy):
    result = evaluator.evaluate(toy, toy.baseline(), mode="reuse")
    assert result.status is Status.PASSED, result.message
    assert result.mode == "reuse" and all(w.timing for w in result.workloads)


@pytest.mark.parametrize("bad", ["abort", "segfault", "hang"])
def test_a_crash_costs_only_that_candidate(evaluator, toy, bad):
    first = evaluate(evaluator, toy, bad)
    assert first.status in {Status.CRASHED, Status.TIMEOUT, Status.INTEGRITY_VIOLATION}, first.message
    assert not first.passed
    healthy = evaluator.evaluate(toy, toy.baseline())
    assert healthy.status is Status.PASSED, healthy.message


def test_killed_zygote_is_restarted(toy, tmp_path):
    # Only without isolation can a candidate reach the zygote (test_sandbox_isolation shows it cannot otherwise).
    probe = tmp_path / "kill_zygote.py"
    probe.write_text(
        "import os, signal\n"
        "def run(x, a, b):\n"
        "    parent = os.getppid()  # the worker's launcher; its parent is the zygote\n"
        "    zygote = int(open(f'/proc/{parent}/stat').read().rsplit(')', 1)[1].split()[1])\n"
        "    os.kill(zygote, signal.SIGKILL)\n"
        "    return a * x + b\n"
    )
    ev = Evaluator("cpu", tmp_path / "sb", limits=Limits(idle=20), isolation=Isolation.OFF)
    try:
        starts = ev.sandbox.zygote_starts
        ev.evaluate(toy, solution_from_file(probe, toy))
        assert ev.evaluate(toy, toy.baseline()).status is Status.PASSED
        assert ev.sandbox.zygote_starts == starts + 1
    finally:
        ev.close()


def test_secrets_are_scrubbed_from_the_sandbox(evaluator, toy, tmp_path, monkeypatch):
    probe = tmp_path / "env_probe.py"
    probe.write_text(
        "import os\n"
        "def run(x, a, b):\n"
        "    leaked = [k for k in os.environ if 'OPENAI' in k or 'MY_SERVICE_TOKEN' in k]\n"
        "    assert not leaked, leaked\n"
        "    assert os.environ['TRITON_INTERPRET'] == '1'\n"
        "    assert os.getcwd().endswith(tuple('0123456789abcdef'))\n"
        "    return a * x + b\n"
    )
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-secret")
    monkeypatch.setenv("MY_SERVICE_TOKEN", "t0k3n")
    fresh = Evaluator("cpu", tmp_path / "sb", limits=Limits(idle=30))
    try:
        result = fresh.evaluate(toy, solution_from_file(probe, toy), workload_set="tests")
    finally:
        fresh.close()
    assert result.status is Status.PASSED, (result.message, result.log)


def test_each_candidate_gets_its_own_triton_cache_and_workdir(evaluator, toy, tmp_path):
    probe = tmp_path / "cache_probe.py"
    probe.write_text(
        "import os\n"
        "def run(x, a, b):\n"
        "    assert os.environ['TRITON_CACHE_DIR'].endswith('/triton')\n"
        "    assert os.path.basename(os.path.dirname(os.environ['TRITON_CACHE_DIR'])) in os.getcwd()\n"
        "    return a * x + b\n"
    )
    result = evaluator.evaluate(toy, solution_from_file(probe, toy), workload_set="tests")
    assert result.status is Status.PASSED, (result.message, result.log)


@pytest.mark.gpu
def test_side_stream_work_is_caught_by_the_device_busy_check(toy, tmp_path):
    ev = Evaluator("cuda", tmp_path)
    try:
        result = evaluate(ev, toy, "side_stream")
    finally:
        ev.close()
    assert result.status is Status.INTEGRITY_VIOLATION, result.message
    assert "escapes the timing stream" in result.message


@pytest.mark.gpu
@pytest.mark.parametrize(("name", "statuses", "fragment"), [
    ("illegal_access", {Status.CRASHED, Status.RUNTIME_ERROR}, "illegal memory access"),
    ("out_of_memory", {Status.RUNTIME_ERROR}, "OutOfMemoryError"),
])
def test_cuda_faults_cost_only_that_candidate(toy, tmp_path, name, statuses, fragment):
    ev = Evaluator("cuda", tmp_path)
    try:
        bad = evaluate(ev, toy, name)
        healthy = ev.evaluate(toy, toy.baseline())
    finally:
        ev.close()
    assert bad.status in statuses, (bad.message, bad.log[-500:])
    assert fragment in bad.message + bad.log
    assert healthy.status is Status.PASSED, healthy.message


def test_a_gpumode_submission_imports_its_type_names_from_task(evaluator):
    """Published GPUMode kernels begin with `from task import input_t, output_t`; the harness provides it."""
    from ksearch_ray.taskspec.task import find_task

    trimul = find_task("trimul")
    result = evaluator.evaluate(trimul, solution_from_file(CANDIDATES / "trimul_gpumode.py", trimul), workload_set="smoke")
    assert result.status is Status.PASSED, result.message


PLANNED = '''import time

_planned = []


def plan(x, a, b):
    time.sleep(0.1)  # a library's host-side plan step
    _planned.append(x)


def run(x, a, b):
    if not any(p is x for p in _planned):
        plan(x, a, b)
    return a * x + b
'''


def test_a_bundled_baselines_prepare_is_untimed_and_a_candidates_is_not(evaluator, tmp_path):
    """A library baseline's per-input setup (`prepare` in its solution.json) runs outside the timed
    call; the same declaration on any other code (one byte differs) is ignored: the candidate's
    setup is timed, inside its call."""
    import json
    import shutil

    from ksearch_ray.models import Solution

    root = tmp_path / "toy"
    shutil.copytree(DATA / "toy", root)
    (root / "solutions" / "planned").mkdir()
    (root / "solutions" / "planned" / "main.py").write_text(PLANNED)
    (root / "solutions" / "planned" / "solution.json").write_text(json.dumps(
        {"name": "planned", "language": "python", "entry_file": "main.py", "entry_point": "run", "prepare": "plan"}))
    task = Task.load(root)
    trusted = task.solution("planned")
    candidate = Solution(**{**trusted.model_dump(), "sources": {"main.py": PLANNED + "# edited\n"}})
    assert trusted.prepare == candidate.prepare == "plan" and trusted.id != candidate.id

    library = evaluator.evaluate(task, trusted, workload_set="benchmarks", mode="fresh")
    other = evaluator.evaluate(task, candidate, workload_set="benchmarks", mode="fresh")
    assert library.passed and other.passed, (library.message, other.message)
    assert library.prepared_untimed and not other.prepared_untimed
    assert all(w.timing for w in library.workloads + other.workloads)
    assert max(w.timing.mean_ms for w in library.workloads if w.timing) < 50
    assert min(w.timing.mean_ms for w in other.workloads if w.timing) > 80


def test_correctness_checks_the_cheapest_workload_first_and_reports_in_the_sets_order(evaluator, tmp_path):
    """A copy of the toy task whose set lists the large workload first: a wrong candidate fails on the
    small one, having checked nothing else; a right one's results come back in the set's order."""
    import shutil

    copy = tmp_path / "toy_reversed"
    shutil.copytree(DATA / "toy", copy)
    lines = (copy / "workloads.jsonl").read_text().splitlines()
    (copy / "workloads.jsonl").write_text("\n".join(reversed(lines)) + "\n")
    task = Task.load(copy)
    assert [w.name for w in task.workloads("tests", "cpu")] == ["n4096", "n1000"]
    wrong = evaluate(evaluator, task, "wrong_values", workload_set="tests")
    assert wrong.status is Status.INCORRECT_NUMERICAL and wrong.message.startswith("n1000")
    assert [w.workload for w in wrong.workloads] == ["n1000"]  # n4096 was never judged
    right = evaluator.evaluate(task, task.baseline(), workload_set="tests", timed=False)
    assert right.passed and [w.workload for w in right.workloads] == ["n4096", "n1000"]
