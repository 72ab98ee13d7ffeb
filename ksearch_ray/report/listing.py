"""`ksearch tasks`: the task bundles that can be found, as records (printed, or as JSON)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field

from ksearch_ray.taskspec.spec import TaskError
from ksearch_ray.taskspec.task import discover, find_task


class WorkloadSetEntry(BaseModel):
    name: str = Field(description="The set's name, as --workloads takes it.")
    resolved: str = Field(description="The set that runs on the listed device (on the CPU, X-cpu where the bundle has one).")
    workloads: int = Field(description="Workloads in the resolved set.")
    default: bool = Field(default=False, description="The set that scores candidates unless --workloads names another.")


class SolutionEntry(BaseModel):
    name: str
    missing: list[str] = Field(default_factory=list, description="Modules it needs that are not installed here.")
    role: str | None = Field(default=None, description="'baseline' (scores compare against it) or 'default seed' "
                                                       "(task.json's default_seed: where runs start).")


class TaskEntry(BaseModel):
    name: str
    path: str = Field(description="The bundle's directory.")
    workload_sets: list[WorkloadSetEntry] = Field(default_factory=list)
    solutions: list[SolutionEntry] = Field(default_factory=list)
    error: str | None = Field(default=None, description="Why the bundle cannot be loaded, if it cannot.")


def list_tasks(dirs: list[str], device: str) -> list[TaskEntry]:
    """Every bundle found (in search order), with the workload sets as they resolve on `device`."""
    entries = []
    for name, root in sorted(discover(dirs).items()):
        entries.append(_entry(name, Path(root), device))
    return entries


def _entry(name: str, root: Path, device: str) -> TaskEntry:
    try:
        task = find_task(str(root))
        sets = [
            WorkloadSetEntry(name=s, resolved=task.workload_set_name(s, device), workloads=len(task.workloads(s, device)),
                             default=s == task.definition.default_workloads)
            for s in task.definition.workload_sets
            if not (s.endswith("-cpu") and s.removesuffix("-cpu") in task.definition.workload_sets)  # twins resolve themselves
        ]
        roles = {task.definition.baseline: "baseline"}
        if task.definition.default_seed:
            roles[task.definition.default_seed] = "default seed"
        sols = [SolutionEntry(name=s, missing=task.missing_requirements(s), role=roles.get(s))
                for s in task.solution_names(include_unavailable=True)]
    except TaskError as exc:
        return TaskEntry(name=name, path=str(root), error=str(exc))
    return TaskEntry(name=name, path=str(root), workload_sets=sets, solutions=sols)
