"""Re-timing a new best by a second, independent method, before it is believed.

The primary measurement (Evaluator._time) is taken inside the candidate's process. The second one
is clocked here, in the evaluator's process, which no candidate code reaches: the worker is told
to run R calls back to back and sync, and the evaluator times the round trip with its own clock.
R is chosen from one call clocked the same way (never from the figure under test) so the round
trip's own cost (well under a millisecond) is small against the total, and the same R iterations
of an L2 flush alone are timed and subtracted, which also cancels it.

* GPU: the candidate's call (with an L2 flush before it, as in the primary timing) is captured
  once in a CUDA graph and replayed: no candidate Python runs while it is timed, and no launch
  overhead counts. A call that cannot be captured (it syncs, or plans on the host per call) is
  timed as plain back-to-back calls, which counts its host overhead too.
* CPU: plain back-to-back calls (the primary figure is host wall time too).

The candidate's output after the timed repetitions is checked against the reference again, so
the repeated work is the real work. The primary figure may not be lower than the independent one
by more than the tolerance (per method below); it may be higher (launch gaps, host planning and
cold caches count in the primary timing, so an honest kernel often is). A disagreement means the
primary number cannot be trusted: the caller must not record it as a best.

Call, once a candidate's evaluation `primary` beats the current best:

    check = evaluator.retime(task, solution, primary, options=options)
    if check.agreed: accept the best (check.workloads holds both figures per workload)
    else: record it as not confirmed (check.message says why)
"""

from __future__ import annotations

import math
import statistics
import time
from enum import StrEnum
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from ksearch_ray.models import EvalResult, Solution, Status
from ksearch_ray.taskspec.task import Task

if TYPE_CHECKING:
    from ksearch_ray.evaluation.evaluator import Evaluator, _Run
    from ksearch_ray.evaluation.sandbox.client import WorkerHandle


class RetimeMethod(StrEnum):
    GRAPH_REPLAY = "cuda_graph_replay"
    CALLS = "back_to_back_calls"


# How much lower than the independent figure the primary one may be, per method and device.
# The CPU path's host timings drift with the machine's load between the two runs: a factor of 2.
TOLERANCE = {("cuda", RetimeMethod.GRAPH_REPLAY): 0.2, ("cuda", RetimeMethod.CALLS): 0.5, ("cpu", RetimeMethod.CALLS): 1.0}
TARGET_S = {"cuda": 0.1, "cpu": 0.3}  # wall time of one batch of repetitions
MAX_REPS = {"cuda": 2000, "cpu": 2000}
ROUNDS = 3


class RetimedWorkload(BaseModel):
    workload: str
    method: RetimeMethod
    primary_ms: float = Field(description="Mean latency from the primary evaluation.")
    retimed_ms: float = Field(description="Median over rounds of the evaluator-clocked time per call.")
    reps: int = Field(description="Calls per timed batch.")
    tolerance: float
    agreed: bool


class RetimeResult(BaseModel):
    """Whether a primary evaluation's times survive an independent measurement."""

    agreed: bool
    status: Status = Field(description="Of the fresh run itself: PASSED unless the candidate failed in it.")
    message: str = ""
    workloads: list[RetimedWorkload] = Field(default_factory=list)


def retime(ev: Evaluator, task: Task, solution: Solution, primary: EvalResult, options: frozenset[str]) -> RetimeResult:
    primary_ms = {w.workload: w.timing.mean_ms for w in primary.workloads if w.timing}
    if primary.status is not Status.PASSED or not primary_ms:
        return RetimeResult(agreed=False, status=primary.status, message="the primary evaluation has no timings to check")
    stage = _Stage(ev, primary_ms)
    fresh = ev.evaluate(task, solution, workload_set=primary.workload_set, mode=primary.mode, timed=True,
                        options=options, _stage=stage)
    if fresh.status is not Status.PASSED:
        return RetimeResult(agreed=False, status=fresh.status, message=f"the re-timing run failed: {fresh.message}",
                            workloads=stage.results)
    bad = [r for r in stage.results if not r.agreed]
    message = "; ".join(
        f"{r.workload}: primary {r.primary_ms:.4g} ms is below the re-timed {r.retimed_ms:.4g} ms "
        f"({r.method.value}) by more than {r.tolerance:.0%}" for r in bad)
    return RetimeResult(agreed=not bad, status=Status.PASSED, message=message, workloads=stage.results)


class _Stage:
    """The timing stage of a re-timing run (Evaluator.evaluate calls it after the correctness checks)."""

    def __init__(self, ev: Evaluator, primary_ms: dict[str, float]):
        self.ev = ev
        self.primary_ms = primary_ms
        self.results: list[RetimedWorkload] = []

    def __call__(self, run: _Run, worker: WorkerHandle, deadline: float) -> float:
        from ksearch_ray.evaluation.evaluator import Failure
        from ksearch_ray.evaluation.seeds import call_seed

        ev, device = self.ev, run.device
        idle = ev.limits.idle
        worker.chan.send({"cmd": "retime", "workloads": [
            {"index": i, "workload": w.model_dump(), "seed": s}
            for i, (w, s) in enumerate(zip(run.workloads, run.time_seeds, strict=True))
        ]})
        busy = 0.0
        for i, workload in enumerate(run.workloads):
            if workload.name not in self.primary_ms:
                continue
            worker.chan.send({"cmd": "prepare", "index": i})
            prepared = ev._recv(worker, idle, f"re-timing set-up of {workload.name}", deadline)
            method = RetimeMethod.GRAPH_REPLAY if prepared.get("method") == "graph" else RetimeMethod.CALLS
            primary = self.primary_ms[workload.name]
            # The batch size comes from one call clocked here, never from the figure under test.
            one = self._batch(run, worker, "call", 1, deadline)
            reps = max(3, min(MAX_REPS[device], math.ceil(TARGET_S[device] / max(one, 1e-6))))
            per_call = []
            for _ in range(ROUNDS):
                flush_s = self._batch(run, worker, "flush", reps, deadline)
                call_s = self._batch(run, worker, "call", reps, deadline)
                per_call.append(max(call_s - flush_s, 0.0) * 1e3 / reps)
                busy += call_s
            worker.chan.send({"cmd": "output", "index": i})
            msg = ev._recv(worker, idle, f"re-timing of {workload.name}", deadline)
            verdict = ev._judge(run, workload, call_seed(run.time_seeds[i], 0), ev._load_outputs(msg, workload.name))
            if verdict.status is not Status.PASSED:
                raise Failure(verdict.status, f"{workload.name} (during re-timing): {verdict.message}", workload=workload.name)
            retimed = statistics.median(per_call)
            tol = TOLERANCE[(device, method)]
            self.results.append(RetimedWorkload(
                workload=workload.name, method=method, primary_ms=primary, retimed_ms=retimed, reps=reps,
                tolerance=tol, agreed=primary * (1 + tol) >= retimed,
            ))
        worker.chan.send({"cmd": "finish"})
        done = ev._recv(worker, idle, "re-timing", deadline)
        if done.get("type") != "done":
            raise Failure(Status.INTEGRITY_VIOLATION, f"unexpected message {done.get('type')!r} after re-timing")
        return busy

    def _batch(self, run: _Run, worker: WorkerHandle, kind: str, reps: int, deadline: float) -> float:
        """Seconds, on this process's clock, for the worker to run `reps` repetitions and sync."""
        t0 = time.monotonic()
        worker.chan.send({"cmd": "run", "kind": kind, "reps": reps})
        msg = self.ev._recv(worker, self.ev.limits.idle, f"re-timing ({kind})", deadline)
        elapsed = time.monotonic() - t0
        if msg.get("type") != "ran":
            from ksearch_ray.evaluation.evaluator import Failure

            raise Failure(Status.INTEGRITY_VIOLATION, f"unexpected message {msg.get('type')!r} while re-timing")
        return elapsed
