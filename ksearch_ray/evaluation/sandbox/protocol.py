"""The messages between the evaluator and a sandboxed worker: typed, keyed on `type`.

Every frame on the job channel (channel.Channel: length, JSON body, HMAC tag) is one of these.
The evaluator parses what the worker sends with `parse_report`: anything that is not a well-formed
report is an INTEGRITY_VIOLATION, never a KeyError. Statuses travel as `Status`.

    evaluator -> Job                                          (first frame: what to run)
    worker    -> Ready ; (wait_for_turn: evaluator -> Go | StopCmd) ; Built | Fail
    worker    -> Output (one per correctness workload, outputs handed over)   evaluator -> Taken
    worker    -> Checked
    evaluator -> TimeCmd | RetimeCmd | StopCmd
    time:     worker -> Progress* ... Warmed ; evaluator -> Go
              per workload: worker -> Tick* ... Timed (outputs handed over) ; evaluator -> Taken
                (recheck: after each timed call but the last, worker -> CallOutput ; evaluator -> Taken? ; Go)
              worker -> Done
    retime:   per workload: evaluator -> PrepareCmd ; worker -> Prepared
              evaluator -> RunCmd ; worker -> Ran                    (timed by the evaluator)
              evaluator -> OutputCmd ; worker -> Output ; evaluator -> Taken
              evaluator -> FinishCmd ; worker -> Done
    any time: worker -> Progress (a kernel compiled, a warm-up call): it resets the wait limit.

    profile:  evaluator -> ProfileJob (first frame) ; worker -> Ready ... Profiled     (sandbox/profiler.py)
              (wait_for_turn: worker -> Waiting, once the profiled process is up ; evaluator -> Go)

    reference (an untrusted task's references, sandbox/reference_worker.py):
              evaluator -> ReferenceJob (first frame) ; worker -> Ready | Fail
              per request: evaluator -> ReferenceCmd ; worker -> Output (handed over) | Fail
                           evaluator -> Taken (device hand-overs)
              evaluator -> StopCmd

A hand-over (`Handover`) names tensors inside one buffer the worker passes as a file descriptor
with the frame (sandbox/handover.py): a sealed memfd, or CUDA device memory exported by the
driver.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

from ksearch_ray.models import Language, Status
from ksearch_ray.taskspec.spec import Workload

Transport = Literal["cuda_vmm", "memfd"]
TimingMethod = Literal["graph_replay", "calls"]


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --- the job -----------------------------------------------------------------------------------


class WorkItem(_Message):
    index: int = Field(ge=0)
    workload: Workload
    seed: int = Field(ge=0)


class Prebuilt(_Message):
    path: str
    module: str


class _CandidateJob(_Message):
    """What a worker needs to build and call one candidate of a task (an evaluation, a profile)."""

    workdir: str
    triton_cache_dir: str
    task_root: str
    device: Literal["cuda", "cpu"]
    options: list[str] = Field(default_factory=list)
    solution_id: str
    language: Language
    entry_file: str
    entry_point: str
    prepare: str | None = Field(default=None, description="A trusted baseline's untimed setup function.")
    wait_for_turn: bool = Field(default=False, description=(
        "Wait for the evaluator's Go before the candidate is imported: its turn on the device (evaluation.overlap). "
        "An evaluation's worker waits after Ready (StopCmd instead ends it); a profile's Python, once up (CUDA "
        "context, torch, the task), says so through the worker (Waiting)."))


class Job(_CandidateJob):
    """An evaluation job: build, check every workload, then wait for a command."""

    type: Literal["job"] = "job"
    prebuilt: Prebuilt | None = None
    check: list[WorkItem]
    device_handover: bool = Field(default=True, description="Hand outputs over in device memory where the driver allows.")
    handover_bytes: int | None = Field(default=None, ge=0, description=(
        "The largest outputs to expect (from the task's output shapes): the device buffer is made that size once."))


class BuildJob(_Message):
    """A build ahead of the evaluation (evaluation/builder.py): compile, import once, report."""

    type: Literal["build"] = "build"
    workdir: str
    triton_cache_dir: str
    module_name: str
    archs: list[str]
    max_jobs: int = 1


class GpuFacts(_Message):
    """What the evaluators' GPU says of itself (`torch.cuda.get_device_properties`), from their descriptions: a
    Triton build answers the candidate's host code with it, so that the code plans as it does there (an SM count
    for a grid, say)."""

    name: str
    major: int = Field(ge=0)
    minor: int = Field(ge=0)
    multi_processor_count: int = Field(ge=1)
    total_memory: int = Field(ge=0)
    shared_memory_per_multiprocessor: int | None = None
    regs_per_multiprocessor: int | None = None
    L2_cache_size: int | None = None


class TritonBuildJob(_Message):
    """A Triton candidate's kernels compiled ahead of its evaluation, on a CPU (evaluation/builder.py,
    sandbox/triton_build.py): every Triton launch of one call per workload becomes a compile for
    `capability` into the job's Triton cache, and nothing runs on a GPU."""

    type: Literal["triton_build"] = "triton_build"
    workdir: str
    triton_cache_dir: str
    task_root: str
    solution_id: str
    entry_file: str
    entry_point: str
    capability: int = Field(ge=10, le=200, description="The evaluators' compute capability as Triton writes it: 90 for 9.0.")
    workloads: list[Workload]
    gpu: GpuFacts | None = Field(default=None, description="The evaluators' GPU, where they all have the same one.")
    inputs: dict[str, Any] | None = Field(default=None, description=(
        "Workload -> its inputs' shapes (triton_build.input_spec), worked out by the trusted builder for a task of "
        "the package's own; a workload without one has its inputs made by the task's generator in the worker."))


class ProfileJob(_CandidateJob):
    """One call of a candidate under Nsight Compute (sandbox/profiler.py), outside any timed measurement:
    the worker runs `ncu` as the wrapper of a fresh Python that builds the candidate, warms it up on
    one workload and calls it once between cudaProfilerStart and cudaProfilerStop."""

    type: Literal["profile"] = "profile"
    device: Literal["cuda", "cpu"] = Field(default="cuda", description="cpu: the plumbing alone (tests), no CUDA calls.")
    item: WorkItem
    warmup_calls: int = Field(default=2, ge=1)
    ncu: str = Field(description="The ncu executable.")
    ncu_args: list[str] = Field(description="ncu's options (evaluation/ncu.py), before --log-file and the command.")
    log_name: str = Field(default="ncu.csv", pattern=r"^[A-Za-z0-9_.-]+$", description="ncu's log, in the job directory.")


class ReferenceJob(_Message):
    """A worker that computes references of a task from outside the package (Task.trusted is false):
    the task's own input generator and reference, run sandboxed like a candidate, on request."""

    type: Literal["reference"] = "reference"
    workdir: str
    triton_cache_dir: str
    task_root: str
    device: Literal["cuda", "cpu"]
    device_handover: bool = True


# --- hand-overs --------------------------------------------------------------------------------


class TensorMeta(_Message):
    name: str
    dtype: str
    shape: list[int]
    offset: int = Field(ge=0, description="Byte offset into the hand-over buffer.")
    nbytes: int = Field(ge=0)


class Handover(_Message):
    transport: Transport
    buffer: int = Field(ge=0, description="The worker's number for the buffer; a new number comes with its descriptor.")
    size: int = Field(ge=0, description="Bytes of the buffer.")
    fds: int = Field(ge=0, le=1, description="Descriptors sent with this frame (1 when the buffer is new).")
    tensors: list[TensorMeta]


# --- worker -> evaluator -----------------------------------------------------------------------


class Ready(_Message):
    type: Literal["ready"] = "ready"
    setup_s: float


class Waiting(_Message):
    """A profile job's profiled process is up and waits for its turn on the device (ProfileJob.wait_for_turn)."""

    type: Literal["waiting"] = "waiting"


class Built(_Message):
    type: Literal["built"] = "built"
    seconds: float


class TritonBuilt(_Message):
    """A Triton build's report: what it compiled, and per workload that it could not call, why (the
    evaluation's worker compiles those kernels itself)."""

    type: Literal["triton_built"] = "triton_built"
    seconds: float
    launches: int = Field(ge=0, description="Triton launches compiled (one per kernel launch of each call).")
    built: list[str] = Field(description="Workloads whose call ran to its end here.")
    not_built: dict[str, str] = Field(default_factory=dict, description="Workload -> why its call stopped (one line).")


class Progress(_Message):
    type: Literal["progress"] = "progress"
    what: str = ""


class Output(_Message):
    type: Literal["output"] = "output"
    index: int
    handover: Handover
    wall_ms: float = 0.0


class Checked(_Message):
    type: Literal["checked"] = "checked"


class Warmed(_Message):
    type: Literal["warmed"] = "warmed"


class Tick(_Message):
    type: Literal["tick"] = "tick"
    n: int


class Timed(_Message):
    """One figure of one workload: `kernel` (graph replays, sent first where the call can be captured),
    then `call` (the candidate's own calls), which closes the workload."""

    type: Literal["timed"] = "timed"
    index: int
    figure: Literal["kernel", "call"]
    count: int
    seed_index: int = Field(ge=0, description="Which call's inputs the handed-over output belongs to.")
    method: TimingMethod
    handover: Handover


class CallOutput(_Message):
    """A timed call's output, to be judged before the next call is made (TimeCmd.recheck); the worker waits
    for Go. The last call's output comes with Timed instead."""

    type: Literal["call_output"] = "call_output"
    index: int
    seed_index: int = Field(ge=0, description="Which call's inputs the output belongs to.")
    handover: Handover


class Done(_Message):
    type: Literal["done"] = "done"


class Fail(_Message):
    type: Literal["fail"] = "fail"
    status: Status
    message: str
    log: str = ""
    workload: str | None = None

    @field_validator("status")
    @classmethod
    def _a_failure(cls, status: Status) -> Status:
        # The worker's process is the candidate's: a failure that claims PASSED is a forged verdict.
        if status.passed:
            raise ValueError("a failure cannot report PASSED")
        return status


class Prepared(_Message):
    type: Literal["prepared"] = "prepared"
    method: TimingMethod


class Ran(_Message):
    type: Literal["ran"] = "ran"


class Profiled(_Message):
    """A profile job's end: ncu's exit code (negative: the signal that ended it)."""

    type: Literal["profiled"] = "profiled"
    code: int


ReportMessage = (Ready | Built | TritonBuilt | Progress | Output | Checked | Warmed | Tick | Timed | CallOutput | Done | Fail | Prepared
                 | Ran | Profiled | Waiting)
Report = Annotated[ReportMessage, Field(discriminator="type")]

# --- evaluator -> worker -----------------------------------------------------------------------


class Taken(_Message):
    """The evaluator holds its own copy of the outputs just handed over: the worker may go on."""

    type: Literal["taken"] = "taken"


class TimeCmd(_Message):
    type: Literal["time"] = "time"
    mode: Literal["fresh", "reuse"]
    workloads: list[WorkItem]
    max_calls: int
    min_calls: int
    target_rel_err: float
    max_total_s: float
    max_wall_s: float
    warmup_calls: int
    flush_l2: bool
    graphs: bool = Field(description="Also time the call replayed as a CUDA graph (the kernel figure), on a GPU.")
    recheck: bool = Field(default=False, description=(
        "Hand over every timed call's output (CallOutput) and wait for Go before the next call (fresh mode)."))


class Go(_Message):
    type: Literal["go"] = "go"


class RetimeCmd(_Message):
    type: Literal["retime"] = "retime"
    workloads: list[WorkItem]
    graphs: bool = Field(default=True, description="Replay the call as a CUDA graph where it can be captured "
                                                  "(the kernel objective); false: plain calls (the call objective).")


class StopCmd(_Message):
    type: Literal["stop"] = "stop"


class PrepareCmd(_Message):
    type: Literal["prepare"] = "prepare"
    index: int


class RunCmd(_Message):
    type: Literal["run"] = "run"
    kind: Literal["flush", "call"]
    reps: int = Field(ge=1)


class OutputCmd(_Message):
    type: Literal["output_request"] = "output_request"
    index: int


class FinishCmd(_Message):
    type: Literal["finish"] = "finish"


class ReferenceCmd(_Message):
    """To a reference worker: the reference outputs of `workload` on the inputs of `seed`."""

    type: Literal["reference_request"] = "reference_request"
    workload: Workload
    seed: int = Field(ge=0)
    options: list[str] = Field(default_factory=list)


CommandMessage = (Taken | TimeCmd | Go | RetimeCmd | StopCmd | PrepareCmd | RunCmd | OutputCmd | FinishCmd
                  | ReferenceCmd)
Command = Annotated[CommandMessage, Field(discriminator="type")]

_REPORT: TypeAdapter[ReportMessage] = TypeAdapter(Report)
_COMMAND: TypeAdapter[CommandMessage] = TypeAdapter(Command)


class ProtocolError(ValueError):
    """A frame that is not a message of the protocol."""


def parse_report(data: Any) -> ReportMessage:
    """A worker's frame as its typed message; ProtocolError (one line) otherwise."""
    try:
        return _REPORT.validate_python(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ProtocolError(f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}") from None


def parse_command(data: Any) -> CommandMessage:
    try:
        return _COMMAND.validate_python(data)
    except ValidationError as exc:
        raise ProtocolError(str(exc.errors()[0]["msg"])) from None
