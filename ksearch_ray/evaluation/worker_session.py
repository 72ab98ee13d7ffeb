"""One worker, from its start to the verdict: the evaluator's public session API.

A `Session` is what every stage of an evaluation (the primary timing in evaluation/timing.py, the
re-timing in evaluation/retime.py) talks to the worker through: typed messages received under the
stage's wait limit, hand-overs of outputs, and verdicts from the judge. It also keeps the clock of
the evaluation: wall seconds per stage (`stages`) and the longest wait per stage (`waits`, which
is what scaled time limits learn from a baseline).
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import torch
from pydantic import BaseModel

from ksearch_ray.evaluation.buildcache import BuildRecord
from ksearch_ray.evaluation.compare import Comparison
from ksearch_ray.evaluation.judge import Judge
from ksearch_ray.evaluation.sandbox.channel import ChannelClosed, ChannelForgery, ChannelTimeout
from ksearch_ray.evaluation.sandbox.handle import Sandbox, WorkerHandle
from ksearch_ray.evaluation.sandbox.handover import HandoverError, Importer
from ksearch_ray.evaluation.sandbox.protocol import (
    Fail,
    Handover,
    Progress,
    ProtocolError,
    Taken,
    parse_report,
)
from ksearch_ray.evaluation.sandbox.resources import (
    DISK_LIMIT,
    LOG_TAIL_BYTES,
    OUTPUT_LIMIT,
    Resources,
    read_tail,
)
from ksearch_ray.models import Objective, Solution, Status, WorkloadResult
from ksearch_ray.taskspec.spec import Workload
from ksearch_ray.taskspec.task import Task
from ksearch_ray.text import clip

M = TypeVar("M", bound=BaseModel)


class Failure(Exception):
    """The verdict, when it is not PASSED: raised by any stage, caught once by the evaluator."""

    def __init__(self, status: Status, message: str, log: str = "", workload: str | None = None):
        super().__init__(message)
        self.status, self.message, self.log, self.workload = status, message, log, workload


@dataclass
class RunSpec:
    """What one evaluation evaluates: the candidate, its workloads and their seeds."""

    task: Task
    solution: Solution
    device: str
    options: frozenset[str]
    mode: str
    workloads: list[Workload]
    check_seeds: list[int]
    time_seeds: list[int]
    prebuilt: BuildRecord | None = None
    prepare: str | None = None  # the trusted untimed setup function (trusted_prepare), decided once
    objective: Objective = "call"  # which figure is `timing` (the task's, or --objective)
    flush_l2: bool = True  # the task's rule and the timing policy both ask for it
    recheck: bool = False  # every timed call's output judged before the next call (fresh inputs only)
    results: list[WorkloadResult] = field(default_factory=list)
    build_seconds: float = 0.0
    check_order: list[int] = field(default_factory=list)
    """Indices of `workloads` in the order the correctness stage checks them (cheapest first); empty: in order."""

    def checks(self) -> list[int]:
        return self.check_order or list(range(len(self.workloads)))


@dataclass
class WaitLimit:
    """Seconds a wait in one stage may last, and how that figure came about (for the message)."""

    seconds: float
    why: str = ""


# What a process says when an allocation, a fork or a thread was refused by its limits.
_HOST_MEMORY = re.compile(r"(?<![A-Za-z])MemoryError|std::bad_alloc|Cannot allocate memory|DefaultCPUAllocator: can't allocate")
_NO_PROCESS = re.compile(r"BlockingIOError: \[Errno 11\]|Resource temporarily unavailable|can't start new thread")


def limit_hit(limits: Resources, code: int, sig: int, text: str) -> str | None:
    """The one-line reason a worker that ended with (`code`, `sig`) and said `text` hit one of its
    resource limits; None if it did not."""
    if code == OUTPUT_LIMIT:
        return (f"the candidate printed more than {limits.output_mb} MiB (stdout and stderr, "
                "evaluation.limits.output_mb) and was stopped")
    if code == DISK_LIMIT:
        return (f"the candidate filled more than {limits.disk_mb} MiB of disk in its job directory "
                "(evaluation.limits.disk_mb) and was stopped")
    if limits.file_mb and (sig == signal.SIGXFSZ or "File too large" in text):  # Python ignores SIGXFSZ: EFBIG
        return f"the candidate wrote a file larger than {limits.file_mb} MiB (evaluation.limits.file_mb)"
    if limits.memory_mb and _HOST_MEMORY.search(text):
        return f"the candidate ran out of its host memory ({limits.memory_mb} MiB, evaluation.limits.memory_mb)"
    if limits.processes and _NO_PROCESS.search(text):
        return (f"the candidate could not start a process or thread: its limit is {limits.processes} "
                "(evaluation.limits.processes)")
    return None


class Session:
    def __init__(self, sandbox: Sandbox, worker: WorkerHandle, run: RunSpec, judge: Judge, workdir: Path,
                 limits: Callable[[str], WaitLimit], deadline: float, total: float,
                 say: Callable[[str], None] = lambda _line: None, started: float | None = None):
        self.sandbox, self.worker, self.run, self.judge = sandbox, worker, run, judge
        self.workdir = workdir
        self.limit = limits
        self.deadline, self.total = deadline, total
        self.importer = Importer(run.device)
        self.say = say  # one short line per stage and workload, for whoever watches
        self.stages: dict[str, float] = {}
        self.waits: dict[str, float] = {}
        # "start" counts from `started` (the evaluation's first step: the sandbox's start, its pids cgroup
        # included, and the work folder come before this session exists), so the stages add up to the whole.
        self._stage, self._since = "start", time.monotonic() if started is None else started

    # --- the clock ----------------------------------------------------------------------------

    def begin(self, stage: str) -> None:
        """From now on the evaluation's wall time counts towards `stage`."""
        now = time.monotonic()
        self.stages[self._stage] = self.stages.get(self._stage, 0.0) + now - self._since
        self._stage, self._since = stage, now

    def finish(self) -> dict[str, float]:
        self.begin("done")
        self.stages.pop("done", None)
        return {k: round(v, 4) for k, v in self.stages.items()}

    # --- messages -----------------------------------------------------------------------------

    def send(self, message: BaseModel) -> None:
        """Send `message` to the worker; a worker that is gone (its end of the channel closed, as a candidate
        may do to it) is a CRASHED failure, as when `recv` finds it gone."""
        try:
            self.worker.chan.send(message)
        except OSError:
            raise self._gone(f"before it took the evaluator's {getattr(message, 'type', type(message).__name__)!r}") from None

    def _gone(self, when: str) -> Failure:
        """The worker's end of the channel closed: the failure its exit means (a resource limit it hit, or a
        crash with its last error line), `when` saying at what point."""
        self.sandbox.kill(self.worker)
        code, sig = self.sandbox.reap(self.worker)
        how = f"killed by signal {sig}" if sig else f"exited with code {code}"
        logs = self.logs()
        hit = limit_hit(self.sandbox.resources, code, sig, logs)
        if hit:
            return Failure(Status.RESOURCE_LIMIT, f"{hit} {when}", logs)
        last = next((line.strip() for line in reversed(logs.splitlines()) if "Error" in line), "")
        return Failure(Status.CRASHED, f"worker process {how} {when}" + (f": {clip(last, 300)}" if last else ""), logs)

    def recv(self, stage: str, phase: str, *expect: type[M]) -> M:
        """The next message of one of the types `expect`. Progress reports reset the wait; a Fail
        becomes its Failure; a timeout, a dead worker or a malformed frame become theirs."""
        while True:
            limit = self.limit(stage)
            remaining = self.deadline - time.monotonic()
            t0 = time.monotonic()
            try:
                data = self.worker.chan.recv(min(limit.seconds, max(remaining, 0.001)))
            except ChannelTimeout:
                self.sandbox.kill(self.worker)
                if limit.seconds < remaining:
                    raise Failure(Status.TIMEOUT, f"no progress for {limit.seconds:.0f} s during {phase}{limit.why}",
                                  self.logs()) from None
                raise Failure(Status.TIMEOUT, f"the evaluation ran past its limit of {self.total:.0f} s during {phase}",
                              self.logs()) from None
            except ChannelClosed:
                raise self._gone(f"during {phase}") from None
            except ChannelForgery as exc:
                raise Failure(Status.INTEGRITY_VIOLATION, f"forged message on the result channel ({exc})") from None
            self.waits[stage] = max(self.waits.get(stage, 0.0), time.monotonic() - t0)
            try:
                msg = parse_report(data)
            except ProtocolError as exc:
                raise Failure(Status.INTEGRITY_VIOLATION, f"malformed message from the worker during {phase} ({exc})") from None
            if isinstance(msg, Fail):
                where = msg.workload
                hit = limit_hit(self.sandbox.resources, 0, 0, f"{msg.message}\n{msg.log}") \
                    if msg.status in (Status.RUNTIME_ERROR, Status.COMPILE_ERROR, Status.CRASHED) else None
                status, message = (Status.RESOURCE_LIMIT, f"{hit}: {msg.message}") if hit else (msg.status, msg.message)
                raise Failure(status, f"{where}: {message}" if where else message, msg.log, workload=where)
            if isinstance(msg, expect):
                return msg
            if isinstance(msg, Progress):
                continue
            raise Failure(Status.INTEGRITY_VIOLATION, f"unexpected message {msg.type!r} during {phase}")

    def take(self, handover: Handover, name: str) -> dict[str, torch.Tensor]:
        """The outputs a message handed over, as tensors of this process; the worker may then go on."""
        try:
            fds = self.worker.chan.take_fds(handover.fds)
        except ChannelForgery as exc:
            raise Failure(Status.INTEGRITY_VIOLATION, f"{name}: {exc}") from None
        try:
            outputs = self.importer.take(handover, fds)
        except HandoverError as exc:
            raise Failure(Status.INTEGRITY_VIOLATION, f"{name}: {exc}") from None
        if handover.transport == "cuda_vmm":
            self.send(Taken())  # device memory the worker can still write: it waited for this copy
        return outputs

    # --- verdicts -----------------------------------------------------------------------------

    def judge_later(self, index: int, seed: int, outputs: dict[str, torch.Tensor], *,
                    keep: bool = True) -> Future[Comparison]:
        """`keep`: the reference is worth caching (Judge.submit): only for a correctness check's seed."""
        run = self.run
        return self.judge.submit(run.task, run.workloads[index], seed, run.options, outputs, keep=keep)

    def verdict(self, index: int, comparison: Comparison, during: str = "") -> Comparison:
        """`comparison`, or the Failure it means."""
        if comparison.status is not Status.PASSED:
            name = self.run.workloads[index].name
            raise Failure(comparison.status, f"{name}{during}: {comparison.message}", workload=name)
        return comparison

    def logs(self) -> str:
        """Tail of what the worker printed: CUDA errors, aborts and tracebacks surface here."""
        tails = []
        for name in ("stderr.log", "stdout.log"):
            text = read_tail(self.workdir / name, LOG_TAIL_BYTES).strip()  # a bounded tail, whatever the log's size
            if text:
                tails.append(text[-1500:])
        return "\n".join(tails)

    def stop_worker(self) -> None:
        """The worker has nothing left to do: kill it now, so its teardown overlaps what follows."""
        self.sandbox.kill(self.worker)

    def close(self) -> None:
        self.sandbox.kill(self.worker)
        self.sandbox.reap(self.worker)
        self.importer.release()
