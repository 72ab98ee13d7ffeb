"""What a task bundle declares: task.json's records, a workload, the one error type, and where the
bundled tasks live.

The leaf of taskspec/: task.py (loading bundles) and flashinfer_format.py (FlashInfer-Bench's formats)
both build on these records, and neither imports the other's callers back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class TaskError(Exception):
    """A task bundle, workload set or solution that cannot be used; the message is one line for a user."""


class TensorSpec(BaseModel):
    shape: list[str | int] | None = Field(default=None, description="Axis names or sizes; None for a scalar.")
    dtype: str
    description: str = ""


class Tolerance(BaseModel):
    rule: Literal["gpumode", "flashinfer"] = Field(
        description="gpumode: |x-y| <= atol + rtol|y| elementwise, non-finite positions must match. "
        "flashinfer: an element fails when |x-y| > atol AND |x-y|/(|y|+1e-8) > rtol; no NaN, and an "
        "infinity only where the reference has the same one."
    )
    atol: float
    rtol: float
    required_fraction: float = Field(default=1.0, description="Share of elements that must pass (flashinfer rule).")
    relaxed_dtype_option: str | None = Field(
        default=None, description="A compat option under which any float output dtype is accepted."
    )


class ScoreRule(BaseModel):
    kind: Literal["geomean_latency", "mean_speedup"] = Field(
        description="geomean_latency: geometric mean of mean latencies (ms, lower is better). "
        "mean_speedup: arithmetic mean of baseline/candidate latency (higher is better)."
    )


class CostModel(BaseModel):
    """Work one call must at least do, as formulas over the workload's axes (+ - * / ** and parentheses).

    The evaluator turns them into a physical floor on a call's time with the GPU's peak compute
    and bandwidth: a time below the floor was not measured honestly. Lower bounds, not estimates."""

    flops: str = Field(description="Floating-point operations per call, at least.")
    bytes: str = Field(description="Bytes per call that must cross the memory bus at least (inputs read once, outputs written once).")
    description: str = ""


class TimingObjective(BaseModel):
    """How the task's source benchmark times a kernel, which the score follows (`--objective` overrides `timed`)."""

    model_config = ConfigDict(extra="forbid")

    timed: Literal["kernel", "call"] = Field(
        default="call",
        description="call: CUDA events around the candidate's own call after a device sync, host launch work "
        "included; kernel: the call replayed as a CUDA graph (no host work).")
    inputs: Literal["fresh", "reuse"] = Field(
        default="fresh", description="What the source does between timed calls: new inputs, or one input set. "
        "The evaluation's mode (--mode) decides what is run; fresh is the default and never looser.")
    flush_l2: bool = Field(default=True, description="Whether the L2 cache is flushed before each timed call.")
    recheck: bool = Field(default=False, description=(
        "Whether every timed call's output is checked against the reference before the next call is made "
        "(GPUMode's leaderboard mode; fresh inputs only); false: the last timed call's output alone."))
    source: str = Field(default="", description="Where the rule comes from, in one sentence.")


class TaskDefinition(BaseModel):
    """The contents of task.json."""

    name: str
    description: str = Field(description="Prose shown to an LLM: what to compute and what matters.")
    axes: dict[str, Any] = Field(default_factory=dict)
    inputs: dict[str, TensorSpec]
    outputs: dict[str, TensorSpec]
    constraints: list[str] = Field(default_factory=list)
    interface: Literal["gpumode", "flashinfer"] = Field(
        description="gpumode: entry(data) with data from the bundle's pack_data(); flashinfer: entry(*inputs)."
    )
    entry_point: str
    tolerance: Tolerance
    score: ScoreRule
    cost: CostModel | None = Field(default=None, description="Per-call work lower bounds, for the physical-floor check.")
    workload_sets: dict[str, str] = Field(description="Set name -> JSONL file inside the bundle.")
    default_workloads: str = Field(default="benchmarks", description="The set that scores candidates by default.")
    baseline: str = Field(description="Name of the solution under solutions/ that scores compare against.")
    default_seed: str | None = Field(
        default=None, description="The solution a run starts from when it is in the language searched (else: the "
                                  "first seed by name in that language).")
    compat_options: dict[str, str] = Field(default_factory=dict, description="Option name -> what it changes.")
    environment: list[str] = Field(default_factory=list, description=(
        "Environment variables a kernel of this task reads, passed into the sandbox where set (never one "
        "that looks like a credential); every other variable beyond PATH, locale, CUDA and Triton stays out."))
    expected_waits: dict[str, float] = Field(default_factory=dict, description=(
        "Stage -> the baseline's longest wait for the worker on a GPU, seconds (EvalResult.stage_waits of a "
        "measured baseline): scales an evaluator's hang limits before it has measured the baseline itself."))
    objective: TimingObjective = Field(
        default_factory=TimingObjective, description="How the source benchmark times kernels; the score follows it.")


class Workload(BaseModel):
    """One problem instance: axis sizes plus generator parameters."""

    name: str
    axes: dict[str, int] = Field(default_factory=dict)
    params: dict[str, Any] = Field(default_factory=dict)


def bundled_tasks_dir() -> Path:
    """`tasks/` of a checkout, or the copy installed as ksearch_ray.bundled_tasks."""
    here = Path(__file__).resolve().parents[1]  # the ksearch_ray package
    installed = here / "bundled_tasks"
    if installed.is_dir():
        return installed
    # A checkout: tasks/ beside the package (checked by its sibling pyproject, since a stray
    # site-packages/tasks from an unrelated project must never be mistaken for ours).
    if (here.parent / "pyproject.toml").is_file():
        return here.parent / "tasks"
    return installed
