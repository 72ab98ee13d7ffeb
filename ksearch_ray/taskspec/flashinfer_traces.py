"""Evaluations as FlashInfer-Bench traces, and a FlashInfer-Bench dataset written from bundles.

`trace_records` is a pure function: one task, one solution's exported name, one EvalResult (and the
baseline's, for the reference latency) give the trace lines FlashInfer-Bench's `Trace` model reads,
one per workload. `write_dataset` lays definitions, workloads, solutions and traces out as the
package's `TraceSet.from_path` expects them:

    definitions/<op_type>/<definition>.json
    workloads/<op_type>/<definition>.jsonl      workload traces (solution and evaluation null)
    solutions/<op_type>/<definition>/<name>.json
    traces/<op_type>/<definition>.jsonl
    blob/workloads/<op_type>/<definition>/<definition>_<uuid>.safetensors   blob inputs (`_with_blobs`)

Where ksearch-ray's verdicts have no FlashInfer-Bench status (CRASHED, INTEGRITY_VIOLATION), the
trace says RUNTIME_ERROR and its log names the original status. A workload that passed without
being timed (a correctness-only evaluation) has no trace: the package requires a latency for every
PASSED trace, and 0 ms would be a lie. A candidate that failed before its first workload (a
build) gets its status on every workload of the set, as the package's own benchmark does.
`latency_ms` is the call figure (what the package's own benchmark times, whatever the run's
objective), with the graph-replayed `kernel_ms` beside it where there is one.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

from safetensors.torch import save_file

from ksearch_ray.models import EvalResult, Solution, Status, WorkloadResult
from ksearch_ray.taskspec.flashinfer_format import (
    FIB_STATUSES,
    bundle_definition,
    solution_to_json,
    workload_to_trace,
)
from ksearch_ray.taskspec.flashinfer_inputs import SynthesisError, drawn_inputs
from ksearch_ray.taskspec.spec import TaskError, Workload
from ksearch_ray.taskspec.task import Task

BLOB_SEED = 0
"""The seed of the page tables (and MoE routing) an export writes as its workloads' blobs."""


@dataclass(frozen=True)
class Environment:
    """Where an evaluation ran: FlashInfer-Bench's Environment (hardware, library versions)."""

    hardware: str
    libs: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Evaluated:
    """One evaluation of a run, as the traces export needs it (read from the run's records)."""

    kind: str  # "evaluation", "seed" or "baseline"
    solution: Solution
    result: EvalResult
    time: float  # seconds since the epoch, when it was recorded


def _status(status: Status) -> str:
    return status.value if status.value in FIB_STATUSES else "RUNTIME_ERROR"


def _error(value: float | None) -> float:
    # None: not measured (the package accepts NaN there); an inf error stays inf.
    return math.nan if value is None else abs(float(value))


def _evaluation(wr: WorkloadResult, result: EvalResult, reference_ms: float | None,
                env: Environment, timestamp: str) -> dict[str, Any] | None:
    status = _status(wr.status)
    log = wr.message or result.message
    if status != wr.status.value:
        log = f"ksearch-ray status {wr.status.value}: {log}"
    evaluation: dict[str, Any] = {"status": status, "environment": {"hardware": env.hardware or "unknown", "libs": env.libs},
                                  "timestamp": timestamp, "log": log}
    if status in ("PASSED", "INCORRECT_NUMERICAL"):
        evaluation["correctness"] = {"max_relative_error": _error(wr.max_rel_error),
                                     "max_absolute_error": _error(wr.max_abs_error)}
    if status == "PASSED":
        latency = _call_ms(wr)
        if latency is None:
            return None
        performance: dict[str, float] = {"latency_ms": latency}
        if reference_ms and latency > 0:  # no baseline timing for this workload: nothing to compare, no 0 written
            performance |= {"reference_latency_ms": reference_ms, "speedup_factor": reference_ms / latency}
        if wr.kernel_ms is not None:  # beside it (the package ignores keys it does not know)
            performance["kernel_ms"] = wr.kernel_ms
        evaluation["performance"] = performance
    return evaluation


def _call_ms(wr: WorkloadResult) -> float | None:
    """FlashInfer-Bench's latency is the call's (events around one run() call): the call figure, whatever
    the objective; a record from before both figures existed has its one figure."""
    if wr.call_timing is not None:
        return wr.call_timing.mean_ms
    return wr.timing.mean_ms if wr.timing else None


def trace_records(task: Task, solution_name: str, result: EvalResult, *, baseline: EvalResult | None = None,
                  environment: Environment, when: float, is_reference: bool = False) -> list[dict[str, Any]]:
    """The FlashInfer-Bench trace lines of one evaluation (see the module's docstring for the rules)."""
    workloads = {w.name: w for w in task.workloads(result.workload_set, result.device)}
    # The baseline's own traces compare it with itself: its reference latency is its latency (speedup 1).
    reference = {w.workload: ms for w in (baseline or result).workloads if (ms := _call_ms(w)) is not None} \
        if baseline is not None or is_reference else {}
    timestamp = datetime.fromtimestamp(when, UTC).isoformat()
    results = list(result.workloads)
    if not results and not result.passed:  # failed before any workload ran: the verdict holds for all
        results = [WorkloadResult(workload=name, status=result.status, message=result.message) for name in workloads]
    out = []
    for wr in results:
        workload = workloads.get(wr.workload)
        if workload is None:
            raise TaskError(f"task {task.name} has no workload {wr.workload} in set {result.workload_set}")
        evaluation = _evaluation(wr, result, reference.get(wr.workload), environment, timestamp)
        if evaluation is None:
            continue
        out.append({**workload_to_trace(task.name, workload), "solution": solution_name, "evaluation": evaluation})
    return out


def _write_json(path: Path, payload: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, allow_nan=False) + "\n")


def _jsonl(records: Iterable[Mapping[str, Any]]) -> str:
    # The package writes NaN errors as the string "NaN" (ser_json_inf_nan="strings") and reads them back.
    def fix(value: Any) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
        if isinstance(value, dict):
            return {k: fix(v) for k, v in value.items()}
        return value

    return "".join(json.dumps(fix(dict(r)), allow_nan=False) + "\n" for r in records)


def _with_blobs(out: Path, definition: Mapping[str, Any], workload: Workload) -> dict[str, Any]:
    """A workload trace whose safetensors inputs are files inside `out`. The blobs FlashInfer-Bench
    recorded are not shipped, and ksearch-ray never reads them: every evaluation draws its own page
    tables (or MoE routing) from its seed. The export writes the draw for BLOB_SEED, laid out as the
    package lays out its own blobs, so the dataset needs nothing outside its directory."""
    trace = workload_to_trace(definition["name"], workload)
    inputs = trace["workload"]["inputs"]
    names = {name for name, spec in inputs.items() if spec.get("type") == "safetensors"}
    if not names:
        return trace
    try:
        tensors = drawn_inputs(definition, workload, names, BLOB_SEED)
    except SynthesisError as exc:
        raise TaskError(f"workload {workload.name} of {definition['name']}: cannot write its blob inputs: {exc}") from None
    rel = PurePosixPath("blob", "workloads", definition["op_type"], definition["name"],
                        f"{definition['name']}_{workload.name}.safetensors")
    (out / rel).parent.mkdir(parents=True, exist_ok=True)
    save_file({name: t.contiguous() for name, t in sorted(tensors.items())}, str(out / rel))
    for name in names:
        inputs[name] = {"type": "safetensors", "path": f"./{rel}", "tensor_key": name}
    return trace


def write_dataset(out: Path, tasks: Iterable[Task], *, solutions: Iterable[tuple[Task, Solution]] = (),
                  evaluated: Iterable[tuple[Task, Evaluated]] = (), environment: Environment | None = None,
                  target_hardware: str | list[str] = "cuda") -> dict[str, int]:
    """Write a FlashInfer-Bench dataset under `out`: each task's definition and workloads, the given
    solutions, and the evaluations as traces (with the run's baseline as the reference latency).
    Returns how many of each were written. Refuses a directory that already holds a dataset."""
    out = Path(out)
    evaluated = list(evaluated)
    if out.exists() and any(out.iterdir()):
        raise TaskError(f"{out} is not empty; give a new directory for the dataset")
    env = environment or Environment(hardware="unknown")
    counts = {"definitions": 0, "workloads": 0, "solutions": 0, "traces": 0}
    op_types: dict[str, str] = {}
    by_name: dict[str, Task] = {}
    exported: dict[str, dict[str, dict[str, Any]]] = {}  # task -> workload name -> its workload trace, as written
    for task in tasks:
        definition = bundle_definition(task.root)
        op_types[task.name] = op = definition["op_type"]
        by_name[task.name] = task
        _write_json(out / "definitions" / op / f"{task.name}.json", definition)
        seen: dict[str, Workload] = {}
        for set_name in task.definition.workload_sets:
            if not set_name.endswith("-cpu"):  # the reduced CPU sets are ksearch-ray's, not the definition's
                for w in task.workloads(set_name, "cuda"):
                    seen.setdefault(w.name, w)
        # ... unless a trace names them (a run on the CPU): every workload a trace names is in the dataset.
        for other, ev in evaluated:
            if other.name == task.name:
                for w in task.workloads(ev.result.workload_set, ev.result.device):
                    seen.setdefault(w.name, w)
        exported[task.name] = {name: _with_blobs(out, definition, w) for name, w in seen.items()}
        (out / "workloads" / op).mkdir(parents=True, exist_ok=True)
        (out / "workloads" / op / f"{task.name}.jsonl").write_text(_jsonl(exported[task.name].values()))
        counts["definitions"] += 1
        counts["workloads"] += len(seen)

    written: dict[str, str] = {}  # exported name -> solution id: a name is written once
    def put(task: Task, solution: Solution) -> str:
        if task.name not in by_name:
            raise TaskError(f"solution {solution.name} is for task {task.name}, which is not in the dataset")
        payload = solution_to_json(solution, task, target_hardware=target_hardware)
        name = payload["name"]
        if written.get(name, solution.id) != solution.id:
            raise TaskError(f"two different solutions would both be named {name}")
        if name not in written:
            _write_json(out / "solutions" / op_types[task.name] / task.name / f"{name}.json", payload)
            written[name] = solution.id
            counts["solutions"] += 1
        return name

    for task, solution in solutions:
        put(task, solution)
    baselines = {task.name: ev.result for task, ev in evaluated if ev.kind == "baseline"}
    traces: dict[str, list[dict[str, Any]]] = {}
    for task, ev in evaluated:
        name = put(task, ev.solution)
        base = None if ev.kind == "baseline" else baselines.get(task.name)
        lines = trace_records(task, name, ev.result, baseline=base, environment=env, when=ev.time,
                              is_reference=ev.kind == "baseline")
        for line in lines:  # a trace's workload is the one written, blob paths and all
            line["workload"] = exported[task.name][line["workload"]["uuid"]]["workload"]
        traces.setdefault(task.name, []).extend(lines)
    for task_name, lines in traces.items():
        path = out / "traces" / op_types[task_name] / f"{task_name}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(_jsonl(lines))
        counts["traces"] += len(lines)
    return counts
