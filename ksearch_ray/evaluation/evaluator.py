"""Staged evaluation of one candidate: build, correctness, timing; the first failure decides.

The candidate runs in a sandboxed worker (ksearch_ray.evaluation.sandbox). This process, which never
runs candidate code, regenerates every input from its seed, computes the reference (TF32 off; for a
task from outside the package, a sandboxed worker does both: evaluation/reference.py) and judges the outputs the worker hands over (evaluation/judge.py, on a thread of its own, while the
worker goes on); it also computes every statistic from the raw per-call times, which it reads from
the worker's native stopwatch (not from the worker's messages), and checks them against its own
wall clock and the task's physical floor (evaluation/timing.py). Each wait for the worker is
limited by the stage's scaled limit (evaluation/settings.py). Exceptions become statuses here and
in the worker, nowhere else.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import shutil
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Literal

import torch

from ksearch_ray.evaluation import gpu_driver
from ksearch_ray.evaluation.buildcache import BuildRecord, sha256_bytes
from ksearch_ray.evaluation.compare import Comparison
from ksearch_ray.evaluation.device_turn import DeviceTurn
from ksearch_ray.evaluation.floors import DevicePeaks, peaks_for
from ksearch_ray.evaluation.judge import Judge
from ksearch_ray.evaluation.ncu import find_ncu, ncu_arguments, ncu_version, source_identifiers
from ksearch_ray.evaluation.profiling import ProfileResult, ProfilerFound, run_profile, slowest_workload
from ksearch_ray.evaluation.reference import SandboxedReference
from ksearch_ray.evaluation.retime import RetimeResult, retime
from ksearch_ray.evaluation.sandbox import leftovers
from ksearch_ray.evaluation.sandbox.handle import (
    Sandbox,
    SandboxError,
    declared_environment,
    default_work_root,
    job_dir,
    scrubbed_environment,
)
from ksearch_ray.evaluation.sandbox.handover import describe
from ksearch_ray.evaluation.sandbox.isolation import Isolation
from ksearch_ray.evaluation.sandbox.protocol import (
    Built,
    Checked,
    Go,
    Job,
    Output,
    Prebuilt,
    ProfileJob,
    Ready,
    StopCmd,
    WorkItem,
)
from ksearch_ray.evaluation.sandbox.resources import Resources
from ksearch_ray.evaluation.seeds import derive_seed, new_secret
from ksearch_ray.evaluation.settings import Limits, ProfilerSettings, TimingPolicy
from ksearch_ray.evaluation.timing import TimedStage, time_command
from ksearch_ray.evaluation.tritoncache import PackError, compiled_since, kernel_stamps
from ksearch_ray.evaluation.tritoncache import pack as pack_kernels
from ksearch_ray.evaluation.tritoncache import unpack as unpack_kernels
from ksearch_ray.evaluation.worker_session import Failure, RunSpec, Session, WaitLimit
from ksearch_ray.models import EvalResult, Objective, Solution, Status, WorkloadResult
from ksearch_ray.taskspec.spec import TaskError, Workload
from ksearch_ray.taskspec.task import Task
from ksearch_ray.text import Redactor, clip

log = logging.getLogger(__name__)

TRITON_CACHES_KEPT = 256
"""Solutions whose Triton cache an evaluator keeps (the ones it used last)."""

Mode = Literal["fresh", "reuse"]
# A stage after the correctness checks: (session) -> seconds of candidate work. Evaluator.retime passes one.
Stage = Callable[[Session], float]

__all__ = ["Evaluator", "Mode", "Stage", "geomean", "trusted_prepare"]

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


def device_name(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name()
    return "cpu (Triton interpreter, host timings)"


HELPER_CODE = """
from triton.backends.nvidia.driver import CudaUtils
try:
    CudaUtils()  # compiles driver.c into TRITON_CACHE_DIR, as a worker's first launch would, then loads it
except ImportError:  # written, not loadable here (no driver on this host): the workers load it on theirs
    pass
"""
"""Triton's CUDA driver helper compiled into the cache, in the evaluator's own process (trusted code only)."""


class Evaluator:
    """Owns one sandbox on one device; evaluates candidates one at a time.

    The sandbox lives in `work_root`, by default a private folder of its own under
    $XDG_RUNTIME_DIR or /tmp/ksearch-<uid> (never inside a run directory), removed on close.
    With `start=True` the sandbox starts now, so isolation warnings (or, with
    Isolation.REQUIRE, a SandboxError) come at once rather than with the first candidate.

    Time limits scale with the task (settings.py): the evaluator learns the baseline's waits per
    stage when it evaluates the task's baseline solution, or from `learn_stage_times`.

    With `overlap`, two evaluations may run at once (from two threads): one's turn on the device
    (DeviceTurn) starts once its worker is ready, before any of its code has run, and ends once its timed
    calls are done; the worker's start-up (fork, CUDA context) and the last outputs' judging happen outside
    the turn, beside the other's. Re-timing holds the device throughout; a profile's candidate runs in a turn
    of its own (evaluation/profiling.py)."""

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
        device_handover: bool = True,
        profiler: ProfilerSettings | None = None,
        secret_names: frozenset[str] = frozenset(),
        triton_helper_ahead: bool = False,
        screen_timing: TimingPolicy | None = None,
        overlap: bool = False,
    ):
        """`secret_names`: environment variables holding secrets whatever their names (the run's API key
        variable): they never reach a candidate, and their values, with every other secret value of this
        process's environment (text.secret_values), are redacted from everything a candidate produced.
        `triton_helper_ahead`: Triton's CUDA driver helper compiled once here, a copy in each Triton
        candidate's cache (`triton_helper`). `screen_timing`: the coarser rule of `evaluate(screen=True)` (a
        search's new candidates); none: `timing` for every evaluation. `overlap`: see the class."""
        if device == "cuda" and not torch.cuda.is_available():
            gpu_driver.check()  # a driver that this torch cannot use: GpuDriverError naming both versions
            raise RuntimeError("device cuda requested but no CUDA GPU is visible")
        self.device = device
        self._owns_work_root = work_root is None
        # Absolute once, here: the worker changes into its job directory from the zygote's cwd.
        self.work_root = (Path(work_root) if work_root else default_work_root()).resolve()
        self.limits = limits or Limits()
        self.timing = timing or TimingPolicy.for_device(device)
        self.screen_timing = screen_timing
        self.secret = new_secret() if secret is None else secret
        # Peaks of the GPU for the physical floor; none on the CPU path unless a caller supplies them.
        self.peaks = peaks if peaks is not None else (peaks_for(device_name(device)) if device == "cuda" else None)
        self.device_handover = device_handover
        self.profiler = profiler
        """How `profile` runs ncu; None: this evaluator profiles nothing."""
        self._profiler_found: ProfilerFound | None = None
        self.sandbox = Sandbox(device, self.work_root, isolation=Isolation(isolation),
                               resources=Resources(**self.limits.resources()), refused=frozenset(secret_names))
        self.redact = Redactor.from_environment(secret_names)
        self.judge = Judge(device, self.limits.reference_cache_mb * 2**20, sandboxed=self._sandboxed_reference,
                           timed_cache_bytes=self.limits.timed_reference_cache_mb * 2**20)
        self._stage_waits: dict[tuple[str, str], dict[str, float]] = {}
        self._lang_waits: dict[tuple[str, str], dict[str, float]] = {}  # (task, language) -> longest passing waits
        self.overlap = overlap
        self._device = threading.RLock()  # the device's turns (DeviceTurn); re-timing and profiling hold it throughout
        self._state = threading.Lock()  # what concurrent evaluations share: the kept caches, the busy intervals
        self._running: dict[int, float] = {}  # evaluations in progress: id -> start (monotonic)
        self._ended: deque[tuple[float, float]] = deque(maxlen=64)  # (start, end) of the last evaluations
        self.triton_helper_ahead = triton_helper_ahead and device == "cuda"
        self._triton_helper: bytes | None = None
        self._helper_lock = threading.Lock()
        self.triton_caches_kept = TRITON_CACHES_KEPT
        self._recent_caches: dict[str, None] = {}  # solution ids whose Triton cache is kept, least recently used first
        if start:
            self.sandbox.ensure_started()
            self.triton_helper()  # with the sandbox's start, not inside a candidate's evaluation

    def close(self) -> None:
        self.judge.close()
        self.sandbox.close()
        if self._owns_work_root:
            shutil.rmtree(self.work_root, ignore_errors=True)
            leftovers.release(self.work_root)

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
        stage: Stage | None = None,
        own_waits: dict[str, float] | None = None,
        screen: bool = False,
    ) -> EvalResult:
        """The verdict on `solution`. `progress` hears one short line per stage and workload.
        `prebuilt`: the library of this solution built ahead of time (a CUDA/C++ candidate); loaded, not built.
        `stage` replaces the timing stage (Evaluator.retime uses it); its seeds are drawn apart
        from the timing ones. `own_waits`: this solution's longest waits per stage, measured before (its
        primary evaluation, when re-timing it): its wait limits then follow its own clock, not the baseline's.
        `screen`: timed by `screen_timing` where this evaluator has one (a search's new candidate: a coarser
        figure, enough to rank it; a best is re-timed by `timing` before it counts); the result states the rule.

        Raises SandboxError when the sandbox itself cannot start a worker: that is no verdict on
        the candidate (none of its code has run), and a search must stop rather than count it.
        """
        say = progress or (lambda _message: None)
        policy = self.screen_timing if screen and self.screen_timing is not None else self.timing
        timed = (workload_set != "tests") if timed is None else timed
        if prebuilt is not None and (prebuilt[0].solution_id != solution.id or sha256_bytes(prebuilt[1]) != prebuilt[0].sha256):
            raise ValueError(f"the prebuilt library given for {solution.id} is not this solution's build")
        triton_build = None
        if prebuilt is not None and prebuilt[0].kind == "triton":  # kernels for the Triton cache, not a library
            triton_build, prebuilt = prebuilt, None
        workloads = task.workloads(workload_set, self.device)
        tag = "time" if stage is None else "retime"
        run = RunSpec(
            task, solution, self.device, frozenset(options), mode, workloads,
            [derive_seed(self.secret, w.name, w.params.get("seed"), "check") for w in workloads],
            [derive_seed(self.secret, w.name, w.params.get("seed"), tag) for w in workloads],
            prebuilt=prebuilt[0] if prebuilt else None,
            prepare=trusted_prepare(task, solution),
            objective=self.objective_for(task),
            flush_l2=policy.flush_l2 and task.definition.objective.flush_l2,
            recheck=mode == "fresh" and (task.definition.objective.recheck if policy.recheck is None
                                         else policy.recheck),
            check_order=cheapest_first(task, workloads),
        )
        set_name = task.workload_set_name(workload_set, self.device)
        language = self._language_waits(task, solution)
        result = EvalResult(
            solution_id=solution.id, solution_name=solution.name, task=task.name, status=Status.PASSED,
            workload_set=set_name, mode=mode, device=self.device,
            device_name=device_name(self.device), compat=sorted(options), timed=timed, objective=run.objective,
            prepared_untimed=run.prepare is not None,
        )
        t0 = time.monotonic()
        token = self._started(t0)
        turn = DeviceTurn(self._device if self.overlap else None)
        try:
            kernels_before = self._triton_cache(solution, triton_build, result)
            self.judge.prepare(task)  # an untrusted task's reference worker starts beside the candidate's
            workdir = self._workdir(solution, prebuilt[1] if prebuilt else None,
                                    gpumode=task.definition.interface == "gpumode")
            worker = self.sandbox.start(self._job(run, workdir).model_dump(mode="json"),
                                        declared_environment(task.definition.environment, self.sandbox.refused))
        except BaseException:
            self._ended_at(token, t0)
            raise
        # The limits learn from the baseline's clock, and may from this candidate's own correctness waits in
        # this evaluation (session.waits), its earlier measurement (own_waits) and its language's clock.
        session = Session(self.sandbox, worker, run, self.judge, workdir,
                          lambda s: self._limit(run, set_name, s, session.waits, own_waits, language),
                          t0 + self.limits.total, self.limits.total, say=say, started=t0)
        # The last outputs are judged beside the next candidate's turn.
        timed_stage = TimedStage(policy, self.peaks, timed_done=turn.give_back)
        busy = 0.0
        try:
            busy = self._drive(session, timed, stage if stage is not None else timed_stage, turn)
            if not self.sandbox.healthy():
                # Nothing but the candidate runs beside the zygote: its death is the candidate's doing.
                raise Failure(Status.INTEGRITY_VIOLATION, "the sandbox's zygote process died while this candidate ran")
        except Failure as failure:
            result.status, result.message, result.log = failure.status, failure.message, failure.log
            self._mark_failed(run, failure)
        except BaseException:
            self._ended_at(token, t0)
            raise
        finally:
            turn.give_back()
            session.begin("teardown")
            session.close()
            shutil.rmtree(workdir, ignore_errors=True)
            result.stages = session.finish()
        result.workloads = run.results
        if kernels_before is not None:
            result.triton_compiled = compiled_since(kernels_before, self._triton_cache_dir(solution))
        result.seconds = time.monotonic() - t0
        result.device_seconds = round(self._ended_at(token, t0), 4)
        result.overhead_seconds = max(0.0, result.seconds - busy)
        result.build_seconds = run.build_seconds
        result.stage_waits = {k: round(v, 4) for k, v in session.waits.items()}
        result.transport = describe(session.importer.transports)
        if stage is None and timed:
            result.timed_seconds = timed_stage.timed_seconds
            result.timing_rule = policy.rule(self.device, mode, objective=run.objective, flush_l2=run.flush_l2,
                                                  recheck=run.recheck)
        if result.status is Status.PASSED and timed:
            result.score = geomean([r.timing.mean_ms for r in run.results if r.timing])
            result.score_kind = "geomean of mean latency (ms)"
        if result.status is Status.PASSED and stage is None and self._is_baseline(task, solution):
            self.learn_stage_times(task, result)
        elif result.status is Status.PASSED and stage is None and language is not None:
            # This language's clock, for the next candidates in it (a Triton kernel in the CPU interpreter is
            # far slower than a PyTorch baseline: the baseline's clock alone timed out the TriMul seed).
            learned = self._lang_waits.setdefault((task.name, solution.language), {})
            for name, wait in result.stage_waits.items():
                learned[name] = max(learned.get(name, 0.0), wait)
        return self._redacted(result)

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
        # The re-timing's waits are limited by the candidate's own measured waits (with the floor), not only
        # the baseline's: a PyTorch baseline's 0.16 s says nothing of a candidate in Triton's interpreter.
        evaluate = functools.partial(self.evaluate, own_waits=dict(primary.stage_waits) or None)
        with self._device:  # its calls are timed from its worker's start to its end
            start = time.monotonic()
            check = retime(evaluate, self.device, task, solution, primary, frozenset(options))
            return check.model_copy(update={"seconds": time.monotonic() - start})

    def objective_for(self, task: Task) -> Objective:
        """The figure `timing` and the score are: the timing policy's `objective`, else the task's."""
        return self.timing.objective or task.definition.objective.timed

    def profiler_status(self) -> ProfilerFound:
        """Whether this evaluator can profile, looked up once (`ncu --version` answers in a second or so)."""
        if self._profiler_found is None:
            if self.profiler is None:
                found = ProfilerFound(problem="profiling was not asked for")
            elif self.device != "cuda":
                found = ProfilerFound(problem="the CPU path has no GPU profiler")
            elif (path := find_ncu(self.profiler.ncu)) is None:
                where = self.profiler.ncu or "PATH, CUDA_HOME/bin, /usr/local/cuda/bin, /opt/nvidia/nsight-compute"
                found = ProfilerFound(problem=f"Nsight Compute (ncu) was not found ({where})")
            elif (version := ncu_version(path)) is None:
                found = ProfilerFound(problem=f"{path} does not answer `ncu --version`")
            else:
                found = ProfilerFound(tool=f"ncu {version}", path=str(path))
            self._profiler_found = found
        return self._profiler_found

    def profile(self, task: Task, solution: Solution, measured: EvalResult, *, timeout_s: float | None = None,
                options: frozenset[str] | set[str] = frozenset(), copy_logs_to: Path | None = None) -> ProfileResult:
        """Profile one call of `solution` with Nsight Compute on the slowest workload of `measured` (its
        evaluation), in a fresh worker of this evaluator's sandbox, outside any timed measurement, within
        `timeout_s` (default: the profiler settings'); see evaluation/profiling.py. Never raises for the
        candidate's doings: a failure is a result."""
        slowest = slowest_workload(measured)
        found = self.profiler_status()
        if slowest is None or found.path is None or self.profiler is None:
            return ProfileResult(status="failed", solution_id=solution.id, workload=slowest[0] if slowest else "",
                                 message=found.problem or "the evaluation timed no workload")
        name, mean_ms = slowest
        workload = next((w for w in task.workloads(measured.workload_set, self.device) if w.name == name), None)
        if workload is None:
            return ProfileResult(status="failed", solution_id=solution.id, workload=name,
                                 message=f"the workload set {measured.workload_set} has no workload {name}")
        workdir = self._workdir(solution, gpumode=task.definition.interface == "gpumode")
        cache = self._triton_cache_dir(solution)
        job = ProfileJob(
            workdir=str(workdir), triton_cache_dir=str(cache), task_root=str(task.root), device="cuda" if self.device == "cuda" else "cpu",
            options=sorted(options), solution_id=solution.id, language=solution.language, entry_file=solution.entry_file,
            entry_point=solution.entry_point, prepare=trusted_prepare(task, solution),
            item=WorkItem(index=0, workload=workload, seed=derive_seed(self.secret, name, workload.params.get("seed"), "profile")),
            warmup_calls=self.profiler.warmup_calls, ncu=found.path, ncu_args=ncu_arguments(self.profiler.launch_count),
            wait_for_turn=self.overlap,
        )
        # The profiler's replays would disturb another candidate's timed calls: with overlap the profiled process
        # waits for its turn once it is up (ncu's and Python's start-up overlap another evaluation); without it,
        # the device is held throughout.
        turn = DeviceTurn(self._device) if self.overlap else None
        try:
            with contextlib.nullcontext() if self.overlap else self._device:
                return run_profile(self.sandbox, job, timeout_s or self.profiler.timeout_s, workload=name, measured_ms=mean_ms,
                                   tool=found.tool or "ncu", keep=self.profiler.kernels,
                                   launch_count=self.profiler.launch_count,
                                   identifiers=source_identifiers(solution.sources), copy_logs_to=copy_logs_to, turn=turn)
        except (SandboxError, OSError, ConnectionError) as exc:  # the sandbox's own failure, not the candidate's
            return ProfileResult(status="failed", solution_id=solution.id, workload=name, measured_ms=mean_ms,
                                 message=f"the sandbox could not start the profile job: {clip(str(exc), 200)}")
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    def learn_stage_times(self, task: Task, baseline: EvalResult) -> None:
        """Scale this evaluator's wait limits for `task` from `baseline` (a PASSED evaluation of the task's
        baseline, possibly from an earlier session): see settings.py for the rule."""
        if baseline.status is Status.PASSED and baseline.stage_waits:
            self._stage_waits[(task.name, baseline.workload_set)] = dict(baseline.stage_waits)

    def wait_limit(self, task: Task, workload_set: str, stage: str, *, compiles: bool = False,
                   session_waits: dict[str, float] | None = None, own_waits: dict[str, float] | None = None,
                   language_waits: dict[str, float] | None = None) -> WaitLimit:
        """Seconds a wait for the worker may last in `stage` of an evaluation of `task` on `workload_set`.
        The baseline's clock scales it (else the task's declared waits, else, for warm-up and timing, this
        candidate's own correctness waits in this evaluation: `session_waits`); a solution's own clock may
        lengthen it: `own_waits`, its own longest waits measured before (its first measurement, when
        re-timing it), and `language_waits`, those of this task's passing evaluations in its language when
        that is not the baseline's ({}: none passed yet, so nothing to scale from: the ceiling)."""
        lim = self.limits
        base = self._baseline_limit(task, workload_set, stage, compiles, session_waits)
        if stage in ("start", "build"):
            return base
        for clock, whose in ((own_waits, "this candidate's own"), (language_waits, "its language's")):
            if clock is None:
                continue
            # A re-timing's "timing" stage does what a first measurement's warm-up and timing stages did.
            known = [clock[s] for s in ((stage, "warmup") if stage == "timing" else (stage,)) if s in clock]
            if not known:
                if whose == "its language's":
                    return WaitLimit(lim.idle, " (the first measurement of its language here: nothing to scale from)")
                continue
            scaled = min(max(lim.hang_floor, lim.hang_factor * max(known)), lim.idle)
            if scaled > base.seconds:
                base = WaitLimit(scaled, f" (the limit: {lim.hang_factor:g} x {whose} {max(known):.2g} s, "
                                         f"at least {lim.hang_floor:g} s)")
        return base

    def _baseline_limit(self, task: Task, workload_set: str, stage: str, compiles: bool,
                        own: dict[str, float] | None) -> WaitLimit:
        lim = self.limits
        ceiling = (lim.build_cuda if compiles else lim.build_python) if stage == "build" else lim.idle
        if stage == "start":
            return WaitLimit(lim.setup)
        if stage == "build" and compiles:
            return WaitLimit(ceiling)  # the baseline is not compiled: nothing to scale from
        known = self._stage_waits.get((task.name, workload_set))
        if known is None:  # another set of the same task: its longest waits, conservatively
            sets = [w for (name, _), w in self._stage_waits.items() if name == task.name]
            known = {s: max(w.get(s, 0.0) for w in sets) for s in {k for w in sets for k in w}} if sets else None
        whose = "the baseline's"
        if (not known or stage not in known) and self.device == "cuda" and stage in task.definition.expected_waits:
            known, whose = task.definition.expected_waits, "the task's declared"
        if (not known or stage not in known) and own and "correctness" in own and stage in ("warmup", "timing"):
            # Nothing known of the baseline: a warm-up is a few of the calls the correctness checks made,
            # a timed call one of them (and its capture as a graph, another).
            calls = max(self.timing.warmup_calls, 1) if stage == "warmup" else 2
            known, whose = {stage: calls * own["correctness"]}, f"the expected ({calls} x this candidate's longest correctness wait)"
        if not known or stage not in known:
            return WaitLimit(ceiling)
        expected = known[stage]
        scaled = max(lim.hang_floor, min(lim.hang_factor * expected, expected + lim.hang_margin))
        if scaled >= ceiling:
            return WaitLimit(ceiling)
        return WaitLimit(scaled, f" (the limit: {lim.hang_factor:g} x {whose} {expected:.2g} s, at most "
                                 f"{lim.hang_margin:g} s more, at least {lim.hang_floor:g} s)")

    def _language_waits(self, task: Task, solution: Solution) -> dict[str, float] | None:
        """The longest waits per stage of this task's passing evaluations in `solution`'s language, when that is
        not the baseline's (None: it is, and the baseline's clock is its clock); {} when none passed yet."""
        try:
            baseline_language = task.baseline().language
        except TaskError:
            return None
        if solution.language == baseline_language:
            return None
        return self._lang_waits.get((task.name, solution.language), {})

    # --- internals ----------------------------------------------------------------------------

    def _sandboxed_reference(self, task: Task) -> SandboxedReference:
        """Where the references of a task from outside the package are computed: a worker of this sandbox."""
        return SandboxedReference(self.sandbox, task, self.work_root, setup_s=self.limits.setup,
                                  idle_s=self.limits.idle, device_handover=self.device_handover)

    def _redacted(self, result: EvalResult) -> EvalResult:
        """The boundary where a candidate's words (its messages, its logs) enter the trusted side: no
        secret value of this process goes past it, into events, reports, trackers or prompts."""
        result.message, result.log = self.redact(result.message), self.redact(result.log)
        for workload in result.workloads:
            workload.message = self.redact(workload.message)
        return result

    def _is_baseline(self, task: Task, solution: Solution) -> bool:
        try:
            return task.baseline().id == solution.id
        except TaskError:
            return False

    def _limit(self, run: RunSpec, workload_set: str, stage: str, session_waits: dict[str, float] | None = None,
               own_waits: dict[str, float] | None = None, language_waits: dict[str, float] | None = None) -> WaitLimit:
        compiles = run.solution.language == "cuda" and run.prebuilt is None
        return self.wait_limit(run.task, workload_set, stage, compiles=compiles, session_waits=session_waits,
                               own_waits=own_waits, language_waits=language_waits)

    def _triton_cache_dir(self, solution: Solution) -> Path:
        """The Triton cache of `solution`'s workers on this evaluator: its own, kept between its evaluations, for
        the `triton_caches_kept` solutions used last (a long search would otherwise keep one per candidate: half a
        megabyte or more each); an older one's next worker compiles again."""
        cache = self.work_root / "cache" / solution.id / "triton"
        with self._state:
            cache.mkdir(parents=True, exist_ok=True)
            self._recent_caches.pop(solution.id, None)
            self._recent_caches[solution.id] = None
            while len(self._recent_caches) > self.triton_caches_kept:
                old = next(iter(self._recent_caches))
                del self._recent_caches[old]
                shutil.rmtree(self.work_root / "cache" / old, ignore_errors=True)
        return cache

    def _triton_cache(self, solution: Solution, build: tuple[BuildRecord, bytes] | None,
                      result: EvalResult) -> dict[str, tuple[int, ...]] | None:
        """Put a Triton build's kernels into `solution`'s Triton cache, noting on `result` what it holds; the
        kernels there before the worker starts (None on the CPU path, where Triton compiles nothing)."""
        if build is not None:
            record, pack = build
            result.triton_not_built = dict(record.not_built)
            try:
                result.triton_prebuilt = unpack_kernels(pack, self._triton_cache_dir(solution))
            except PackError as exc:  # the worker's JIT compiles them all, as without a build
                result.triton_prebuilt = 0
                result.triton_not_built = {"(all)": f"the build's kernels were refused: {exc}"}
        if self.device != "cuda" or solution.language == "cuda":
            return None
        helper = self.triton_helper() if solution.names_triton else None
        if helper:
            try:
                unpack_kernels(helper, self._triton_cache_dir(solution))
            except PackError as exc:  # the worker compiles the helper itself, as without one
                log.warning("Triton's driver helper was not given to %s: %s", solution.name, exc)
        return kernel_stamps(self._triton_cache_dir(solution))

    def triton_helper(self) -> bytes | None:
        """With `triton_helper_ahead`: Triton's compiled CUDA driver helper (the C module every launch goes
        through; a worker with an empty cache compiles it, half a second of a C compiler), packed. Compiled
        once, by a process of this evaluator's own (trusted code only) in the candidates' environment, so that
        its cache key is the one a worker computes; None when off or when that fails (one WARNING line)."""
        if not self.triton_helper_ahead:
            return None
        with self._helper_lock:  # two overlapping evaluations: the second waits for the first's compile
            if self._triton_helper is None:
                self._triton_helper = b""
                folder = self.work_root / "triton-helper"
                env = {**scrubbed_environment("cuda", self.sandbox.visible_gpu, refused=self.sandbox.refused),
                       "TRITON_CACHE_DIR": str(folder), "HOME": str(self.work_root)}
                try:
                    subprocess.run([sys.executable, "-c", HELPER_CODE], env=env, cwd=self.work_root, timeout=300, check=True,
                                   capture_output=True)
                    if not any(folder.glob("*/cuda_utils.*")):
                        raise PackError("Triton wrote no cuda_utils module")
                    self._triton_helper, _ = pack_kernels(folder, kernels_only=False)
                except (OSError, subprocess.SubprocessError, PackError) as exc:
                    tail = getattr(exc, "stderr", b"") or b""
                    log.warning("Triton's driver helper could not be compiled ahead (%s%s); each worker compiles it",
                                type(exc).__name__, f": {clip(tail.decode(errors='replace').strip()[-300:], 300)}" if tail else "")
            return self._triton_helper or None

    def _workdir(self, solution: Solution, library: bytes | None = None, *, gpumode: bool = False) -> Path:
        workdir = job_dir(self.work_root, solution.id, solution.sources, gpumode=gpumode)
        if library is not None:  # the candidate's own copy: nothing it does reaches the build cache
            (workdir / "prebuilt").mkdir()
            (workdir / "prebuilt" / "library.so").write_bytes(library)
        return workdir

    def _job(self, run: RunSpec, workdir: Path) -> Job:
        sol = run.solution
        cache = self._triton_cache_dir(sol)
        return Job(
            workdir=str(workdir), triton_cache_dir=str(cache), task_root=str(run.task.root),
            device="cuda" if run.device == "cuda" else "cpu", options=sorted(run.options), solution_id=sol.id,
            language=sol.language, entry_file=sol.entry_file, entry_point=sol.entry_point, prepare=run.prepare,
            prebuilt=Prebuilt(path=str(workdir / "prebuilt" / "library.so"), module=run.prebuilt.module_name)
            if run.prebuilt else None,
            check=[WorkItem(index=i, workload=run.workloads[i], seed=run.check_seeds[i]) for i in run.checks()],
            device_handover=self.device_handover,
            handover_bytes=output_bytes(run.task, run.workloads),
            wait_for_turn=self.overlap,
        )

    def _drive(self, session: Session, timed: bool, stage: Stage, turn: DeviceTurn) -> float:
        """Talk to the worker through all stages; returns seconds of candidate work (build+calls)."""
        run = session.run
        session.say("starting the sandbox worker")
        try:
            session.recv("start", "sandbox start-up", Ready)
        except Failure as failure:
            # Nothing of the candidate has run before the worker reports ready.
            detail = failure.log.strip().splitlines()[-1] if failure.log.strip() else ""
            raise SandboxError(
                f"the sandbox could not start a worker ({failure.status.value}: {failure.message})"
                + (f"; last output: {clip(detail, 300)}" if detail and detail not in failure.message else "")
            ) from None
        if turn.lock is not None:  # the worker waits for its turn on the device before any of the candidate runs
            session.begin("queued")
            queued = time.monotonic()
            if not turn.take(blocking=False):
                session.say("waiting for the device (another candidate's turn)")
                turn.take()
            session.deadline += time.monotonic() - queued  # the evaluation's time limit counts from its turn
            try:
                session.send(Go())
            except Failure as failure:  # nothing of the candidate has run: the sandbox's failure, not its verdict
                raise SandboxError(f"the sandbox's worker ended while it waited for its turn on the device "
                                   f"({failure.message})") from None
        session.begin("build")
        compiles = run.solution.language == "cuda" and run.prebuilt is None
        session.say("building" if compiles else "loading the prebuilt library" if run.prebuilt else "importing the candidate")
        built = session.recv("build", "build", Built)
        busy = run.build_seconds = built.seconds
        session.begin("correctness")
        t_check = time.monotonic()
        verdicts: list[tuple[int, Future[Comparison]]] = []
        try:
            for i in run.checks():  # cheapest first: a wrong candidate fails at the least cost
                workload = run.workloads[i]
                msg = session.recv("correctness", f"correctness check of {workload.name}", Output)
                if msg.index != i:
                    raise Failure(Status.INTEGRITY_VIOLATION, "correctness results arrived out of order")
                session.say(f"ran {workload.name}")
                verdicts.append((i, session.judge_later(i, run.check_seeds[i], session.take(msg.handover, workload.name))))
                self._settle(session, verdicts, block=False)
            session.recv("correctness", "correctness checks", Checked)
        except Failure:
            self._settle(session, verdicts, block=True)  # an earlier check's failure decides first
            raise
        busy += time.monotonic() - t_check
        if not timed:
            session.send(StopCmd())
            session.begin("judging")
            self._settle(session, verdicts, block=True)
            return busy
        if isinstance(stage, TimedStage):
            session.send(time_command(run, stage.policy))  # the worker warms up while the last verdicts come in
        session.begin("judging")
        self._settle(session, verdicts, block=True)
        session.begin("warmup" if isinstance(stage, TimedStage) else "timing")
        return busy + stage(session)

    def _settle(self, session: Session, verdicts: list[tuple[int, Future[Comparison]]], *, block: bool) -> None:
        """Record the verdicts that are in (all of them, when `block`), in the order they were checked; the
        first failure decides. Once all are in, the results are in the workload set's order."""
        run = session.run
        while len(run.results) < len(verdicts):
            i, future = verdicts[len(run.results)]
            if not block and not future.done():
                return
            verdict = session.verdict(i, future.result())
            run.results.append(WorkloadResult(
                workload=run.workloads[i].name, status=Status.PASSED, max_abs_error=verdict.max_abs_error,
                max_rel_error=verdict.max_rel_error, fraction_ok=verdict.fraction_ok,
            ))
            session.say(f"correct on {run.workloads[i].name} ({len(run.results)}/{len(run.workloads)})")
        if len(run.results) == len(run.workloads):
            where = {w.name: i for i, w in enumerate(run.workloads)}
            run.results.sort(key=lambda r: where[r.workload])  # the timing stage addresses them by index

    def _started(self, start: float) -> int:
        """An evaluation begins at `start`: its number among those in progress."""
        with self._state:
            token = max(self._running, default=0) + 1
            self._running[token] = start
        return token

    def _ended_at(self, token: int, start: float) -> float:
        """The evaluation `token` (begun at `start`) ends now: the seconds of it that no evaluation begun
        before it covered (its device seconds). Over an evaluator's evaluations they add up to the time it
        had one in progress, so overlapping evaluations count once; without overlap they are its seconds."""
        end = time.monotonic()
        with self._state:
            self._running.pop(token, None)
            if any(s < start for s in self._running.values()):
                return 0.0  # one begun before it is still in progress: it covers this one whole
            covered = max((e for s, e in self._ended if s < start), default=start)
            self._ended.append((start, end))
        return max(0.0, end - max(start, covered))

    def _mark_failed(self, run: RunSpec, failure: Failure) -> None:
        name = failure.workload or "(build)"
        for r in run.results:
            if r.workload == name:
                r.status, r.message = failure.status, failure.message
                return
        run.results.append(WorkloadResult(workload=name, status=failure.status, message=failure.message))


def cheapest_first(task: Task, workloads: list[Workload]) -> list[int]:
    """The order the correctness stage checks `workloads` in: by the least time their declared work could
    take (task.json's `cost`, at an H100's dense FP8 compute and HBM bandwidth: only the order matters), so a
    wrong candidate fails on the cheapest; equal costs, and a task that declares none, keep the set's order."""
    costs = []
    for workload in workloads:
        try:
            cost = task.workload_cost(workload)
        except TaskError:
            cost = None
        if cost is None:
            return list(range(len(workloads)))
        flops, nbytes = cost
        costs.append(max(flops / 2e15, nbytes / 3.35e12))
    return sorted(range(len(workloads)), key=lambda i: costs[i])


def output_bytes(task: Task, workloads: list[Workload]) -> int | None:
    """The largest total output size of any of `workloads`, from the task's output shapes; None if unknown."""
    from ksearch_ray.evaluation.sandbox.handover import DTYPES

    consts = {k: v["value"] for k, v in task.definition.axes.items() if isinstance(v, dict) and "value" in v}
    largest = 0
    for workload in workloads:
        sizes = {**consts, **workload.axes}
        total = 0
        for spec in task.definition.outputs.values():
            dims = [d if isinstance(d, int) else sizes.get(d) for d in (spec.shape or [])]
            if spec.dtype not in DTYPES or any(not isinstance(d, int) for d in dims):
                return None
            total += math.prod(d for d in dims if isinstance(d, int)) * torch.empty((), dtype=DTYPES[spec.dtype]).element_size()
        largest = max(largest, total)
    return largest


def geomean(values: list[float]) -> float | None:
    if not values or any(v <= 0 for v in values):
        return None
    return math.exp(sum(math.log(v) for v in values) / len(values))
