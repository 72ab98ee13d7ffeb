"""What an evaluator measures on: its device's facts, as prompts, reports and pools need them."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from ksearch_ray.evaluation.sandbox.protocol import GpuFacts

if TYPE_CHECKING:
    from ksearch_ray.evaluation.evaluator import Evaluator


class DatasheetPeaks(BaseModel):
    """A GPU's datasheet rates (leads for the planner, not ceilings for the integrity floor)."""

    memory_bandwidth_gb_s: float
    bf16_dense_tflop_s: float
    fp32_tflop_s: float
    fp8_dense_tflop_s: float | None = None


# Vendor datasheets (SXM parts): the H200 has the H100's compute and faster memory.
DATASHEETS: dict[str, DatasheetPeaks] = {
    "H200": DatasheetPeaks(memory_bandwidth_gb_s=4800, bf16_dense_tflop_s=989, fp32_tflop_s=67, fp8_dense_tflop_s=1979),
    "H100": DatasheetPeaks(memory_bandwidth_gb_s=3350, bf16_dense_tflop_s=989, fp32_tflop_s=67, fp8_dense_tflop_s=1979),
}


def datasheet_for(name: str) -> DatasheetPeaks | None:
    return next((peaks for key, peaks in DATASHEETS.items() if key in name), None)


class EvaluatorInfo(BaseModel):
    """One evaluator: where it runs, what it measures on, and what its sandbox protects."""

    device: str = Field(description="cuda or cpu.")
    name: str = Field(description="The device's name (a GPU's CUDA name, or 'cpu').")
    hardware: str = Field(description="One line for prompts and reports.")
    pid: int = 0
    node: str = ""
    gpu_ids: list[str] = Field(default_factory=list)
    compute_capability: str | None = None
    sm_count: int | None = None
    memory_gib: float | None = None
    shared_memory_per_sm_kib: float | None = None
    registers_per_sm: int | None = None
    l2_cache_mib: float | None = None
    peaks: DatasheetPeaks | None = None
    software: dict[str, str] = Field(default_factory=dict, description="torch, triton, CUDA versions the candidate runs with.")
    isolated: bool = False
    isolation_warnings: list[str] = Field(default_factory=list)
    profiler: str | None = Field(default=None, description="The profiler this evaluator profiles bests with (ncu VERSION).")
    profiler_problem: str | None = Field(default=None, description="Why it cannot profile, when profiling was asked for.")


def describe(evaluator: Evaluator, *, node: str = "", gpu_ids: list[str] | None = None) -> EvaluatorInfo:
    """Starts the evaluator's sandbox (a SandboxError when isolation is required and missing) and
    describes it."""
    import torch
    import triton

    report = evaluator.sandbox.ensure_started()
    software = {"torch": torch.__version__, "triton": triton.__version__}
    info = EvaluatorInfo(device=evaluator.device, name="cpu", hardware="", pid=os.getpid(), node=node,
                         gpu_ids=gpu_ids or [], software=software, isolated=report.isolated,
                         isolation_warnings=report.warnings(evaluator.sandbox.isolation))
    if evaluator.profiler is not None:
        found = evaluator.profiler_status()
        info.profiler, info.profiler_problem = found.tool, found.problem
    if evaluator.device != "cuda":
        info.hardware = ("no GPU: candidates run on the CPU in Triton's interpreter (TRITON_INTERPRET=1) "
                         "on reduced workloads; timings are host wall-clock")
        return info
    props = torch.cuda.get_device_properties(0)
    software["cuda"] = str(torch.version.cuda)
    info.name = props.name
    info.compute_capability = f"{props.major}.{props.minor}"
    info.sm_count = props.multi_processor_count
    info.memory_gib = props.total_memory / 2**30
    shared = getattr(props, "shared_memory_per_multiprocessor", None)
    info.shared_memory_per_sm_kib = shared / 1024 if shared else None
    info.registers_per_sm = getattr(props, "regs_per_multiprocessor", None)
    l2 = getattr(props, "L2_cache_size", None)
    info.l2_cache_mib = l2 / 2**20 if l2 else None
    info.peaks = datasheet_for(props.name)
    info.hardware = (f"{props.name} (compute capability {props.major}.{props.minor}, {props.multi_processor_count} SMs, "
                     f"{props.total_memory / 2**30:.0f} GiB)")
    return info


def gpu_facts(infos: list[EvaluatorInfo]) -> GpuFacts | None:
    """The GPU every one of `infos` describes, as a Triton build shows it to host code; None unless they are all
    the same GPU (a name, a compute capability, an SM count), or for the CPU path."""
    kinds = {(i.name, i.compute_capability, i.sm_count) for i in infos}
    if len(kinds) != 1 or not infos:
        return None
    info = infos[0]
    if info.device != "cuda" or not info.compute_capability or not info.sm_count:
        return None
    major, _, minor = info.compute_capability.partition(".")
    return GpuFacts(
        name=info.name, major=int(major), minor=int(minor or 0), multi_processor_count=info.sm_count,
        total_memory=round((info.memory_gib or 0) * 2**30),
        shared_memory_per_multiprocessor=round(info.shared_memory_per_sm_kib * 1024) if info.shared_memory_per_sm_kib else None,
        regs_per_multiprocessor=info.registers_per_sm,
        L2_cache_size=round(info.l2_cache_mib * 2**20) if info.l2_cache_mib else None,
    )
