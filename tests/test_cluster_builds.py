"""CUDA/C++ builds off the evaluators: the build cache, build jobs in the sandbox, and the pool's builds;
and, on the same Ray pool, a profile of a best (--profile-bests) taking its turn on its evaluator.

Real compiles throughout (torch's extension builder, the system C++ compiler): the toy C++
candidate includes no torch header, so a build takes a second or two, not a minute.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from local_backends import settings

from ksearch_ray.config import RunConfig
from ksearch_ray.distributed.cluster import local_cpus
from ksearch_ray.distributed.pool import EvaluatorPoolError, RayEvaluatorPool
from ksearch_ray.evaluation.buildcache import BuildTarget, build_key, probe_toolchain
from ksearch_ray.evaluation.builder import Builder
from ksearch_ray.evaluation.sandbox.build import build_flags
from ksearch_ray.models import Solution, Status
from ksearch_ray.run.backends import BUILDER
from ksearch_ray.taskspec.task import find_task

DATA = Path(__file__).parent / "data"
TASK = find_task("toy_axpy_cpp", [str(DATA)])
SEED = TASK.solution("cpp_seed")


def variant(solution: Solution, old: str, new: str) -> Solution:
    text = solution.sources[solution.entry_file]
    assert old in text
    return Solution(**{**solution.model_dump(), "sources": {solution.entry_file: text.replace(old, new)}})


BROKEN = variant(SEED, "Py_DECREF(value);\n  return out;", "return undefined_name;")


def test_a_second_build_is_a_cache_hit_well_under_a_second(builder: Builder) -> None:
    record, library = builder.build(SEED, BuildTarget())
    assert record.status is Status.PASSED and not record.cached and library
    t0 = time.perf_counter()
    again, same = builder.build(SEED, BuildTarget())
    elapsed = time.perf_counter() - t0
    assert again.cached and same == library and again.sha256 == record.sha256
    assert elapsed < 0.2, elapsed


def test_compile_errors_come_back_trimmed_and_are_cached(builder: Builder) -> None:
    record, library = builder.build(BROKEN, BuildTarget())
    assert record.status is Status.COMPILE_ERROR and library is None
    assert "undefined_name" in record.log and "error" in record.log
    assert len(record.log.splitlines()) <= 25
    again, _ = builder.build(BROKEN, BuildTarget())
    assert again.cached and again.status is Status.COMPILE_ERROR and again.log == record.log


def test_a_damaged_cache_entry_is_never_used(builder: Builder, tmp_path: Path) -> None:
    record, library = builder.build(SEED, BuildTarget())
    assert library is not None
    entry = next((tmp_path / "cache").glob(f"*/{record.key}"))
    damaged = bytearray(library)
    damaged[len(damaged) // 2] ^= 0xFF  # one byte off: what a disk error or a tampering process could leave
    (entry / "library.so").write_bytes(bytes(damaged))
    assert builder.cache.get(record.key) is None
    rebuilt, fresh = builder.build(SEED, BuildTarget())
    assert not rebuilt.cached and fresh is not None and rebuilt.sha256 == record.sha256


def test_the_build_key_covers_sources_target_flags_and_toolchain() -> None:
    tc = probe_toolchain()
    base = build_key(SEED, BuildTarget(), tc, build_flags())
    assert base == build_key(SEED.model_copy(update={"name": "renamed"}), BuildTarget(), tc, build_flags())
    others = {
        build_key(variant(SEED, "kUnroll = 4;", "kUnroll = 8;"), BuildTarget(), tc, build_flags()),
        build_key(SEED, BuildTarget(archs=("9.0a",)), tc, build_flags()),
        build_key(SEED, BuildTarget(), tc.model_copy(update={"torch": "0.0"}), build_flags()),
        build_key(SEED, BuildTarget(), tc, {**build_flags(), "cxx": ["-O0"]}),
    }
    assert base not in others and len(others) == 4


def test_cuda_sources_without_a_gpu_target_are_a_compile_error(builder: Builder) -> None:
    cu = Solution(**{**SEED.model_dump(), "sources": {"axpy.cpp": SEED.sources["axpy.cpp"], "k.cu": "__global__ void k() {}\n"}})
    record, _ = builder.build(cu, BuildTarget())
    assert record.status is Status.COMPILE_ERROR and "CUDA GPU" in record.log


# --- the pool: builds on CPU tasks, ahead of the evaluators -------------------------------------------


def _pool(tmp_path: Path, **overrides: object) -> RayEvaluatorPool:
    config = settings(**{"task": "toy_axpy_cpp", "task_dirs": [str(DATA)], "device": "cpu", "evaluators": 1,
                         "build_cpus": 1, "scratch_dir": str(tmp_path / "scratch"), **overrides})
    return RayEvaluatorPool(config, f"t{time.time_ns()}")


@pytest.mark.slow
def test_a_compile_error_is_a_verdict_without_an_evaluator(ray_session, tmp_path: Path) -> None:
    async def go() -> tuple:
        pool = _pool(tmp_path)
        try:
            return (*await pool.evaluate(BROKEN, "benchmarks"), pool)
        finally:
            pool.release()

    result, index, pool = asyncio.run(go())
    assert result.status is Status.COMPILE_ERROR and index == BUILDER
    assert "undefined_name" in result.log
    assert pool.busy_s == {} and pool.builds == 1


@pytest.mark.slow
def test_a_build_runs_while_its_candidate_waits_for_the_evaluator(ray_session, tmp_path: Path) -> None:
    """One evaluator, busy with a slow candidate: the C++ candidate submitted next is built meanwhile."""
    slow = TASK.solution("good")  # plain PyTorch on a million elements: seconds per evaluation on the CPU path
    seen: dict[str, bool] = {}

    async def go() -> tuple:
        # 200 timed calls a workload, on fresh inputs each: several seconds, longer than a build that, at nice 10,
        # yields this 2-core machine's CPUs to the measurement (one at the CPU path's default rule took 2.0 s, its
        # build 2.2 s).
        pool = _pool(tmp_path, timing={"min_calls": 200, "max_calls": 200, "max_total_s": 60.0})
        try:
            first = asyncio.create_task(pool.evaluate(slow, "benchmarks"))
            while not pool.in_flight:
                await asyncio.sleep(0.01)
            second = asyncio.create_task(pool.evaluate(SEED, "benchmarks"))
            while not first.done():
                if pool.builds and not pool.building:
                    seen["built while the evaluator was busy"] = True
                await asyncio.sleep(0.01)
            return await first, await second, pool
        finally:
            pool.release()

    (slow_result, _), (result, index), pool = asyncio.run(go())
    assert slow_result.passed and result.passed and index == 0
    assert seen, "the build waited for the evaluator"
    assert result.build_seconds < 1.0  # the evaluator loaded the library; it compiled nothing


@pytest.mark.slow
def test_on_a_cluster_a_build_no_node_can_take_waits_build_wait_s_for_a_node_then_ends(ray_session, tmp_path: Path) -> None:
    """A cluster this run attached to (the test's Ray) may grow: the build waits cluster.build_wait_s for a node
    declaring the build resource, then the pool says which setting asks for what no node has."""
    async def go() -> float:
        pool = _pool(tmp_path, build_resource="ksearch_build_nowhere", build_wait_s=4.0)
        t0 = time.monotonic()
        try:
            with pytest.raises(EvaluatorPoolError, match=r"resource ksearch_build_nowhere .*no such node came in 4 s"):
                await pool.evaluate(SEED, "benchmarks")
            return time.monotonic() - t0
        finally:
            pool.release()

    waited = asyncio.run(go())
    assert 4.0 <= waited < 30.0, waited


@pytest.mark.slow
@pytest.mark.parametrize("warm", [True, False])
def test_the_first_build_starts_the_other_cycles_build_workers_sandboxes(ray_session, tmp_path: Path, warm: bool) -> None:
    """A cold build worker spends seconds on its zygote's imports before its first build, and a search's first
    candidates come together: with the session's first build, width - 1 more workers start their sandboxes."""
    import ray

    async def go() -> tuple:
        pool = _pool(tmp_path, width=3, warm_builders=warm)
        try:
            result, _ = await pool.evaluate(SEED, "benchmarks")
            return result, [ray.get(ref, timeout=120) for ref in pool.warming or []]
        finally:
            pool.release()

    result, warmed = asyncio.run(go())
    assert result.passed
    builders = {int(p.name) for p in (tmp_path / "scratch" / "builders").iterdir()}
    if not warm:
        assert warmed == [] and len(builders) == 1
        return
    pids = [pid for pid, _, _ in warmed]
    assert len(warmed) == 2 and len(set(pids)) == 2, warmed  # two other processes, each with its sandbox started
    assert all(seconds > 0.05 and not error for _, seconds, error in warmed), warmed
    assert set(pids) <= builders and len(builders) == 3, (pids, builders)


@pytest.mark.slow
def test_no_build_worker_is_warmed_where_it_would_queue_ahead_of_the_candidates_builds(ray_session, tmp_path: Path) -> None:
    """The test's Ray has 4 CPUs: an evaluator holds 1 and the first build 2, so no second build fits beside them."""
    async def go() -> list:
        pool = _pool(tmp_path, width=4, build_cpus=2)
        try:
            assert (await pool.evaluate(SEED, "benchmarks"))[0].passed
            return pool.warming
        finally:
            pool.release()

    assert asyncio.run(go()) == []


@pytest.mark.slow
def test_a_build_made_ahead_is_joined_by_its_evaluation_not_made_again(ray_session, tmp_path: Path) -> None:
    """cluster.build_ahead's pool side: the evaluation of a kernel built ahead waits for that build, loads its
    library, and counts it as the one build it is, not as a cache hit."""
    async def go() -> tuple:
        pool = _pool(tmp_path)
        try:
            await pool.build_ahead(SEED, "benchmarks")
            ahead = (pool.builds, pool.build_hits)
            result, index = await pool.evaluate(SEED, "benchmarks")
            return ahead, result, index, (pool.builds, pool.build_hits)
        finally:
            pool.release()

    ahead, result, index, after = asyncio.run(go())
    assert ahead == (1, 0) and after == (1, 0), (ahead, after)
    assert result.passed and index == 0
    assert result.build_seconds < 1.0  # the evaluator loaded the library; it compiled nothing


@pytest.mark.slow
@pytest.mark.parametrize("ahead", [True, None])
def test_the_seed_is_built_while_the_baselines_are_measured(tmp_path: Path, ahead: bool | None) -> None:
    """cluster.build_ahead: the seed's build, which its evaluation used to start only after the baselines, is done
    before the last baseline measurement ends; by default only with GPU evaluators (this run's are CPU ones, which
    the build would slow), so the default builds it after them."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    setting = "" if ahead is None else f"  build_ahead: {str(ahead).lower()}\n"
    # A warm-up and 8 baseline measurements of 150 timed calls a workload: about 15 s on this 2-core machine, several
    # times the toy's C++ build (4 s here). Built after them (the default here), 3 show it.
    repeats = 8 if ahead else 3
    (tmp_path / "run.yaml").write_text(
        f"cluster:\n  build_cpus: 1\n  scratch_dir: {tmp_path / 'scratch'}\n{setting}"
        f"search:\n  noise_repeats: {repeats}\n  noise_budget_s: 120\n  confirm_repeats: 0\n"
        "evaluation:\n  timing: {min_calls: 150, max_calls: 150, max_total_s: 60}\n")
    cmd = [sys.executable, "-m", "ksearch_ray", "run", "--task", "toy_axpy_cpp", "--task-dir", str(DATA), "--rounds", "1",
           "--width", "1", "--max-wall-s", "240", "--evaluators", "1", "--config", "run.yaml", "--run-dir", "run",
           "--no-progress"]
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400, check=False)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    events = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    baselines = [e["t"] for e in events if e["kind"] == "baseline"]
    seed = [e for e in events if e["kind"] == "seed"]
    assert len(baselines) == repeats and seed and seed[0]["result"]["status"] == "PASSED", done.stdout[-2000:]
    built = min(entry.stat().st_mtime for entry in (tmp_path / "scratch" / "build-cache").glob("*/*"))
    if ahead:
        assert built < baselines[-1] - 1.0, (built, baselines)
    else:
        assert built > baselines[-1], (built, baselines)


@pytest.mark.slow
def test_with_the_build_pool_off_the_evaluator_compiles(ray_session, tmp_path: Path) -> None:
    async def go() -> tuple:
        pool = _pool(tmp_path, build_pool=False)
        try:
            return (*await pool.evaluate(SEED, "benchmarks"), pool)
        finally:
            pool.release()

    result, index, pool = asyncio.run(go())
    assert result.passed and index == 0 and pool.builds == 0
    assert not list((tmp_path / "scratch" / "build-cache").glob("*/*"))
    assert result.build_seconds > 0.2  # a compile in the evaluation (loading a built library takes milliseconds)


@pytest.mark.slow
def test_a_profile_through_the_ray_pool_waits_for_the_evaluators_measurement_and_returns_its_verdict(
        ray_session, tmp_path: Path) -> None:
    """--profile-bests on a Ray evaluator: the profile is the actor's (here the CPU path's one-line refusal,
    carried back as a result, not an exception) and it waits for the evaluation in flight on that evaluator."""
    slow = TASK.solution("good")
    order: list[str] = []

    async def go() -> tuple:
        pool = _pool(tmp_path, evaluation__profile__bests=True)
        try:
            measured, _ = await pool.evaluate(SEED, "benchmarks")

            async def evaluation() -> None:
                await pool.evaluate_on(0, slow, "benchmarks")
                order.append("evaluation")

            async def profile():
                while not pool.in_flight:  # start it while the evaluation holds the evaluator
                    await asyncio.sleep(0.01)
                result = await pool.profile_on(0, SEED, measured, 60.0)
                order.append("profile")
                return result
            _, result = await asyncio.gather(evaluation(), profile())
            return measured, result
        finally:
            pool.release()

    measured, result = asyncio.run(go())
    assert measured.passed
    assert order == ["evaluation", "profile"]
    assert result.status == "failed" and result.solution_id == SEED.id
    assert result.message == "the CPU path has no GPU profiler"


def test_a_local_ray_declares_cpus_for_an_evaluator_and_a_build_task_together() -> None:
    defaults = RunConfig(task="toy_axpy_cpp")  # one evaluator of 1 CPU, build tasks of 2
    assert local_cpus(defaults, 2) == 3 and local_cpus(defaults, 16) == 16
    wide = RunConfig.model_validate({"task": "t", "evaluation": {"evaluators": 4}, "cluster": {"build_cpus": 8}})
    assert local_cpus(wide, 4) == 12


def test_a_cpp_search_with_the_default_build_cpus_finishes_on_a_two_core_machine(tmp_path: Path) -> None:
    """On a 2-core machine (CI's, and this project's) a local Ray once declared 2 CPUs: the evaluator held one, a
    2-CPU build task never started, and the run waited for ever, past its wall budget, at its seed."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    cmd = [sys.executable, "-m", "ksearch_ray", "run", "--task", "toy_axpy_cpp", "--task-dir", str(DATA), "--rounds", "2",
           "--width", "2", "--max-wall-s", "60", "--evaluators", "1", "--run-dir", "run", "--no-progress"]
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    events = (tmp_path / "run" / "events.jsonl").read_text()
    assert '"kind": "seed"' in events and '"kind": "evaluation"' in events, done.stdout[-2000:]


def test_a_build_no_node_can_take_ends_the_run_with_one_line(tmp_path: Path) -> None:
    """A build resource no node declares (build nodes left unlabelled) once left the run waiting for ever at its seed;
    a local Ray started by the run cannot grow, so it ends at once, naming the setting."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    (tmp_path / "run.yaml").write_text("cluster:\n  build_resource: ksearch_build\n")
    cmd = [sys.executable, "-m", "ksearch_ray", "run", "--task", "toy_axpy_cpp", "--task-dir", str(DATA), "--rounds", "2",
           "--width", "2", "--max-wall-s", "600", "--evaluators", "1", "--config", "run.yaml", "--run-dir", "run",
           "--no-progress"]
    t0 = time.monotonic()
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode != 0 and time.monotonic() - t0 < 120, (done.stdout + done.stderr)[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    line = [x for x in done.stderr.splitlines() if "no node of the cluster" in x]
    assert len(line) == 1 and "ksearch_build (cluster.build_resource)" in line[0], done.stderr[-3000:]
    assert "cpp_seed" in line[0]
