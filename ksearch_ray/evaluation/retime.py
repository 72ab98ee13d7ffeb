"""Re-timing a new best by a second, independent method, before it is believed.

The primary measurement (evaluation/timing.py) is taken inside the candidate's process. The second one
is clocked here, in the evaluator's process, which no candidate code reaches: the worker is told
to run R calls back to back and sync, and the evaluator times the round trip with its own clock.
R is chosen from one call clocked the same way (never from the figure under test) so the round
trip's own cost (well under a millisecond) is small against the total, and the same R iterations
of an L2 flush alone are timed and subtracted, which also cancels it.

* GPU, kernel objective: the candidate's call (with an L2 flush before it, as in the primary timing)
  is captured once in a CUDA graph and replayed: no candidate Python runs while it is timed, and no
  launch overhead counts. A call that cannot be captured (it syncs, or plans on the host per call)
  is timed as plain back-to-back calls, which counts its host overhead too.
* GPU, call objective: plain back-to-back calls (the primary figure is the call's).
* CPU: plain back-to-back calls (the primary figure is host wall time too).

The candidate's output after the timed repetitions is checked against the reference again, so
the repeated work is the real work. The primary figure may not be lower than the independent one
by more than the tolerance (per method below); it may be higher (launch gaps, host planning and
cold caches count in the primary timing, so an honest kernel often is). A disagreement means the
primary number cannot be trusted: the caller must not record it as a best. A re-timing whose worker
died (CRASHED: a signal or an exit, perhaps from outside, as the OOM killer's) is run once more on a
fresh worker: a best is not lost to an infrastructure fault, and only a second failure decides.

Call, once a candidate's evaluation `primary` beats the current best:

    check = evaluator.retime(task, solution, primary, options=options)
    if check.agreed: accept the best (check.workloads holds both figures per workload)
    else: record it as not confirmed (check.message says why)
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Callable
from enum import StrEnum

from pydantic import BaseModel, Field

from ksearch_ray.evaluation.sandbox.protocol import (
    Done,
    FinishCmd,
    Output,
    OutputCmd,
    PrepareCmd,
    Prepared,
    Ran,
    RetimeCmd,
    RunCmd,
    WorkItem,
)
from ksearch_ray.evaluation.seeds import call_seed
from ksearch_ray.evaluation.worker_session import Session
from ksearch_ray.models import EvalResult, Solution, Status
from ksearch_ray.taskspec.task import Task

log = logging.getLogger(__name__)


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
    seconds: float | None = Field(default=None, description="Its wall time on the evaluator, from the device's turn "
                                  "to its end (set by Evaluator.retime).")


def retime(evaluate: Callable[..., EvalResult], device: str, task: Task, solution: Solution, primary: EvalResult,
           options: frozenset[str]) -> RetimeResult:
    """`evaluate`: an Evaluator's evaluate, which runs the stage given as `stage` after the correctness checks."""
    primary_ms = {w.workload: w.timing.mean_ms for w in primary.workloads if w.timing}
    if primary.status is not Status.PASSED or not primary_ms:
        return RetimeResult(agreed=False, status=primary.status, message="the primary evaluation has no timings to check")
    stage = RetimeStage(device, primary_ms)
    fresh = evaluate(task, solution, workload_set=primary.workload_set, mode=primary.mode, timed=True,
                     options=options, stage=stage)
    first = ""
    if fresh.status is Status.CRASHED:
        # The worker died (a signal, an exit) though the candidate passed its first measurement: perhaps killed
        # from outside (the OOM killer, an operator), which is not the candidate's doing. Once more, on a fresh
        # worker; only a second failure decides.
        first = f" (and before it, on another worker: {fresh.message})"
        log.warning("re-timing %s: the worker died (%s); once more on a fresh worker", solution.id, fresh.message)
        stage = RetimeStage(device, primary_ms)
        fresh = evaluate(task, solution, workload_set=primary.workload_set, mode=primary.mode, timed=True,
                         options=options, stage=stage)
    if fresh.status is not Status.PASSED:
        return RetimeResult(agreed=False, status=fresh.status,
                            message=f"the re-timing run failed: {fresh.message}{first}", workloads=stage.results)
    bad = [r for r in stage.results if not r.agreed]
    message = "; ".join(
        f"{r.workload}: primary {r.primary_ms:.4g} ms is below the re-timed {r.retimed_ms:.4g} ms "
        f"({r.method.value}) by more than {r.tolerance:.0%}" for r in bad)
    return RetimeResult(agreed=not bad, status=Status.PASSED, message=message, workloads=stage.results)


class RetimeStage:
    """The timing stage of a re-timing run (Evaluator.evaluate calls it after the correctness checks)."""

    def __init__(self, device: str, primary_ms: dict[str, float]):
        self.device = device
        self.primary_ms = primary_ms
        self.results: list[RetimedWorkload] = []

    def __call__(self, session: Session) -> float:
        run, device = session.run, self.device
        # The objective decides what is re-timed: the kernel as a graph replay, or the call as calls.
        session.send(RetimeCmd(workloads=[
            WorkItem(index=i, workload=w, seed=s) for i, (w, s) in enumerate(zip(run.workloads, run.time_seeds, strict=True))
        ], graphs=run.objective == "kernel"))
        busy = 0.0
        for i, workload in enumerate(run.workloads):
            if workload.name not in self.primary_ms:
                continue
            session.send(PrepareCmd(index=i))
            prepared = session.recv("timing", f"re-timing set-up of {workload.name}", Prepared)
            method = RetimeMethod.GRAPH_REPLAY if prepared.method == "graph_replay" else RetimeMethod.CALLS
            primary = self.primary_ms[workload.name]
            # The batch size comes from one call clocked here, never from the figure under test.
            one = self._batch(session, "call", 1)
            reps = max(3, min(MAX_REPS[device], math.ceil(TARGET_S[device] / max(one, 1e-6))))
            per_call = []
            for _ in range(ROUNDS):
                flush_s = self._batch(session, "flush", reps)
                call_s = self._batch(session, "call", reps)
                per_call.append(max(call_s - flush_s, 0.0) * 1e3 / reps)
                busy += call_s
            session.send(OutputCmd(index=i))
            msg = session.recv("timing", f"re-timing of {workload.name}", Output)
            outputs = session.take(msg.handover, workload.name)
            session.verdict(i, session.judge_later(i, call_seed(run.time_seeds[i], 0), outputs, keep=False).result(),
                            " (during re-timing)")
            retimed = statistics.median(per_call)
            tol = TOLERANCE[(device, method)]
            self.results.append(RetimedWorkload(
                workload=workload.name, method=method, primary_ms=primary, retimed_ms=retimed, reps=reps,
                tolerance=tol, agreed=primary * (1 + tol) >= retimed,
            ))
        session.send(FinishCmd())
        session.recv("timing", "re-timing", Done)
        return busy

    def _batch(self, session: Session, kind: str, reps: int) -> float:
        """Seconds, on this process's clock, for the worker to run `reps` repetitions and sync."""
        t0 = time.monotonic()
        session.send(RunCmd(kind="flush" if kind == "flush" else "call", reps=reps))
        session.recv("timing", f"re-timing ({kind})", Ran)
        return time.monotonic() - t0
