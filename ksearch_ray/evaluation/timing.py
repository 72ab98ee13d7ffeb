"""The primary timing stage, on the evaluator's side: the stopwatch's records, the statistics, the checks.

The worker times each call with the native stopwatch (sandbox/ksclock.c), whose records reach this
process through a pipe, never through the worker's messages. Here every statistic is computed from
those records and checked: one record per timed call, in sequence; no work left running on the GPU
after a call's end event (side streams); no more timed time than wall time passed here; no call
below the task's physical floor. The outputs of each workload's last timed call are judged after
the worker is done, so the judge never competes with timed calls for the GPU; where the task rechecks
(GPUMode's leaderboard mode), every earlier call's output is judged before the worker makes its next
call (it waits for Go).
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable

import torch

from ksearch_ray.evaluation.floors import DevicePeaks
from ksearch_ray.evaluation.sandbox.clock import OUT_OF_ORDER, ClockRecord, parse_records
from ksearch_ray.evaluation.sandbox.protocol import (
    CallOutput,
    Done,
    Go,
    Tick,
    TimeCmd,
    Timed,
    Warmed,
    WorkItem,
)
from ksearch_ray.evaluation.seeds import call_seed
from ksearch_ray.evaluation.settings import TimingPolicy
from ksearch_ray.evaluation.worker_session import Failure, RunSpec, Session
from ksearch_ray.models import Status, Timing
from ksearch_ray.taskspec.spec import Workload

MAD_TO_SIGMA = 1.4826  # a normal distribution's standard deviation per median absolute deviation


def time_command(run: RunSpec, policy: TimingPolicy) -> TimeCmd:
    return TimeCmd(
        mode="reuse" if run.mode == "reuse" else "fresh",
        workloads=[WorkItem(index=i, workload=w, seed=s)
                   for i, (w, s) in enumerate(zip(run.workloads, run.time_seeds, strict=True))],
        max_calls=policy.max_calls, min_calls=policy.min_calls, target_rel_err=policy.target_rel_err,
        max_total_s=policy.max_total_s, max_wall_s=policy.max_wall_s, warmup_calls=policy.warmup_calls,
        flush_l2=run.flush_l2, graphs=policy.graphs, recheck=run.recheck,
    )


class TimedStage:
    """The primary timing. The worker was sent `time_command` already, and warms up first; it times
    its calls once this stage says Go (the judge is idle by then)."""

    def __init__(self, policy: TimingPolicy, peaks: DevicePeaks | None, *,
                 timed_done: Callable[[], None] = lambda: None):
        """`timed_done`: called once the worker's timed calls are over and the last outputs are queued on the
        judge: the device's next turn may begin (Evaluator, with overlap)."""
        self.policy, self.peaks = policy, peaks
        self.timed_done = timed_done
        self.timed_seconds = 0.0

    def __call__(self, session: Session) -> float:
        run = session.run
        session.recv("warmup", "warm-up", Warmed)
        session.begin("timing")
        # The clock starts before Go is sent: the worker cannot time a call before then. (Taken after
        # the send, it could start late, while this thread waits for the GIL that the judge thread
        # holds, and an honest worker's calls would seem to outrun the wall clock.)
        t0 = time.monotonic()
        session.send(Go())
        stopwatch = Records(session.worker.clock)
        # Per workload: the kernel figure (graph replays) where the call can be captured, then the
        # call figure, which closes the workload.
        reports: list[list[Timed]] = []
        records: list[list[list[ClockRecord]]] = []
        outputs: list[list[dict[str, torch.Tensor]]] = []
        for i, workload in enumerate(run.workloads):
            got: list[Timed] = []
            taken_records: list[list[ClockRecord]] = []
            taken_outputs: list[dict[str, torch.Tensor]] = []
            rechecked = -1  # the last call whose output was judged during timing
            while not got or got[-1].figure != "call":
                msg = session.recv("timing", f"timing of {workload.name}", Tick, Timed, CallOutput)
                stopwatch.drain()  # keep the pipe empty: the worker must never block on it
                if isinstance(msg, CallOutput):
                    rechecked = self.recheck(session, i, msg, rechecked)
                    continue
                if not isinstance(msg, Timed):
                    continue
                if msg.index != i or (msg.figure == "kernel" and (got or run.device != "cuda")):
                    raise Failure(Status.INTEGRITY_VIOLATION, "timing results arrived out of order")
                if (msg.figure == "kernel") != (msg.method == "graph_replay"):
                    raise Failure(Status.INTEGRITY_VIOLATION, f"{workload.name}: a {msg.figure} figure timed as {msg.method}")
                got.append(msg)
                taken_records.append(stopwatch.take(msg.count, workload.name))
                # At once: a worker that handed over device memory waits for `taken` before it goes on.
                taken_outputs.append(session.take(msg.handover, workload.name))
            records.append(taken_records)
            reports.append(got)
            outputs.append(taken_outputs)
        elapsed = time.monotonic() - t0
        reported_ms = sum(r.time_ms for per in records for rs in per for r in rs)
        if reported_ms > elapsed * 1e3:
            # A compromised worker could report anything; it cannot make time pass faster here.
            raise Failure(Status.INTEGRITY_VIOLATION,
                          f"reported {reported_ms:.0f} ms of timed calls in {elapsed * 1e3:.0f} ms of wall time")
        session.recv("timing", "timing", Done)
        stopwatch.drain()
        if stopwatch.pending:
            raise Failure(Status.INTEGRITY_VIOLATION, f"{len(stopwatch.pending)} stopwatch records beyond the timed calls")
        self.timed_seconds = reported_ms / 1e3
        session.stop_worker()  # it is done: its teardown overlaps the judging
        session.begin("judging_timed")
        # Each figure's last timed output, against the reference on inputs regenerated here.
        futures = [[session.judge_later(i, call_seed(run.time_seeds[i], m.seed_index), out, keep=False)
                    for m, out in zip(msgs, outs, strict=True)]
                   for i, (msgs, outs) in enumerate(zip(reports, outputs, strict=True))]
        outputs.clear()  # the judge holds them now
        # Queued first on the judge's one thread, these verdicts come before any of the next turn's: that turn's
        # timed calls wait for its own verdicts, so the judge is idle by then.
        self.timed_done()
        for i, per in enumerate(futures):
            for future, m in zip(per, reports[i], strict=True):
                session.verdict(i, future.result(), f" (during timing, {m.figure} figure)")
            result = run.results[i]
            for m, rs in zip(reports[i], records[i], strict=True):
                timing = self.stats(run, run.workloads[i], rs, m.method)
                if m.figure == "kernel":
                    result.kernel_timing = timing
                else:
                    result.call_timing = timing
            # The objective's figure; a call that cannot be captured has only the call figure.
            result.timing = (result.kernel_timing if run.objective == "kernel" and result.kernel_timing
                             else result.call_timing)
            session.say(f"timed {run.workloads[i].name} ({i + 1}/{len(run.workloads)}): "
                        f"{figures_text(result.kernel_ms, result.call_ms, run.objective)}")
        return elapsed

    def recheck(self, session: Session, i: int, msg: CallOutput, last: int) -> int:
        """A timed call's output, judged now against the reference for its inputs (the worker waits for
        Go, so the judge never runs beside a timed call); returns the call's index."""
        run = session.run
        name = run.workloads[i].name
        if not run.recheck or msg.index != i or not last < msg.seed_index < self.policy.max_calls:
            raise Failure(Status.INTEGRITY_VIOLATION, f"{name}: a timed call's output arrived out of order")
        outputs = session.take(msg.handover, name)
        comparison = session.judge_later(i, call_seed(run.time_seeds[i], msg.seed_index), outputs, keep=False).result()
        del outputs
        session.verdict(i, comparison, f" (during timing, call {msg.seed_index})")
        session.send(Go())
        return msg.seed_index

    def stats(self, run: RunSpec, workload: Workload, records: list[ClockRecord], method: str) -> Timing:
        name = workload.name
        times = [r.time_ms for r in records]
        if not times or any(not math.isfinite(t) or t < 0 for t in times):
            raise Failure(Status.INTEGRITY_VIOLATION, f"{name}: malformed timing report")
        median = statistics.median(times)
        tail = statistics.median(r.tail_ms for r in records)
        cuda = run.device == "cuda"
        pol = self.policy
        if cuda and tail > pol.tail_slack_ms + pol.tail_slack_ratio * median:
            raise Failure(
                Status.INTEGRITY_VIOLATION,
                f"{name}: the GPU stayed busy {tail:.3f} ms after the timed stream finished ({median:.3f} ms timed): "
                "work escapes the timing stream (side streams); join them into the current stream before returning",
            )
        check_floor(run, workload, min(times), self.peaks)
        mean = statistics.fmean(times)
        std = statistics.stdev(times) if len(times) > 1 else 0.0
        mad = statistics.median(abs(t - median) for t in times)
        return Timing(
            mean_ms=mean, median_ms=median, min_ms=min(times), std_ms=std, count=len(times),
            wall_median_ms=statistics.median(r.wall_ms for r in records), clock="cuda_events" if cuda else "host_wall",
            host_median_ms=statistics.median(r.host_ms for r in records),
            method="graph_replay" if method == "graph_replay" else "calls",
            rel_err=std / math.sqrt(len(times)) / mean if mean > 0 and len(times) > 1 else None,
            robust_rel_err=MAD_TO_SIGMA * mad / math.sqrt(len(times)) / median if median > 0 and len(times) > 1 else None,
        )


def figures_text(kernel_ms: float | None, call_ms: float | None, objective: str) -> str:
    """'kernel 0.755 ms · call 0.946 ms (objective)': both figures, the objective's marked."""
    parts = []
    for name, ms in (("kernel", kernel_ms), ("call", call_ms)):
        text = f"{name} {ms:.4g} ms" if ms is not None else f"{name} -"
        parts.append(text + (" (objective)" if name == objective else ""))
    return " · ".join(parts)


def check_floor(run: RunSpec, workload: Workload, fastest_ms: float, peaks: DevicePeaks | None) -> None:
    """No call may beat the workload's work at the device's (generous) peaks."""
    cost = run.task.workload_cost(workload) if peaks is not None else None
    if cost is None or peaks is None:
        return
    floor = peaks.floor_ms(*cost)
    if fastest_ms < floor:
        raise Failure(
            Status.INTEGRITY_VIOLATION,
            f"{workload.name}: a call took {fastest_ms:.4g} ms, below the physical floor of {floor:.4g} ms "
            f"({cost[0]:.3g} FLOP and {cost[1]:.3g} bytes at the {peaks.name}'s peaks)",
        )


class Records:
    """The evaluator's end of a worker's stopwatch pipe."""

    def __init__(self, fd: int):
        self.fd = fd
        self.buf = bytearray()
        self.pending: list[ClockRecord] = []
        self.next_seq = 0

    def drain(self) -> None:
        while True:
            try:
                chunk = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                break
            if not chunk:
                break
            self.buf += chunk
        try:
            self.pending += parse_records(self.buf)
        except ValueError as exc:
            raise Failure(Status.INTEGRITY_VIOLATION, f"stopwatch pipe: {exc}") from None

    def take(self, count: int, name: str) -> list[ClockRecord]:
        self.drain()
        if count < 1 or len(self.pending) < count:
            raise Failure(Status.INTEGRITY_VIOLATION,
                          f"{name}: the worker reported {count} timed calls, the stopwatch recorded {len(self.pending)}")
        records, self.pending = self.pending[:count], self.pending[count:]
        for r in records:
            if r.seq != self.next_seq or r.flags & OUT_OF_ORDER:
                raise Failure(Status.INTEGRITY_VIOLATION,
                              f"{name}: the stopwatch was driven out of order (its begin/end called from outside the harness)")
            if r.status:
                raise Failure(Status.RUNTIME_ERROR, f"{name}: CUDA error {r.status} while timing")
            self.next_seq += 1
        return records
