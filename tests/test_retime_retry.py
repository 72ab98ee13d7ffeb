"""A best is not lost to an infrastructure fault: a re-timing whose sandbox worker is killed from outside
(SIGKILL, as the OOM killer or an operator would) runs once more on a fresh worker, in a real sandbox."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from ksearch_ray.evaluation.evaluator import Evaluator
from ksearch_ray.evaluation.sandbox.handle import WorkerHandle
from ksearch_ray.evaluation.settings import Limits, TimingPolicy
from ksearch_ray.models import Status
from ksearch_ray.taskspec.task import Task

DATA = Path(__file__).parent / "data"


def test_a_re_timing_whose_worker_is_killed_from_outside_is_retried_once_on_a_fresh_worker(tmp_path):
    toy = Task.load(DATA / "toy")
    ev = Evaluator("cpu", tmp_path / "sandbox", limits=Limits(setup=120, build_python=60, idle=30, hang_floor=10, total=120),
                   timing=TimingPolicy(max_calls=10))
    try:
        solution = toy.baseline()
        primary = ev.evaluate(toy, solution)
        assert primary.passed
        workers: list[WorkerHandle] = []
        start, evaluate = ev.sandbox.start, ev.evaluate
        kills = {"left": 1}
        killed: set[int] = set()

        def tracked_start(job, environment=None):  # type: ignore[no-untyped-def]
            workers.append(start(job, environment))
            return workers[-1]

        def killer(line: str) -> None:
            # While the re-timing run's worker loads the candidate, it is killed from outside.
            if line.startswith("importing the candidate") and kills["left"] and workers[-1].pid not in killed:
                kills["left"] -= 1
                killed.add(workers[-1].pid)
                # The worker's whole process group: its namespace's processes end with it at once (killing
                # only its first process let the candidate finish the re-timing first, on a loaded CI machine).
                os.killpg(workers[-1].pid, signal.SIGKILL)

        ev.sandbox.start = tracked_start  # type: ignore[method-assign]
        ev.evaluate = lambda *a, **k: evaluate(*a, progress=killer, **k)  # type: ignore[method-assign]
        check = ev.retime(toy, solution, primary)
        assert kills["left"] == 0 and len(workers) == 2, (check.status, check.message)  # killed once, then a fresh worker
        assert check.status is Status.PASSED and check.agreed, check.message

        # A worker that dies every time is a verdict: the second failure decides.
        kills["left"] = 2
        workers.clear()
        again = ev.retime(toy, solution, primary)
        assert len(workers) == 2 and not again.agreed and again.status is Status.CRASHED, (again.status, again.message)
        assert "killed by signal 9" in again.message and "and before it, on another worker" in again.message
    finally:
        ev.close()
