"""The harness inside a sandboxed worker: builds the candidate, calls it, checks and hands over outputs.

It runs in the candidate's own process (forked from the zygote for this candidate alone). It
never sees an expected output: the evaluator computes references in its own process. What it
hands over is what the evaluator judges (sandbox/handover.py): checked outputs, copied into a
buffer the evaluator maps or reads, passed as a descriptor with the frame that names them.
Exceptions of the candidate become statuses here (CandidateFailure), and nowhere else in this process.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel

from ksearch_ray.evaluation.sandbox import integrity
from ksearch_ray.evaluation.sandbox.build import BuildError, load_entry
from ksearch_ray.evaluation.sandbox.channel import Channel
from ksearch_ray.evaluation.sandbox.handover import Exporter, HandoverError
from ksearch_ray.evaluation.sandbox.protocol import (
    Built,
    Checked,
    CommandMessage,
    Handover,
    Job,
    Output,
    Progress,
    Taken,
    Tick,
    parse_command,
)
from ksearch_ray.models import Status
from ksearch_ray.taskspec.spec import Workload
from ksearch_ray.text import clip

_perf = integrity.perf_counter
_sync = torch.cuda.synchronize
# A quiet worker still reports timed calls this often; far below any wait limit (evaluation/settings.py,
# hang_floor: 20 s), and well within the stopwatch pipe's 64 KiB (1,638 records the evaluator drains per message).
TICK_EVERY_S = 0.25
TICK_EVERY_CALLS = 512


class CandidateFailure(Exception):
    def __init__(self, status: Status, message: str, log: str = ""):
        super().__init__(message)
        self.status = status
        self.message = message
        self.log = log


def _candidate_traceback(exc: BaseException, candidate_dir: Path) -> str:
    """Traceback frames from the candidate's own files only, plus the error line."""
    frames = [
        f"  {Path(fs.filename).name}:{fs.lineno} in {fs.name}: {(fs.line or '').strip()}"
        for fs in traceback.extract_tb(exc.__traceback__)
        if str(candidate_dir) in fs.filename
    ]
    lines = frames[-8:] + [f"{type(exc).__name__}: {str(exc).strip()[:1500]}"]
    return "\n".join(lines)


def call_failure(exc: BaseException, src: Path) -> CandidateFailure:
    """What an exception out of the candidate's call means: a Triton compile error is COMPILE_ERROR,
    anything else RUNTIME_ERROR (sys.exit: CRASHED), with its first line and the candidate's frames."""
    if isinstance(exc, CandidateFailure):
        return exc
    if isinstance(exc, SystemExit):
        return CandidateFailure(Status.CRASHED, f"the candidate called sys.exit({exc.code!r}) instead of returning")
    compile_error = type(exc).__name__ in {"CompilationError", "CompileTimeAssertionFailure"}
    status = Status.COMPILE_ERROR if compile_error else Status.RUNTIME_ERROR
    if "out of memory" in str(exc).lower():
        status = Status.RUNTIME_ERROR
    first = clip(str(exc).strip().splitlines()[0], 300) if str(exc).strip() else ""
    return CandidateFailure(status, f"{type(exc).__name__}: {first}", _candidate_traceback(exc, src))


def import_candidate(src: Path, language: str, entry_file: str, entry_point: str, solution_id: str,
                     prebuilt: dict[str, Any] | None = None) -> Callable[..., Any]:
    """The candidate's entry point, imported under the module name every worker of it uses
    (`ks_<solution id>`: a Triton kernel's cache key must not depend on which worker compiled it);
    CandidateFailure when it does not build or import."""
    try:
        return load_entry(src, language, entry_file, entry_point, f"ks_{solution_id}", prebuilt=prebuilt)
    except BuildError as exc:
        raise CandidateFailure(Status.COMPILE_ERROR, "build failed", str(exc)) from None
    except SyntaxError as exc:
        raise CandidateFailure(Status.COMPILE_ERROR,
                               f"SyntaxError: {exc.msg} ({Path(exc.filename or '').name}:{exc.lineno})",
                               (exc.text or "").rstrip()) from None
    except SystemExit as exc:
        raise CandidateFailure(Status.CRASHED, f"the candidate called sys.exit({exc.code!r}) at import") from None
    except Exception as exc:  # import-time failure of candidate code
        raise CandidateFailure(Status.COMPILE_ERROR, f"import failed: {type(exc).__name__}: {exc}",
                               _candidate_traceback(exc, src)) from None


class Worker:
    def __init__(self, chan: Channel, job: Job):
        self.chan = chan
        self.job = job
        self.workdir = Path(job.workdir)
        self.src = self.workdir / "src"
        self.device = job.device
        self.options = frozenset(job.options)
        self.cuda = self.device == "cuda"
        from ksearch_ray.taskspec.task import Task

        self.task = Task.load(job.task_root)
        self.task.module  # noqa: B018  (load the trusted reference module before any candidate code)
        self.guard: integrity.Guard | None = None
        self.entry: Any = None
        self.prepare: Any = None  # a trusted baseline's untimed setup function (see set_up)
        self.current: str | None = None  # workload being run, for failure messages
        self.exporter: Exporter | None = None  # made once CUDA is up (serve)
        self._quiet_since, self._quiet_calls = _perf(), 0  # since the last message sent (tick)

    # --- messages -----------------------------------------------------------------------------

    def send(self, message: BaseModel) -> None:
        self.chan.send(message)

    def tick(self, n: int) -> None:
        """A timed call is done: say so (progress; the evaluator drains the stopwatch's pipe on it) only when
        TICK_EVERY_S passed or TICK_EVERY_CALLS calls were made since the last tick or hand-over. A message
        per call woke the evaluator's Python right before the next timed call, which GPUMode's loop does not."""
        self._quiet_calls += 1
        if self._quiet_calls >= TICK_EVERY_CALLS or _perf() - self._quiet_since >= TICK_EVERY_S:
            self.chan.send(Tick(n=n))
            self._quiet_since, self._quiet_calls = _perf(), 0

    def receive(self, spin: bool = False) -> CommandMessage:
        return parse_command(self.chan.recv(spin=spin))

    def progress(self, what: str) -> None:
        """Tell the evaluator that work goes on (a compiled kernel, a warm-up): it resets the wait limit."""
        self.chan.send(Progress(what=what[:200]))

    def report_compiles(self) -> None:
        """Every Triton kernel compiled while a candidate runs is progress (compiles take seconds)."""
        try:
            import triton
        except ImportError:
            return
        runtime = getattr(getattr(triton, "knobs", None), "runtime", None)
        if runtime is not None and hasattr(runtime, "jit_post_compile_hook"):
            runtime.jit_post_compile_hook = lambda **kw: self.progress(f"compiled {str(kw.get('repr', 'a kernel'))[:120]}")

    def deliver(self, make: Callable[[Handover], BaseModel], outputs: dict[str, torch.Tensor], spin: bool = False) -> None:
        """Hand `outputs` over with the message `make` builds; returns once the evaluator holds them
        (waiting for that on the CPU with `spin`: Worker.receive)."""
        assert self.exporter is not None
        try:
            handover, fds = self.exporter.export(outputs)
        except HandoverError as exc:
            raise CandidateFailure(Status.INTEGRITY_VIOLATION, str(exc)) from None
        try:
            self.chan.send(make(handover), fds)
        finally:
            for fd in fds:
                os.close(fd)
        self._quiet_since, self._quiet_calls = _perf(), 0  # the evaluator drains the stopwatch's pipe on it too
        # A device buffer is memory this process can still write: no candidate code runs until the
        # evaluator says it holds its own copy.
        if handover.transport == "cuda_vmm" and not isinstance(self.receive(spin), Taken):
            raise RuntimeError("the evaluator answered a hand-over with something other than `taken`")

    # --- helpers ----------------------------------------------------------------------------

    def task_functions(self) -> dict[str, tuple[Any, str]]:
        """The task's code that the harness runs in this process between timed calls (input generation,
        the calling convention's packing): replaced by a candidate, it could do the candidate's work
        untimed, so the integrity guard watches it as it watches the clocks."""
        from ksearch_ray.taskspec.task import Task

        out: dict[str, tuple[Any, str]] = {
            f"Task.{name}": (Task, name) for name in ("generate_inputs", "arguments", "call", "normalize_outputs")}
        for name in ("generate_inputs", "pack_data"):
            if hasattr(self.task.module, name):
                out[f"the task's {name}"] = (self.task.module, name)
        return out

    def sync(self) -> None:
        if self.cuda:
            _sync()

    def integrity_check(self, when: str) -> None:
        assert self.guard is not None
        problems = self.guard.check_and_restore()
        threads = self.guard.lingering_threads()
        if threads:
            problems.append(f"left threads running: {', '.join(threads)}")
        if problems:
            raise CandidateFailure(Status.INTEGRITY_VIOLATION, f"{when}: " + "; ".join(problems))

    def inputs_for(self, workload: Workload, seed: int) -> dict[str, Any]:
        try:
            with integrity.harness_numerics():
                return self.task.generate_inputs(workload, seed, self.device, self.options)
        except Exception as exc:  # trusted code, but it runs after the candidate was imported
            raise CandidateFailure(
                Status.CRASHED,
                f"input generation failed (a broken task bundle, or a candidate that patched torch): "
                f"{type(exc).__name__}: {clip(str(exc), 300)}",
                traceback.format_exc()[-2000:],
            ) from None

    def set_up(self, inputs: dict[str, Any]) -> None:
        """A trusted baseline's untimed per-input setup (its `prepare`), before that input set's calls."""
        if self.prepare is not None:
            self.call(inputs, self.prepare)
            self.sync()

    def call(self, inputs: dict[str, Any], function: Any = None) -> Any:
        try:
            return (function or self.entry)(*self.task.arguments(inputs))
        except (Exception, SystemExit) as exc:  # the candidate boundary: any exception becomes a status
            raise self.failure(exc) from None

    def failure(self, exc: BaseException) -> CandidateFailure:
        """What an exception out of the candidate's call means (the timed calls catch it themselves)."""
        return call_failure(exc, self.src)

    def check_outputs(self, result: Any, inputs: dict[str, Any],
                      pristine: dict[str, Any] | None = None) -> dict[str, torch.Tensor]:
        """Integrity checks that only the candidate's own process can make."""
        try:
            outputs = self.task.normalize_outputs(result)
        except ValueError as exc:
            raise CandidateFailure(Status.INCORRECT_SHAPE, str(exc)) from None
        checked = {}
        for name, value in outputs.items():
            if not isinstance(value, torch.Tensor):
                raise CandidateFailure(Status.INCORRECT_SHAPE, f"output `{name}` is a {type(value).__name__}, not a tensor")
            if not integrity.is_plain_tensor(value):
                raise CandidateFailure(Status.INTEGRITY_VIOLATION, f"output `{name}` is a tensor subclass ({type(value).__name__})")
            alias = integrity.aliases_any(value, inputs)
            if alias is not None:
                raise CandidateFailure(Status.INTEGRITY_VIOLATION, f"output `{name}` shares memory with input `{alias}`")
            checked[name] = value
        for name, value in inputs.items():
            if pristine is not None and isinstance(value, torch.Tensor) and not integrity.bitwise_equal(value, pristine[name]):
                raise CandidateFailure(Status.INTEGRITY_VIOLATION, f"the candidate modified its input `{name}`")
        return checked

    # --- stages -------------------------------------------------------------------------------

    def build(self) -> None:
        job = self.job
        t0 = _perf()
        self.entry = import_candidate(self.src, job.language, job.entry_file, job.entry_point, job.solution_id,
                                      prebuilt=job.prebuilt.model_dump() if job.prebuilt else None)
        if job.prepare:  # set by the evaluator for a task's own bundled solution only
            module = sys.modules.get(f"ks_{job.solution_id}")
            self.prepare = getattr(module, job.prepare, None)
            if not callable(self.prepare):
                raise CandidateFailure(Status.COMPILE_ERROR, f"{job.entry_file} defines no callable `{job.prepare}`")
        self.integrity_check("at import")
        self.send(Built(seconds=_perf() - t0))

    def correctness(self) -> None:
        for item in self.job.check:
            self.current = item.workload.name
            inputs = self.inputs_for(item.workload, item.seed)
            pristine = {k: v.clone() for k, v in inputs.items() if isinstance(v, torch.Tensor)}
            self.set_up(inputs)
            self.sync()
            t0 = _perf()
            result = self.call(inputs)
            self.sync()
            wall_ms = (_perf() - t0) * 1e3
            self.integrity_check(f"workload {item.workload.name}")
            outputs = self.check_outputs(result, inputs, pristine)
            del pristine, result
            index = item.index
            self.deliver(lambda h: Output(index=index, handover=h, wall_ms=wall_ms), outputs)  # noqa: B023
            del inputs, outputs
        self.send(Checked())

    def l2_flusher(self) -> Callable[[], Any]:
        # Twice the H100/H200 L2 (50/60 MB): writing it evicts whatever the last call left there.
        buf = torch.empty(128 * 1024 * 1024 // 4, dtype=torch.int32, device="cuda")
        return lambda: buf.zero_()
