"""Two evaluations at once on one evaluator (evaluation.overlap), in a real sandbox on the CPU path: the second's
worker starts while the first is timed, and each candidate's code runs only in its own turn on the device."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ksearch_ray.config import RunConfig
from ksearch_ray.evaluation.evaluator import Evaluator
from ksearch_ray.evaluation.settings import Limits, TimingPolicy
from ksearch_ray.models import EvalResult, Status
from ksearch_ray.run.local import LocalEvaluatorPool
from ksearch_ray.taskspec.task import Task, solution_from_file

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def toy() -> Task:
    return Task.load(DATA / "toy")


class WatchedLock:
    """The evaluator's device lock, watched: who held it, from when to when (wall clock)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.held: list[tuple[str, float, float]] = []
        self._since: dict[str, list[float]] = {}

    def acquire(self, blocking: bool = True) -> bool:
        got = self.lock.acquire(blocking=blocking)
        if got:
            self._since.setdefault(threading.current_thread().name, []).append(time.time())
        return got

    def release(self) -> None:
        start = self._since[threading.current_thread().name].pop()
        if not self._since[threading.current_thread().name]:  # the outermost release of a re-entrant hold
            self.held.append((threading.current_thread().name, start, time.time()))
        self.lock.release()

    def __enter__(self) -> WatchedLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _evaluate(ev: Evaluator, task: Task, name: str, lines: list[tuple[float, str]], out: dict[str, EvalResult]) -> None:
    solution = task.solution(name) if name == "triton_seed" else solution_from_file(DATA / "candidates" / f"{name}.py", task)
    out[name] = ev.evaluate(task, solution, workload_set="benchmarks",
                            progress=lambda line: lines.append((time.time(), line)))


def _two_turns(tmp_path: Path, toy: Task, device: str, first_name: str) -> None:
    """`first_name` evaluated, and the spy started once the first's checks run: their turns, the spy's own clock,
    the judge's working times and the device seconds, checked."""
    ev = Evaluator(device, tmp_path, overlap=True, limits=Limits(setup=120, build_python=60, idle=30, total=300),
                   timing=TimingPolicy(max_calls=3, min_calls=3))
    watched = WatchedLock()
    ev._device = watched  # type: ignore[assignment]
    judged: list[tuple[float, float]] = []  # when the judge worked (its one thread), wall clock
    judge = ev.judge._judge

    def watched_judge(*args, **kwargs):
        start = time.time()
        try:
            return judge(*args, **kwargs)
        finally:
            judged.append((start, time.time()))

    ev.judge._judge = watched_judge  # type: ignore[method-assign]
    try:
        lines: dict[str, list[tuple[float, str]]] = {first_name: [], "clock_spy": []}
        results: dict[str, EvalResult] = {}
        first = threading.Thread(target=_evaluate, name=first_name, args=(ev, toy, first_name, lines[first_name], results))
        t0 = time.time()
        first.start()
        while not any(line.startswith("ran ") for _, line in lines[first_name]):  # in its checks: its turn
            assert first.is_alive(), results
            time.sleep(0.01)
        second = threading.Thread(target=_evaluate, name="clock_spy", args=(ev, toy, "clock_spy", lines["clock_spy"], results))
        second.start()
        first.join(300)
        second.join(300)
        t1 = time.time()
        assert all(r.status is Status.PASSED for r in results.values()) and len(results) == 2, results

        turns = {name: (start, end) for name, start, end in watched.held}
        assert set(turns) == {first_name, "clock_spy"} and len(watched.held) == 2
        (a0, a1), (b0, b1) = turns[first_name], turns["clock_spy"]
        assert a1 <= b0  # one turn at a time: the second began after the first's timed calls were over
        # The second's worker was started inside the first's turn and waited for its own.
        started = next(t for t, line in lines["clock_spy"] if line == "starting the sandbox worker")
        assert a0 < started < a1
        assert any(line.startswith("waiting for the device") for _, line in lines["clock_spy"])
        assert results["clock_spy"].stages["queued"] > 0
        # Its code ran only in its turn: its import and every call, by its own clock.
        spy = results["clock_spy"].solution_id
        noted = [line.split() for line in (tmp_path / "cache" / spy / "triton" / "clock_spy.log").read_text().splitlines()]
        assert [what for what, _ in noted][:1] == ["import"] and len(noted) > 1
        assert all(b0 <= float(t) <= b1 for _, t in noted), (noted, b0, b1)
        # Its timed calls ran while the judge was idle: the first's last outputs had been judged before them. Per
        # workload (2) come 1 check and 2 warm-up calls, then the timed ones: on the CPU 3 calls; on a GPU the
        # kernel figure's captures (replays run no Python; the toy's scalar `b` is baked into a graph and is fresh
        # for each of the 3 replays, so each is captured anew), an untimed call, then 3 calls (20 on an H100).
        calls = [float(t) for what, t in noted if what == "call"]
        assert len(calls) == 2 + 2 * 2 + 2 * (3 + 1 + 3 if device == "cuda" else 3), noted
        timed_from, timed_to = calls[6], calls[-1]
        assert judged and not [j for j in judged if j[0] < timed_to and j[1] > timed_from], (judged, timed_from, timed_to)

        # Busy time counts the overlap once: the device seconds add up to the span of the two, not their sum.
        device_s = [results[n].device_seconds or 0.0 for n in (first_name, "clock_spy")]
        assert device_s[0] == pytest.approx(results[first_name].seconds, abs=0.01)
        assert sum(device_s) <= t1 - t0 + 0.05
        assert sum(r.seconds for r in results.values()) - sum(device_s) > 0.05
    finally:
        ev.close()


def test_the_second_worker_starts_during_the_first_ones_turn_and_runs_nothing_until_its_own(tmp_path, toy):
    _two_turns(tmp_path, toy, "cpu", "triton_seed")  # a Triton kernel in the interpreter: seconds a turn


@pytest.mark.gpu
def test_on_a_gpu_the_second_worker_starts_during_the_first_ones_turn_and_runs_nothing_until_its_own(tmp_path, toy):
    _two_turns(tmp_path, toy, "cuda", "slow_call")  # 0.1 s a call on the host: its turn outlasts a CUDA context's start


def test_a_local_pool_with_overlap_takes_two_evaluations_per_evaluator_and_counts_busy_time_once(tmp_path, toy):
    config = RunConfig.model_validate({"task": "toy_axpy", "evaluation": {
        "device": "cpu", "overlap": True, "timing": {"max_calls": 3, "min_calls": 3}}})
    pool = LocalEvaluatorPool(config, toy, make=lambda _i: Evaluator(
        "cpu", tmp_path, overlap=True, limits=Limits(setup=120, build_python=60, idle=30, total=300),
        timing=TimingPolicy(max_calls=3, min_calls=3)))

    async def both() -> list[tuple[EvalResult, int]]:
        await pool.describe_all()
        seen_two = False

        async def watch() -> None:
            nonlocal seen_two
            while True:
                seen_two |= bool(pool.in_flight and pool.in_flight_next)
                await asyncio.sleep(0.01)

        watcher = asyncio.create_task(watch())
        try:
            t0 = time.monotonic()
            done = await asyncio.gather(pool.evaluate(toy.solution("triton_seed"), "benchmarks"),
                                        pool.evaluate(toy.solution("good"), "benchmarks"))
            span = time.monotonic() - t0
        finally:
            watcher.cancel()
        assert seen_two  # both on evaluator 0 at once, the second shown as its next
        assert pool.busy_s[0] <= span + 0.05 < sum(r.seconds for r, _ in done)
        return done

    try:
        done = asyncio.run(both())
    finally:
        pool.release()
    assert [index for _, index in done] == [0, 0] and all(r.passed for r, _ in done)
    assert pool.done == 2 and not pool.in_flight and not pool.in_flight_next


def test_a_ray_search_with_overlap_runs_two_evaluations_per_evaluator_actor(tmp_path):
    """As a user runs it: a Ray search on the CPU path with evaluation.overlap from a config file; the evaluator
    actor takes its two evaluations on two threads, and the run counts every evaluation's device seconds."""
    from ksearch_ray.events import Evaluation
    from ksearch_ray.store import RunStore

    shutil.copytree(DATA, tmp_path / "data", ignore=shutil.ignore_patterns("candidates"))
    (tmp_path / "overlap.yaml").write_text("evaluation:\n  overlap: true\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RAY_ADDRESS")}
    done = subprocess.run([sys.executable, "-m", "ksearch_ray", "run", "--task", "toy_axpy", "--task-dir", "data",
                           "--device", "cpu", "--width", "2", "--rounds", "4", "--noise-repeats", "2",
                           "--confirm-repeats", "0", "--config", "overlap.yaml", "--run-dir", "run"],
                          cwd=tmp_path, env={**env, "RAY_AUTH_MODE": "disabled"}, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr + done.stdout
    assert "each evaluator takes two evaluations at once (evaluation.overlap)" in " ".join(done.stderr.split())
    evaluations = [e for e in RunStore(tmp_path / "run").read_events() if isinstance(e, Evaluation)]
    assert len(evaluations) >= 4 and all(e.result.passed for e in evaluations)
    assert all(e.result.device_seconds is not None and e.result.device_seconds <= e.result.seconds + 1e-3
               for e in evaluations)
    assert all("queued" in e.result.stages for e in evaluations)  # each waited for (or took at once) its turn
    # Two lanes keep the actor's two threads busy: some evaluation waited for the other's turn.
    assert any(e.result.stages["queued"] > 0.01 for e in evaluations), [e.result.stages for e in evaluations]


def test_a_worker_that_dies_while_it_waits_for_its_turn_is_the_sandboxs_failure_not_a_verdict(tmp_path, toy):
    """Nothing of the candidate has run while its worker waits at Ready: a worker gone by its turn (killed from
    outside here) stops the evaluation with a SandboxError, and the device's turn goes on to the next."""
    import signal

    from ksearch_ray.evaluation.sandbox.handle import SandboxError

    ev = Evaluator("cpu", tmp_path, overlap=True, limits=Limits(setup=120, build_python=60, idle=30, total=300),
                   timing=TimingPolicy(max_calls=3, min_calls=3))
    workers = []  # the candidates' workers (the toy task, from outside the package, has a reference worker too)
    start = ev.sandbox.start

    def started(job, *args, **kwargs):
        handle = start(job, *args, **kwargs)
        if job.get("type") == "job":
            workers.append(handle)
        return handle

    ev.sandbox.start = started  # type: ignore[method-assign]
    lines: list[tuple[float, str]] = []
    outcome: dict[str, object] = {}

    def waiting_one() -> None:
        try:
            outcome["result"] = ev.evaluate(toy, toy.solution("good"), workload_set="benchmarks",
                                            progress=lambda line: lines.append((time.time(), line)))
        except SandboxError as exc:
            outcome["error"] = exc

    try:
        with ev._device:  # another evaluation's turn, held here
            thread = threading.Thread(target=waiting_one)
            thread.start()
            while not any(line.startswith("waiting for the device") for _, line in lines):
                assert thread.is_alive(), outcome
                time.sleep(0.01)
            os.killpg(workers[0].pid, signal.SIGKILL)
            time.sleep(0.2)
        thread.join(60)
        assert "result" not in outcome and "waited for its turn on the device" in str(outcome["error"]), outcome
        # The turn was given back: the next evaluation takes it at once and passes.
        after = ev.evaluate(toy, toy.solution("good"), workload_set="benchmarks")
        assert after.passed and after.stages["queued"] < 1.0
    finally:
        ev.close()


def test_a_hang_in_one_turn_ends_by_its_limit_and_the_waiting_evaluation_then_passes(tmp_path, toy):
    """The turn is given back however an evaluation ends: a candidate that hangs in its turn is stopped by its
    own wait limit (TIMEOUT), and the one waiting meanwhile gets the device, its time limit counted from then."""
    ev = Evaluator("cpu", tmp_path, overlap=True, limits=Limits(setup=120, build_python=60, idle=4, hang_floor=2, total=60),
                   timing=TimingPolicy(max_calls=3, min_calls=3))
    lines: list[str] = []
    results: dict[str, EvalResult] = {}
    hang = threading.Thread(target=lambda: results.update(hang=ev.evaluate(
        toy, solution_from_file(DATA / "candidates" / "hang.py", toy), workload_set="benchmarks",
        progress=lines.append)))
    try:
        hang.start()
        while "importing the candidate" not in lines:  # its turn
            assert hang.is_alive(), results
            time.sleep(0.01)
        results["good"] = ev.evaluate(toy, toy.solution("good"), workload_set="benchmarks")
        hang.join(60)
        assert results["hang"].status is Status.TIMEOUT, results["hang"].message
        assert results["good"].passed and results["good"].stages["queued"] > 1.0  # it waited out the hang
    finally:
        ev.close()


@pytest.mark.slow
def test_a_ray_pool_with_overlap_gets_both_slots_back_when_its_evaluator_dies_mid_evaluation(ray_session, tmp_path):
    """Both evaluations in flight on the actor are lost with it, run again on its replacement, and the
    replacement takes two at once again: its two slots are back in the idle queue."""
    import ray
    from local_backends import settings

    from ksearch_ray.distributed.pool import RayEvaluatorPool

    toy = Task.load(DATA / "toy")
    config = settings(task="toy_axpy", task_dirs=[str(DATA)], device="cpu", evaluator_gpus=True, evaluators=1,
                      overlap=True, run_dir=str(tmp_path / "run"))
    lost: list[tuple[int, str]] = []

    async def scenario() -> list[tuple[EvalResult, int]]:
        pool = RayEvaluatorPool(config, "ovl", on_lost=lambda i, s: lost.append((i, s)))
        try:
            await pool.describe_all()
            # Two slow ones (seconds each in Triton's interpreter): whichever has the turn, the other still waits.
            slow = toy.solution("triton_seed")
            first = asyncio.ensure_future(pool.evaluate(slow, "benchmarks"))
            second = asyncio.ensure_future(pool.evaluate(slow, "benchmarks"))
            while not (pool.in_flight and pool.in_flight_next):  # both on the actor
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.3)
            ray.kill(pool.actors[0], no_restart=True)
            done = await asyncio.gather(first, second)
            assert pool.idle._queue.qsize() == 2  # both slots back, on the replacement
            return done
        finally:
            pool.release()

    done = asyncio.run(scenario())
    assert all(result.passed and index == 0 for result, index in done), done
    assert lost == [(0, toy.solution("triton_seed").id)] * 2
