"""Staged evaluation of one candidate: build, correctness, timing; the first failure decides.

The candidate runs in a sandboxed worker (ksearch_ray.evaluation.sandbox). This process, which never
runs candidate code, regenerates every input from its seed, computes the reference (TF32 off)
and judges the outputs the worker wrote; it also computes every statistic from the raw
per-call times, which it reads from the worker's native stopwatch (not from the worker's
messages), and checks them against its own wall clock and the task's physical floor.
Exceptions become statuses here and in the worker, nowhere else.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import math
import os
import shutil
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from ksearch_ray.evaluation.buildcache import BuildRecord, sha256_bytes
from ksearch_ray.evaluation.compare import Comparison, compare_outputs
from ksearch_ray.evaluation.floors import DevicePeaks, peaks_for
from ksearch_ray.evaluation.retime import RetimeResult, retime
from ksearch_ray.evaluation.sandbox.channel import ChannelClosed, ChannelForgery, ChannelTimeout
from ksearch_ray.evaluation.sandbox.client import Sandbox, SandboxError, WorkerHandle, default_work_root
from ksearch_ray.evaluation.sandbox.clock import OUT_OF_ORDER, ClockRecord, parse_records
from ksearch_ray.evaluation.sandbox.isolation import Isolation
from ksearch_ray.evaluation.seeds import call_seed, derive_seed, new_secret
from ksearch_ray.models import EvalResult, Solution, Status, Timing, WorkloadResult
from ksearch_ray.taskspec.task import Task, TaskError, Workload

Mode = Literal["fresh", "reuse"]
# A stage after the correctness checks: (run, worker, deadline) -> seconds of candidate work.
Stage = Callable[["_Run", WorkerHandle, float], float]


GPUMODE_TASK_MODULE = '''"""The names GPUMode submissions import (`from task import input_t, output_t`): types only."""
from typing import Any

import torch

input_t = tuple[Any, ...]
output_t = torch.Tensor
'''


def trusted_prepare(task: Task, solution: Solution) -> str | None:
    """The untimed setup function of `solution`, when it may have one: only a Python solution that is,
    byte for byte, one of the task's own bundled solutions (a library baseline). A candidate that
    declares `prepare` is timed as every candidate is: its setup inside the timed call."""
    if not solution.prepare or solution.language != "python":
        return None
    try:
        bundled = task.solution(solution.name)
    except TaskError:
        return None
    return solution.prepare if bundled.id == solution.id else None


@dataclass
class Limits:
    """Seconds. A worker that sends nothing for `idle` seconds (a hang) is killed."""

    setup: float = 300.0
    build_python: float = 300.0
    build_cuda: float = 900.0
    idle: float = 180.0
    total: float = 3600.0


@dataclass
class TimingPolicy:
    """GPUMode's stop rule: up to max_calls, stop once std/sqrt(n)/mean < target_rel_err, or
    n*mean > max_total_s, or max_wall_s have passed (always at least 3 calls)."""

    max_calls: int = 100
    target_rel_err: float = 1e-3
    max_total_s: float = 10.0
    max_wall_s: float = 120.0
    warmup_calls: int = 2
    flush_l2: bool = True
    # Work hidden from the timed stream (side streams) keeps the device busy after the end event:
    # a device-wide sync right after it must return at once.
    tail_slack_ratio: float = 0.05
    tail_slack_ms: float = 0.05

    @classmethod
    def for_device(cls, device: str) -> TimingPolicy:
        # On the CPU path a call is the Triton interpreter (seconds, host wall clock): GPUMode's
        # 10 s per benchmark would make every evaluation minutes long for a number that only
        # ranks variants on this machine.
        if device == "cpu":
            return cls(max_calls=20, max_total_s=1.0, max_wall_s=10.0, warmup_calls=1)
        return cls()


@dataclass
class _Run:
    task: Task
    solution: Solution
    device: str
    options: frozenset[str]
    mode: Mode
    workloads: list[Workload]
    check_seeds: list[int]
    time_seeds: list[int]
    stage: Stage | None = None  # what follows the correctness checks when timed; None: Evaluator._time
    prebuilt: BuildRecord | None = None
    prepare: str | None = None  # the trusted untimed setup function (trusted_prepare), decided once
    results: list[WorkloadResult] = field(default_factory=list)
    build_seconds: float = 0.0


class Failure(Exception):
    def __init__(self, status: Status, message: str, log: str = "", workload: str | None = None):
        super().__init__(message)
        self.status, self.message, self.log, self.workload = status, message, log, workload


@contextlib.contextmanager
def reference_precision() -> Iterator[None]:
    """References compute in true fp32: TF32 off for the duration, restored after."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.get_float32_matmul_precision())
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[0], saved[1]
        torch.set_float32_matmul_precision(saved[2])


def device_name(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name()
    return "cpu (Triton interpreter, host timings)"


class Evaluator:
    """Owns one sandbox on one device; evaluates candidates one at a time.

    The sandbox lives in `work_root`, by default a private folder of its own under
    $XDG_RUNTIME_DIR or /tmp/ksearch-<uid> (never inside a run directory), removed on close.
    With `start=True` the sandbox starts now, so isolation warnings (or, with
    Isolation.REQUIRE, a SandboxError) come at once rather than with the first candidate."""

    def __init__(
        self,
        device: str = "cuda",
        work_root: Path | None = None,
        *,
        limits: Limits | None = None,
        timing: TimingPolicy | None = None,
        secret: int | None = None,
        isolation: Isolation = Isolation.BEST_EFFORT,
        peaks: DevicePeaks | None = None,
        start: bool = True,
    ):
        if device == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("device cuda requested but no CUDA GPU is visible")
        self.device = device
        self._owns_work_root = work_root is None
        # Absolute once, here: the worker changes into its job directory from the zygote's cwd.
        self.work_root = (Path(work_root) if work_root else default_work_root()).resolve()
        self.limits = limits or Limits()
        self.timing = timing or TimingPolicy.for_device(device)
        self.secret = new_secret() if secret is None else secret
        # Peaks of the GPU for the physical floor; none on the CPU path unless a caller supplies them.
        self.peaks = peaks if peaks is not None else (peaks_for(device_name(device)) if device == "cuda" else None)
        self.sandbox = Sandbox(device, self.work_root, isolation=Isolation(isolation))
        self._progress: Callable[[str], None] = lambda _message: None
        if start:
            self.sandbox.ensure_started()

    def close(self) -> None:
        self.sandbox.close()
        if self._owns_work_root:
            shutil.rmtree(self.work_root, ignore_errors=True)

    def __enter__(self) -> Evaluator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- public -----------------------------------------------------------------------------

    def evaluate(
        self,
        task: Task,
        solution: Solution,
        *,
        workload_set: str = "benchmarks",
        mode: Mode = "fresh",
        timed: bool | None = None,
        options: frozenset[str] | set[str] = frozenset(),
        progress: Callable[[str], None] | None = None,
        prebuilt: tuple[BuildRecord, bytes] | None = None,
        _stage: Stage | None = None,
    ) -> EvalResult:
        """The verdict on `solution`. `progress` hears one short line per stage and workload.
        `prebuilt`: the library of this solution built ahead of time (a CUDA/C++ candidate); loaded, not built.
        `_stage` replaces the timing stage (Evaluator.retime uses it); its seeds are drawn apart
        from the timing ones.

        Raises SandboxError when the sandbox itself cannot start a worker: that is no verdict on
        the candidate (none of its code has run), and a search must stop rather than count it.
        """
        self._progress = progress or (lambda _message: None)
        timed = (workload_set != "tests") if timed is None else timed
        if prebuilt is not None and (prebuilt[0].solution_id != solution.id or sha256_bytes(prebuilt[1]) != prebuilt[0].sha256):
            raise ValueError(f"the prebuilt library given for {solution.id} is not this solution's build")
        workloads = task.workloads(workload_set, self.device)
        tag = "time" if _stage is None else "retime"
        run = _Run(
            task, solution, self.device, frozenset(options), mode, workloads,
            [derive_seed(self.secret, w.name, w.params.get("seed"), "check") for w in workloads],
            [derive_seed(self.secret, w.name, w.params.get("seed"), tag) for w in workloads],
            stage=_stage,
            prebuilt=prebuilt[0] if prebuilt else None,
            prepare=trusted_prepare(task, solution),
        )
        result = EvalResult(
            solution_id=solution.id, solution_name=solution.name, task=task.name, status=Status.PASSED,
            workload_set=task.workload_set_name(workload_set, self.device), mode=mode, device=self.device,
            device_name=device_name(self.device), compat=sorted(options), timed=timed,
            prepared_untimed=run.prepare is not None,
        )
        t0 = time.monotonic()
        workdir = self._workdir(solution, prebuilt[1] if prebuilt else None,
                                gpumode=task.definition.interface == "gpumode")
        self._current_workdir = workdir
        worker = self.sandbox.start(self._job(run, workdir))
        busy = 0.0
        try:
            busy = self._drive(run, worker, timed, workdir)
            if not self.sandbox.healthy():
                # Nothing but the candidate runs beside the zygote: its death is the candidate's doing.
                raise Failure(Status.INTEGRITY_VIOLATION, "the sandbox's zygote process died while this candidate ran")
        except Failure as failure:
            result.status, result.message, result.log = failure.status, failure.message, failure.log
            self._mark_failed(run, failure)
        finally:
            self.sandbox.kill(worker)
            self.sandbox.reap(worker)
            shutil.rmtree(workdir, ignore_errors=True)
        result.workloads = run.results
        result.seconds = time.monotonic() - t0
        result.overhead_seconds = max(0.0, result.seconds - busy)
        result.build_seconds = run.build_seconds
        if result.status is Status.PASSED and timed:
            result.score = geomean([r.timing.mean_ms for r in run.results if r.timing])
            result.score_kind = "geomean of mean latency (ms)"
        return result

    def retime(
        self,
        task: Task,
        solution: Solution,
        primary: EvalResult,
        *,
        options: frozenset[str] | set[str] = frozenset(),
    ) -> RetimeResult:
        """Time `solution` again by a second, independent method, in a fresh worker, and say whether
        `primary` (its evaluation) agrees. See evaluation/retime.py for the method and tolerance."""
        return retime(self, task, solution, primary, frozenset(options))

    # --- internals ----------------------------------------------------------------------------

    def _workdir(self, solution: Solution, library: bytes | None = None, *, gpumode: bool = False) -> Path:
        workdir = self.work_root / "jobs" / f"{solution.id}-{uuid.uuid4().hex[:8]}"
        src = workdir / "src"
        src.mkdir(parents=True)
        for name, text in solution.sources.items():
            if "/" in name or name.startswith("."):
                raise ValueError(f"solution file name {name!r} is not a plain file name")
            (src / name).write_text(text)
        if gpumode and "task.py" not in solution.sources:
            # GPUMode submissions import their type names from the harness's `task` module.
            (src / "task.py").write_text(GPUMODE_TASK_MODULE)
        if library is not None:  # the candidate's own copy: nothing it does reaches the build cache
            (workdir / "prebuilt").mkdir()
            (workdir / "prebuilt" / "library.so").write_bytes(library)
        return workdir

    def _job(self, run: _Run, workdir: Path) -> dict[str, Any]:
        sol = run.solution
        cache = self.work_root / "cache" / sol.id / "triton"
        cache.mkdir(parents=True, exist_ok=True)
        return {
            "workdir": str(workdir),
            "triton_cache_dir": str(cache),
            "task_root": str(run.task.root),
            "device": run.device,
            "options": sorted(run.options),
            "solution_id": sol.id,
            "language": sol.language,
            "entry_file": sol.entry_file,
            "entry_point": sol.entry_point,
            "prepare": run.prepare,
            "prebuilt": {"path": str(workdir / "prebuilt" / "library.so"), "module": run.prebuilt.module_name}
            if run.prebuilt else None,
            "check": [
                {"index": i, "workload": w.model_dump(), "seed": s}
                for i, (w, s) in enumerate(zip(run.workloads, run.check_seeds, strict=True))
            ],
        }

    def _recv(self, worker: WorkerHandle, timeout: float, phase: str, deadline: float) -> dict[str, Any]:
        remaining = deadline - time.monotonic()
        try:
            msg = worker.chan.recv(min(timeout, max(remaining, 0.001)))
        except ChannelTimeout:
            self.sandbox.kill(worker)
            limit = timeout if timeout < remaining else self.limits.total
            raise Failure(Status.TIMEOUT, f"no progress for {limit:.0f} s during {phase}", self._logs()) from None
        except ChannelClosed:
            self.sandbox.kill(worker)
            code, sig = self.sandbox.reap(worker)
            how = f"killed by signal {sig}" if sig else f"exited with code {code}"
            logs = self._logs()
            last = next((line.strip() for line in reversed(logs.splitlines()) if "Error" in line), "")
            raise Failure(Status.CRASHED, f"worker process {how} during {phase}" + (f": {last[:300]}" if last else ""),
                          logs) from None
        except ChannelForgery as exc:
            raise Failure(Status.INTEGRITY_VIOLATION, f"forged message on the result channel ({exc})") from None
        if msg.get("type") == "fail":
            where = msg.get("workload")
            message = f"{where}: {msg['message']}" if where else msg["message"]
            raise Failure(Status(msg["status"]), message, msg.get("log", ""), workload=where)
        return msg

    def _logs(self) -> str:
        """Tail of what the worker printed: CUDA errors, aborts and tracebacks surface here."""
        tails = []
        for name in ("stderr.log", "stdout.log"):
            with contextlib.suppress(OSError):
                text = (self._current_workdir / name).read_text(errors="replace").strip()
                if text:
                    tails.append(text[-1500:])
        return "\n".join(tails)

    def _drive(self, run: _Run, worker: WorkerHandle, timed: bool, workdir: Path) -> float:
        """Talk to the worker through all stages; returns seconds of candidate work (build+calls)."""
        lim = self.limits
        deadline = time.monotonic() + lim.total
        self._progress("starting the sandbox worker")
        try:
            self._recv(worker, lim.setup, "sandbox start-up", deadline)
        except Failure as failure:
            # Nothing of the candidate has run before the worker reports ready.
            detail = failure.log.strip().splitlines()[-1] if failure.log.strip() else ""
            raise SandboxError(
                f"the sandbox could not start a worker ({failure.status.value}: {failure.message})"
                + (f"; last output: {detail[:300]}" if detail and detail not in failure.message else "")
            ) from None
        compiles = run.solution.language == "cuda" and run.prebuilt is None
        self._progress("building" if compiles else "loading the prebuilt library" if run.prebuilt else "importing the candidate")
        build_limit = lim.build_cuda if compiles else lim.build_python
        built = self._recv(worker, build_limit, "build", deadline)
        busy = run.build_seconds = float(built.get("seconds", 0.0))
        t_check = time.monotonic()
        for i, workload in enumerate(run.workloads):
            msg = self._recv(worker, lim.idle, f"correctness check of {workload.name}", deadline)
            outputs = self._load_outputs(msg, workload.name)
            verdict = self._judge(run, workload, run.check_seeds[i], outputs)
            if verdict.status is not Status.PASSED:
                raise Failure(verdict.status, f"{workload.name}: {verdict.message}", workload=workload.name)
            run.results.append(WorkloadResult(
                workload=workload.name, status=Status.PASSED, max_abs_error=verdict.max_abs_error,
                max_rel_error=verdict.max_rel_error, fraction_ok=verdict.fraction_ok,
            ))
            self._progress(f"correct on {workload.name} ({i + 1}/{len(run.workloads)})")
        self._recv(worker, lim.idle, "correctness checks", deadline)  # "checked"
        busy += time.monotonic() - t_check
        if not timed:
            worker.chan.send({"cmd": "stop"})
            return busy
        return busy + (run.stage or self._time)(run, worker, deadline)

    def _time(self, run: _Run, worker: WorkerHandle, deadline: float) -> float:
        pol = self.timing
        worker.chan.send({
            "cmd": "time", "mode": run.mode, "max_calls": pol.max_calls, "target_rel_err": pol.target_rel_err,
            "max_total_s": pol.max_total_s, "max_wall_s": pol.max_wall_s, "warmup_calls": pol.warmup_calls,
            "flush_l2": pol.flush_l2,
            "workloads": [
                {"index": i, "workload": w.model_dump(), "seed": s}
                for i, (w, s) in enumerate(zip(run.workloads, run.time_seeds, strict=True))
            ],
        })
        t0 = time.monotonic()
        reported_ms = 0.0
        stopwatch = _Records(worker.clock)
        for i, workload in enumerate(run.workloads):
            while True:
                msg = self._recv(worker, self.limits.idle, f"timing of {workload.name}", deadline)
                stopwatch.drain()  # keep the pipe empty: the worker must never block on it
                if msg["type"] == "timing":
                    break
            if msg["index"] != i:
                raise Failure(Status.INTEGRITY_VIOLATION, "timing results arrived out of order")
            records = stopwatch.take(int(msg["count"]), workload.name)
            # Re-check the output of the last timed call on inputs regenerated here.
            seed = call_seed(run.time_seeds[i], int(msg["seed_index"]))
            verdict = self._judge(run, workload, seed, self._load_outputs(msg, workload.name))
            if verdict.status is not Status.PASSED:
                raise Failure(verdict.status, f"{workload.name} (during timing): {verdict.message}", workload=workload.name)
            timing = self._stats(run, workload, records)
            run.results[i].timing = timing
            self._progress(f"timed {workload.name} ({i + 1}/{len(run.workloads)}): mean {timing.mean_ms:.4g} ms")
            reported_ms += sum(r.time_ms for r in records)
        elapsed_ms = (time.monotonic() - t0) * 1e3
        if reported_ms > elapsed_ms:
            # A compromised worker could report anything; it cannot make time pass faster here.
            raise Failure(Status.INTEGRITY_VIOLATION, f"reported {reported_ms:.0f} ms of timed calls in {elapsed_ms:.0f} ms of wall time")
        worker_done = self._recv(worker, self.limits.idle, "timing", deadline)
        if worker_done.get("type") != "done":
            raise Failure(Status.INTEGRITY_VIOLATION, f"unexpected message {worker_done.get('type')!r} after timing")
        stopwatch.drain()
        if stopwatch.pending:
            raise Failure(Status.INTEGRITY_VIOLATION, f"{len(stopwatch.pending)} stopwatch records beyond the timed calls")
        return elapsed_ms / 1e3

    def _stats(self, run: _Run, workload: Workload, records: list[ClockRecord]) -> Timing:
        name = workload.name
        times = [r.time_ms for r in records]
        if not times or any(not math.isfinite(t) or t < 0 for t in times):
            raise Failure(Status.INTEGRITY_VIOLATION, f"{name}: malformed timing report")
        median = statistics.median(times)
        tail = statistics.median(r.tail_ms for r in records)
        cuda = self.device == "cuda"
        if cuda and tail > self.timing.tail_slack_ms + self.timing.tail_slack_ratio * median:
            raise Failure(
                Status.INTEGRITY_VIOLATION,
                f"{name}: the GPU stayed busy {tail:.3f} ms after the timed stream finished ({median:.3f} ms timed): "
                "work escapes the timing stream (side streams); join them into the current stream before returning",
            )
        self._check_floor(run, workload, min(times))
        return Timing(
            mean_ms=statistics.fmean(times), median_ms=median, min_ms=min(times),
            std_ms=statistics.stdev(times) if len(times) > 1 else 0.0, count=len(times),
            wall_median_ms=statistics.median(r.wall_ms for r in records), clock="cuda_events" if cuda else "host_wall",
        )

    def _check_floor(self, run: _Run, workload: Workload, fastest_ms: float) -> None:
        """No call may beat the workload's work at the device's (generous) peaks."""
        cost = run.task.workload_cost(workload) if self.peaks is not None else None
        if cost is None or self.peaks is None:
            return
        floor = self.peaks.floor_ms(*cost)
        if fastest_ms < floor:
            raise Failure(
                Status.INTEGRITY_VIOLATION,
                f"{workload.name}: a call took {fastest_ms:.4g} ms, below the physical floor of {floor:.4g} ms "
                f"({cost[0]:.3g} FLOP and {cost[1]:.3g} bytes at the {self.peaks.name}'s peaks)",
            )

    def _load_outputs(self, msg: dict[str, Any], name: str) -> dict[str, torch.Tensor]:
        if msg.get("type") not in {"output", "timing"}:
            raise Failure(Status.INTEGRITY_VIOLATION, f"{name}: unexpected message {msg.get('type')!r}")
        path = Path(msg["file"])
        if path.parent != self._current_workdir:
            raise Failure(Status.INTEGRITY_VIOLATION, f"{name}: output file outside the job directory")
        data = path.read_bytes()  # read once: hash and load the same bytes
        if hashlib.sha256(data).hexdigest() != msg["sha256"]:
            raise Failure(Status.INTEGRITY_VIOLATION, f"{name}: output file changed after it was reported")
        try:
            loaded = torch.load(io.BytesIO(data), map_location=self.device, weights_only=True)
        except (RuntimeError, ValueError, EOFError) as exc:
            raise Failure(Status.INTEGRITY_VIOLATION, f"{name}: unreadable output file ({exc})") from None
        path.unlink(missing_ok=True)
        return loaded

    def _judge(self, run: _Run, workload: Workload, seed: int, outputs: dict[str, torch.Tensor]) -> Comparison:
        task = run.task
        inputs = task.generate_inputs(workload, seed, run.device, run.options)
        with reference_precision(), torch.no_grad():
            expected = task.reference(inputs)
        del inputs
        relaxed = task.definition.tolerance.relaxed_dtype_option
        verdict = compare_outputs(
            outputs, expected, task.definition.outputs, task.definition.tolerance,
            any_float_dtype=relaxed is not None and relaxed in run.options,
        )
        del expected, outputs
        return verdict

    def _mark_failed(self, run: _Run, failure: Failure) -> None:
        name = failure.workload or "(build)"
        for r in run.results:
            if r.workload == name:
                r.status, r.message = failure.status, failure.message
                return
        run.results.append(WorkloadResult(workload=name, status=failure.status, message=failure.message))


class _Records:
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


def geomean(values: list[float]) -> float | None:
    if not values or any(v <= 0 for v in values):
        return None
    return math.exp(sum(math.log(v) for v in values) / len(values))
