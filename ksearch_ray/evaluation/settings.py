"""What an evaluator may spend: time limits (`Limits`) and the timing method (`TimingPolicy`).

Both are plain validated records, so a run's configuration can embed them (per run and per test)
and build the Evaluator from them in one place. Unknown fields are refused (`extra="forbid"`): a
misspelt limit is an error, not a silently ignored default.

How a wait is limited (see docs/architecture.md, "Evaluation"): every wait for the worker's next
message in a stage is cut off after

    min(ceiling, max(hang_floor, min(hang_factor * expected, expected + hang_margin)))

where the ceiling is `idle` (`build_python` / `build_cuda` for the build), and the expected wait is
the baseline's longest wait in that stage: what this evaluator measured when it evaluated the task's
baseline solution (or was told with `Evaluator.learn_stage_times`), else what the task declares
(task.json `expected_waits`, on a GPU), else, for the warm-up and timing stages, what the candidate's
own correctness calls took in this evaluation. With none of them, the ceiling alone applies.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class Limits(BaseModel):
    """Seconds an evaluation may spend, and what its candidate may use of the host; each settable per run
    (YAML: `evaluation: {limits: {memory_mb: 16384}}`).

    The resource defaults are sized for an 8-GPU node with eight evaluators (one candidate each at a
    time): 8 x 32 GiB of host memory, 8 x 1024 processes and threads, 8 x 16 GiB of disk, within what
    such a node has (1-2 TiB of memory, hundreds of GiB of local disk), and far above what a kernel
    needs (a Triton or CUDA candidate uses a few GiB of host memory: torch, the CUDA context, the
    compiler). 0 turns a resource limit off."""

    model_config = ConfigDict(extra="forbid")

    setup: float = Field(default=300.0, gt=0, description=(
        "A worker that has not reported ready after this long is a sandbox fault (SandboxError), "
        "not a verdict: none of the candidate's code has run."))
    build_python: float = Field(default=300.0, gt=0, description=(
        "Ceiling on importing a Python/Triton candidate (or loading a library built ahead of time)."))
    build_cuda: float = Field(default=900.0, gt=0, description=(
        "Limit on compiling a CUDA/C++ candidate inside the evaluation (never scaled: the baseline "
        "is not compiled)."))
    idle: float = Field(default=180.0, gt=0, description=(
        "Ceiling on any wait for the worker's next message (a result, a timed call, a compiled "
        "kernel): a worker silent this long is killed and the candidate judged TIMEOUT."))
    hang_factor: float = Field(default=10.0, gt=0, description=(
        "Scaled limit: this multiple of the task baseline's longest wait in the same stage."))
    hang_margin: float = Field(default=30.0, gt=0, description=(
        "... and never more than this many seconds beyond the expected wait: a hang is judged within it."))
    hang_floor: float = Field(default=20.0, gt=0, description=(
        "The scaled limit is never below this (Triton compiles a kernel in seconds, and every "
        "compile counts as progress)."))
    total: float = Field(default=3600.0, gt=0, description="Whole evaluation, sandbox start to verdict.")
    memory_mb: int = Field(default=32768, ge=0, description=(
        "Host memory of a candidate's process (RLIMIT_DATA: heap and private mappings; the GPU's own memory "
        "and CUDA's address-space reservations do not count, so CUDA initialises). Past it an allocation "
        "fails: Status.RESOURCE_LIMIT."))
    processes: int = Field(default=1024, ge=0, description=(
        "Processes and threads a candidate may have at once: a pids cgroup per worker where the host has one, "
        "and RLIMIT_NPROC (counted in the candidate's own user namespace; without one, above what the host user "
        "already runs). The kernel exempts the host's root from RLIMIT_NPROC: a sandbox run as root without a "
        "pids cgroup warns that this limit does not hold, and isolation: require refuses."))
    file_mb: int = Field(default=4096, ge=0, description=(
        "Largest file a candidate may write (RLIMIT_FSIZE); past it the write fails and the worker is stopped."))
    disk_mb: int = Field(default=16384, ge=0, description=(
        "Disk a candidate may fill in its job directory and Triton cache (checked every second), and the "
        "size of its private /tmp and /dev/shm."))
    output_mb: int = Field(default=64, ge=0, description=(
        "What a candidate may print (stdout and stderr together), capped as it is written: past it the "
        "candidate is stopped. The evaluator reads only the last 64 KiB of any log."))
    reference_cache_mb: int = Field(default=4096, ge=0, description=(
        "Memory (device memory on a GPU) the evaluator keeps for reference outputs, so a reference "
        "for an input set is computed once per evaluator; 0 turns the cache off."))
    timed_reference_cache_mb: int = Field(default=4096, ge=0, description=(
        "Memory (device memory on a GPU) the evaluator keeps, besides `reference_cache_mb`, for the references "
        "of each figure's last timed call, whose input sets come back whenever the stop rule ends at the same "
        "call; those seen most often are kept. 0 turns it off."))


    def resources(self) -> dict[str, int]:
        """The resource limits, as the sandbox takes them (sandbox/resources.py)."""
        return {k: getattr(self, k) for k in ("memory_mb", "processes", "file_mb", "disk_mb", "output_mb")}


class TimingPolicy(BaseModel):
    """How each workload is timed (see `rule`, which is also what an EvalResult states)."""

    model_config = ConfigDict(extra="forbid")

    max_calls: int = Field(default=100, ge=1, description="Most timed calls per workload.")
    min_calls: int = Field(default=3, ge=1, description="Fewest timed calls per workload.")
    target_rel_err: float = Field(default=1e-3, gt=0, description=(
        "Stop once the standard error of the mean is below this fraction of the mean (GPUMode's rule)."))
    max_total_s: float = Field(default=10.0, gt=0, description="Stop once the timed calls add up to this.")
    max_wall_s: float = Field(default=120.0, gt=0, description="Stop a workload's calls after this much wall time.")
    warmup_calls: int = Field(default=2, ge=0, description="Untimed calls per workload before any is timed.")
    flush_l2: bool = Field(default=True, description=(
        "Write a buffer twice the L2's size before each timed call, where the task's rule flushes (false: never)."))
    graphs: bool = Field(default=True, description=(
        "On a GPU, also time the kernel figure: the call captured once as a CUDA graph and replayed for "
        "every timed call (fresh inputs are copied into the captured buffers first, outside the timed "
        "region): no launch gaps or host jitter in it. Calls that cannot be captured (they sync or plan "
        "on the host) have the call figure only."))
    objective: Literal["kernel", "call"] | None = Field(default=None, description=(
        "Which figure the score and the search use: kernel (graph replay) or call (the candidate's own call, "
        "host work included); none: the task's (task.json `objective`, after its source benchmark)."))
    recheck: bool | None = Field(default=None, description=(
        "Check every timed call's output (fresh inputs) against the reference before the next call, untimed, as "
        "GPUMode's leaderboard mode does (true), or the last call's only (false); none: the task's (task.json "
        "`objective.recheck`)."))
    tail_slack_ratio: float = Field(default=0.05, ge=0, description=(
        "Work hidden from the timed stream (side streams) keeps the device busy after the end event: "
        "a device-wide sync right after it may take at most this fraction of the call's median ..."))
    tail_slack_ms: float = Field(default=0.05, ge=0, description="... plus this many milliseconds.")

    @classmethod
    def for_device(cls, device: str) -> TimingPolicy:
        # On the CPU path a call is the Triton interpreter (seconds, host wall clock): GPUMode's
        # 10 s per benchmark would make every evaluation minutes long for a number that only
        # ranks variants on this machine.
        if device == "cpu":
            return cls(max_calls=20, max_total_s=1.0, max_wall_s=10.0, warmup_calls=1)
        return cls()

    def rule(self, device: str, mode: str, *, objective: str = "call", flush_l2: bool | None = None,
             recheck: bool = False) -> str:
        """The stop rule and method in one sentence, as the evaluation's output states it."""
        flush_l2 = self.flush_l2 and (True if flush_l2 is None else flush_l2)
        inputs = ("fresh inputs for every call, generated on the device outside the timed region"
                  if mode == "fresh" else "one input set for every call")
        if recheck and mode == "fresh":
            inputs += ", each call's output checked against the reference before the next call"
        if device == "cuda":
            how = ("CUDA events around one call after a device sync, host launch work included"
                   + ("; and the kernel: the call replayed as a CUDA graph where it can be captured" if self.graphs else ""))
            scored = (f"the score uses the {objective} figure"
                      + (" (the call where it cannot be captured)" if objective == "kernel" else ""))
        else:
            how = "host wall clock around one call (Triton interpreter; no kernel figure)"
            scored = "the score uses the call figure"
        flush = ", L2 flushed before each call" if flush_l2 and device == "cuda" else ""
        return (f"per workload: {self.warmup_calls} warm-up calls, then timed calls ({how}{flush}; {inputs}) until "
                f"the standard error of the mean is below {self.target_rel_err:.2%} of the mean (at least "
                f"{self.min_calls} calls), or {self.max_calls} calls, or {self.max_total_s:g} s of timed calls, "
                f"or {self.max_wall_s:g} s of wall time, for each figure; {scored}")


class ProfilerSettings(BaseModel):
    """How an evaluator profiles a kernel (`Evaluator.profile`, evaluation/profiling.py)."""

    model_config = ConfigDict(extra="forbid")

    ncu: str | None = Field(default=None, description=(
        "The ncu executable; none: PATH, CUDA_HOME/bin, /usr/local/cuda/bin, /opt/nvidia/nsight-compute/*/ncu."))
    timeout_s: float = Field(default=300.0, gt=0, description="Wall-clock limit of one profile, sandbox start to end.")
    kernels: int = Field(default=5, ge=1, le=50, description="Kernels kept per profile, slowest first.")
    launch_count: int = Field(default=200, ge=1, description="Most kernels of the call that ncu profiles.")
    warmup_calls: int = Field(default=2, ge=1, description="Calls before the profiled one (compiles, autotuning, caches).")
