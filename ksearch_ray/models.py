"""Typed records shared by every part of ksearch-ray: solutions, statuses, evaluation results.

Everything that crosses a process or actor boundary, or lands in a run directory, is one of
these models. Code branches on `Status`, never on strings.
"""

from __future__ import annotations

import hashlib
import json
import math
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Language = Literal["python", "triton", "cuda"]
Objective = Literal["kernel", "call"]
"""What a task's score times: `kernel`, the call replayed as a CUDA graph (no host work, as serving
engines run decode); `call`, the candidate's own Python call, host launch work included (as users,
GPUMode's eval.py and FlashInfer-Bench's benchmark call it)."""


class Status(StrEnum):
    """The one outcome of an evaluation (of a whole candidate, or of one workload)."""

    PASSED = "PASSED"
    COMPILE_ERROR = "COMPILE_ERROR"
    RUNTIME_ERROR = "RUNTIME_ERROR"
    INCORRECT_SHAPE = "INCORRECT_SHAPE"
    INCORRECT_DTYPE = "INCORRECT_DTYPE"
    INCORRECT_NUMERICAL = "INCORRECT_NUMERICAL"
    TIMEOUT = "TIMEOUT"
    CRASHED = "CRASHED"
    INTEGRITY_VIOLATION = "INTEGRITY_VIOLATION"
    RESOURCE_LIMIT = "RESOURCE_LIMIT"  # the candidate hit a limit on memory, processes, file size, disk or output

    @property
    def passed(self) -> bool:
        return self is Status.PASSED


class Solution(BaseModel):
    """A candidate kernel: source files plus how to call them. Frozen and content-addressed."""

    model_config = ConfigDict(frozen=True)

    name: str = Field(description="Human-readable name; not part of the identity.")
    task: str = Field(description="Name of the task this solution implements.")
    language: Language = Field(description="python (incl. Triton) or cuda (C++ built with torch's extension builder).")
    entry_file: str = Field(description="Source file that defines the entry point (a .py module, or the binding .cpp/.cu).")
    entry_point: str = Field(description="Function the evaluator calls, e.g. custom_kernel or run.")
    sources: dict[str, str] = Field(description="File name -> file text. Names are flat, relative, no '..'.")
    author: str = Field(default="unknown", description="Who or what wrote it: a model string, 'offline-policy', a person.")
    description: str = Field(default="", description="What the code does, for reports and prompts.")
    parent_id: str | None = Field(default=None, description="Solution this one was derived from, if any.")
    prepare: str | None = Field(
        default=None,
        description="A function of the entry file called with each input set before that set's timed calls, "
        "untimed (a library's plan step). Honoured only for a task's own bundled solutions, never for candidates.",
    )

    @property
    def names_triton(self) -> bool:
        """Whether any of its sources mentions Triton: code that does not has no Triton kernel to compile ahead."""
        return any("triton" in text for text in self.sources.values())

    @property
    def id(self) -> str:
        """Hash of everything that changes behaviour: language, entry point and sources."""
        canonical = json.dumps(
            {
                "language": self.language,
                "entry_file": self.entry_file,
                "entry_point": self.entry_point,
                "sources": dict(sorted(self.sources.items())),
                **({"prepare": self.prepare} if self.prepare else {}),
            },
            sort_keys=True,
        )
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]


class Timing(BaseModel):
    """Latency statistics of one workload, in milliseconds."""

    mean_ms: float
    median_ms: float
    min_ms: float
    std_ms: float
    count: int = Field(description="Number of timed calls.")
    wall_median_ms: float = Field(description="Median host wall-clock per call (sync to sync), the cross-check.")
    host_median_ms: float | None = Field(
        default=None,
        description="Median host time of a timed call, from its start event's record to its return: the host's "
        "launch work (for graph replays, the replay's launch). A call figure near it is bound by the host.",
    )
    clock: Literal["cuda_events", "host_wall"] = Field(
        description="cuda_events on a GPU; host_wall on the CPU path, where numbers are not GPU latencies."
    )
    method: Literal["graph_replay", "calls"] = Field(
        default="calls",
        description="graph_replay: every timed call was a replay of the call captured as a CUDA graph (no launch "
        "gaps or host work counted); calls: the candidate's function was called for each timed call.",
    )
    rel_err: float | None = Field(
        default=None, description="Standard error of the mean over the mean, as reached (the stop rule's target)."
    )
    robust_rel_err: float | None = Field(
        default=None,
        description="The same from the median absolute deviation (1.4826 MAD / median / sqrt(count)): the figure's "
        "noise, which one host hiccup among many timed calls barely moves.",
    )


class WorkloadResult(BaseModel):
    """The verdict on one workload."""

    workload: str
    status: Status
    message: str = Field(default="", description="Short, specific reason when not PASSED.")
    max_abs_error: float | None = None
    max_rel_error: float | None = None
    fraction_ok: float | None = Field(default=None, description="Share of elements within tolerance.")
    timing: Timing | None = Field(
        default=None, description="The objective's figure (EvalResult.objective): what the score and the search use.")
    kernel_timing: Timing | None = Field(
        default=None, description="The call replayed as a CUDA graph; None where it cannot be captured, and on the CPU.")
    call_timing: Timing | None = Field(
        default=None, description="The candidate's own call, host launch work included (the plain-call path).")

    @property
    def kernel_ms(self) -> float | None:
        return self.kernel_timing.mean_ms if self.kernel_timing else None

    @property
    def call_ms(self) -> float | None:
        return self.call_timing.mean_ms if self.call_timing else None


class EvalResult(BaseModel):
    """The verdict on a whole candidate: the first failure decides the status."""

    solution_id: str
    solution_name: str
    task: str
    status: Status
    message: str = Field(default="", description="One line: what went wrong, and where.")
    log: str = Field(default="", description="Excerpt an LLM can fix the code from (compiler errors, traceback tail).")
    workload_set: str
    mode: Literal["fresh", "reuse"]
    device: str = Field(description="'cuda' or 'cpu'.")
    device_name: str = Field(default="", description="GPU name, or 'cpu (Triton interpreter)'.")
    compat: list[str] = Field(default_factory=list, description="Compatibility options in force, e.g. gpumode-mask.")
    workloads: list[WorkloadResult] = Field(default_factory=list)
    score: float | None = Field(default=None, description="Task score (lower is better for latency scores).")
    score_kind: str = Field(default="", description="What the score is, e.g. 'geomean latency (ms)'.")
    timed: bool = Field(default=False, description="Whether latencies were measured.")
    objective: Objective = Field(
        default="kernel", description="Which figure `timing` and the score are: kernel (graph replay) or call.")
    prepared_untimed: bool = Field(
        default=False,
        description="A trusted baseline's per-input setup (its `prepare`, e.g. a library's plan) ran outside the "
        "timed region: these are kernel times, not setup-plus-kernel times.",
    )
    seconds: float = Field(default=0.0, description="Wall time of the evaluation, sandbox start to verdict.")
    device_seconds: float | None = Field(default=None, description=(
        "Of `seconds`, those no evaluation begun before it on the same evaluator covered: summed over an "
        "evaluator's evaluations, the time it had one in progress (evaluation.overlap runs two at once). Equal to "
        "`seconds` where evaluations do not overlap; None in records from before it was kept."))
    overhead_seconds: float = Field(default=0.0, description="Sandbox cost: fork, setup and teardown.")
    build_seconds: float = Field(
        default=0.0,
        description="Of `seconds`, the build stage: compiling (or importing) the candidate, or loading a library "
        "built ahead of time on a CPU worker (whose compile time is not counted here).",
    )
    triton_prebuilt: int | None = Field(
        default=None,
        description="Triton kernels of this candidate compiled ahead on a CPU worker and handed to this evaluation "
        "(None: no Triton build was given).",
    )
    triton_compiled: int | None = Field(
        default=None,
        description="Triton kernels this evaluation's GPU worker compiled itself (its JIT): those no build had, or "
        "all of them without one. None on the CPU path, where Triton interprets.",
    )
    triton_not_built: dict[str, str] | None = Field(
        default=None,
        description="Workloads whose kernels the Triton build could not compile ahead, and why; the worker's JIT "
        "compiled them (None: no Triton build was given).",
    )
    stages: dict[str, float] = Field(
        default_factory=dict,
        description="Wall seconds of the evaluation by what the evaluator was waiting for: start (the sandbox "
        "worker's start-up), queued (evaluation.overlap: for its turn on the device), build, correctness, judging "
        "(the checks' verdicts the worker did not overlap), warmup, timing, judging_timed (the last timed outputs' "
        "verdicts, after the worker's calls), teardown. They add up to `seconds`.",
    )
    stage_waits: dict[str, float] = Field(
        default_factory=dict,
        description="Longest wait for the worker's next message in each stage, in seconds: what scaled time limits "
        "learn from a baseline (Evaluator.learn_stage_times).",
    )
    timed_seconds: float = Field(default=0.0, description="Sum of the timed calls' measured times, in seconds.")
    timing_rule: str = Field(default="", description="How the calls were timed and when timing stopped.")
    transport: str = Field(
        default="", description="How outputs reached the judge: cuda_vmm (device memory) and/or memfd (sealed host memory)."
    )

    @property
    def passed(self) -> bool:
        return self.status is Status.PASSED

    def figure_ms(self, figure: Objective) -> float | None:
        """Geometric mean over the timed workloads of one figure (kernel or call), ms; None where one lacks it."""
        values = [w.kernel_ms if figure == "kernel" else w.call_ms for w in self.workloads if w.timing]
        if not values or any(v is None or v <= 0 for v in values):
            return None
        return math.exp(sum(math.log(v) for v in values if v) / len(values))
