"""Profiling a kernel once, outside any timed measurement: the evaluator's side.

`Evaluator.profile` starts a profile job in the evaluator's own sandbox (the same zygote, namespaces
and privilege drop as every evaluation: sandbox/profiler.py runs ncu inside it), waits for it under
a wall-clock limit, then reads ncu's log from the job directory as untrusted text
(evaluation/ncu.py). The outcome is a `ProfileResult`: evidence for the planner and the report,
never a score. It fails soft: a profile that fails or runs out of time is a result with its reason
in our own words, and the search goes on.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ksearch_ray.evaluation.device_turn import DeviceTurn
from ksearch_ray.evaluation.ncu import KernelProfile, ProfileError, known_failure, parse_ncu_log, read_log
from ksearch_ray.evaluation.sandbox.channel import ChannelClosed, ChannelForgery, ChannelTimeout
from ksearch_ray.evaluation.sandbox.handle import Sandbox
from ksearch_ray.evaluation.sandbox.profiler import BUILD_FAILED, CALL_FAILED, INPUTS_FAILED, TURN_FAILED
from ksearch_ray.evaluation.sandbox.protocol import (
    Go,
    Profiled,
    ProfileJob,
    ProtocolError,
    Waiting,
    parse_report,
)
from ksearch_ray.models import EvalResult

_TARGET_FAILED = {
    BUILD_FAILED: "the candidate did not build under the profiler",
    CALL_FAILED: "the candidate's call raised under the profiler",
    INPUTS_FAILED: "the workload's inputs could not be made under the profiler",
    TURN_FAILED: "the profiled process was not given its turn on the device",
}


class ProfilerFound(BaseModel):
    """Whether an evaluator can profile: the tool and where it is, or why not."""

    model_config = ConfigDict(extra="forbid")

    tool: str | None = Field(default=None, description="e.g. 'ncu 2025.3.1.0'.")
    path: str | None = None
    problem: str | None = Field(default=None, description="Why this evaluator cannot profile, in one line.")


class ProfileResult(BaseModel):
    """One profiled call of a kernel on one workload."""

    model_config = ConfigDict(extra="forbid")

    status: Literal["ok", "failed", "timeout"]
    message: str = Field(default="", description="Why it failed, in our words (never the profiler's or the candidate's).")
    solution_id: str
    workload: str
    measured_ms: float | None = Field(default=None, description="The kernel's measured mean on that workload (its evaluation).")
    seconds: float = Field(default=0.0, description="Wall time of the profile job, sandbox start to end.")
    tool: str = Field(default="", description="The profiler and its version.")
    kernels: list[KernelProfile] = Field(default_factory=list, description="The slowest kernels of the call, slowest first.")
    kernel_count: int = Field(default=0, ge=0, description="Kernels profiled in the call.")
    kernels_ms: float = Field(default=0.0, ge=0, description="Their durations added up (each replayed with cold caches).")
    rejected: int = Field(default=0, ge=0, description="Rows and values of the profiler's log that failed the checks.")
    launch_limit: bool = Field(default=False, description="The call launched more kernels than were profiled.")

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def lines(self, *, kernels: int | None = None) -> list[str]:
        """The profile as the planner and the report read it: a head line, then one line per kernel."""
        if not self.ok:
            return [f"not profiled ({self.status}): {self.message}"]
        measured = f" (measured {self.measured_ms:.4g} ms a call)" if self.measured_ms else ""
        more = ", more were launched than profiled" if self.launch_limit else ""
        left_out = f"; {self.rejected} value(s) of the profiler's log failed the checks and are left out" if self.rejected else ""
        head = (f"{self.tool or 'profiler'} on workload {self.workload}{measured}: {self.kernel_count} kernel(s){more}, "
                f"{self.kernels_ms:.4g} ms in all (each kernel replayed with cold caches){left_out}")
        shown = self.kernels if kernels is None else self.kernels[:kernels]
        return [head, *(kernel_line(k, self.kernels_ms) for k in shown)]


def _pct(value: float | None) -> str:
    return "?" if value is None else f"{value:.0f}%"


def kernel_line(k: KernelProfile, total_ms: float) -> str:
    share = f" ({k.duration_ms / total_ms:.0%} of the call)" if total_ms > 0 else ""
    parts = [f"{k.name}: {k.duration_ms:.4g} ms{share}"]
    dram = f"DRAM {_pct(k.dram_pct)} of peak" + (f" ({k.dram_gb_s:.0f} GB/s)" if k.dram_gb_s is not None else "")
    parts.append(f"{dram}, SM {_pct(k.sm_pct)}, busiest memory unit {_pct(k.memory_pct)}")
    if k.occupancy_pct is not None:
        theory = f" of {k.theoretical_occupancy_pct:.0f}% theoretical" if k.theoretical_occupancy_pct is not None else ""
        parts.append(f"occupancy {k.occupancy_pct:.0f}%{theory}")
    if k.registers is not None:
        parts.append(f"{k.registers} registers/thread")
    if k.block and k.grid:
        parts.append(f"block {'x'.join(map(str, k.block))}, grid {'x'.join(map(str, k.grid))}")
    if k.stalls:
        parts.append("top stalls (warp cycles per issued instruction): "
                     + ", ".join(f"{s.reason} {s.cycles:.2g}" for s in k.stalls))
    return "; ".join(parts)


def slowest_workload(result: EvalResult) -> tuple[str, float] | None:
    """The workload of `result` with the largest mean time, and that mean (None when nothing was timed)."""
    timed = [(w.workload, w.timing.mean_ms) for w in result.workloads if w.timing is not None]
    return max(timed, key=lambda t: t[1], default=None)


def run_profile(sandbox: Sandbox, job: ProfileJob, timeout_s: float, *, workload: str, measured_ms: float | None,
                tool: str, keep: int, launch_count: int, identifiers: frozenset[str] | None = None,
                copy_logs_to: Path | None = None, turn: DeviceTurn | None = None) -> ProfileResult:
    """Run `job` in `sandbox`, at most `timeout_s` seconds, and read what ncu left in its job directory.
    `identifiers`: the words of the candidate's sources (kernel names outside them and the known libraries are
    withheld). `copy_logs_to`: a folder that gets ncu's log and the profiled process's output as they were (for
    experiments and fixtures; they are the candidate's to write). `turn`: with a job that waits for its turn
    (`wait_for_turn`), taken when the profiled process is up and given back when the job ends; the limit
    counts from the turn."""
    t0 = time.monotonic()
    base = ProfileResult(status="failed", solution_id=job.solution_id, workload=workload, measured_ms=measured_ms, tool=tool)
    worker = sandbox.start(job.model_dump(mode="json"))
    code: int | None = None
    timed_out = False
    why = "the profile job ended without reporting"
    try:
        deadline = t0 + timeout_s
        while code is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ChannelTimeout()
            message = parse_report(worker.chan.recv(remaining))
            if isinstance(message, Profiled):
                code = message.code
            elif isinstance(message, Waiting) and turn is not None and job.wait_for_turn and not turn.held:
                waited = time.monotonic()
                turn.take()
                deadline += time.monotonic() - waited
                worker.chan.send(Go())
            elif message.type not in ("ready", "progress"):
                why = f"the profile job sent an unexpected {message.type!r} message"
                break
    except ChannelTimeout:
        timed_out = True
    except (ChannelClosed, ChannelForgery, ProtocolError) as exc:
        why = f"the profile job's channel broke ({type(exc).__name__})"
    finally:
        sandbox.kill(worker)  # whatever the candidate left running dies with its namespace
        sandbox.reap(worker)
        if turn is not None:
            turn.give_back()
    seconds = time.monotonic() - t0

    def ended(status: str, message: str = "", **found: object) -> ProfileResult:
        return base.model_copy(update={"status": status, "message": message, "seconds": seconds, **found})

    if timed_out:
        return ended("timeout", f"no result within {timeout_s:.0f} s")
    try:
        log = read_log(Path(job.workdir) / job.log_name)
    except OSError:
        log = ""
    if copy_logs_to is not None:
        copy_logs_to.mkdir(parents=True, exist_ok=True)
        (copy_logs_to / job.log_name).write_text(log)
        with contextlib.suppress(OSError):
            (copy_logs_to / "profiler.out").write_text(read_log(Path(job.workdir) / "profiler.out")[-65536:])
    if code is None:
        return ended("failed", why)
    if code in _TARGET_FAILED:
        return ended("failed", _TARGET_FAILED[code])
    if code != 0:
        said = known_failure(log)
        how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
        return ended("failed", f"ncu ended with {how}" + (f": {said}" if said else ""))
    try:
        table = parse_ncu_log(log, keep=keep, identifiers=identifiers)
    except ProfileError as exc:
        return ended("failed", known_failure(log) or str(exc))
    return ended("ok", kernels=table.kernels, kernel_count=table.kernel_count, kernels_ms=table.kernels_ms,
                 rejected=table.rejected, launch_limit=table.kernel_count >= launch_count)
