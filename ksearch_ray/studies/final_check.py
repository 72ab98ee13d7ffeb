"""The final check of an experiment: every run's best kernel, the task's baseline and the named
reference solutions, evaluated side by side in one sandbox on one machine, on the check set
(`all` where the task has it, else the set the runs scored on). A kernel that several runs found
is measured once.

A best's speedup over the baseline and over each reference is the ratio of scores measured here,
in this one session: never a number carried over from a search on another machine.

On a cluster it runs as a Ray job on a GPU node: `python -m ksearch_ray.studies.final_check REQUEST.json`
reads what to measure and writes the rows to the request's `output` path.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ksearch_ray.evaluation.scoring import speedup as ratio
from ksearch_ray.models import EvalResult, Solution
from ksearch_ray.taskspec.spec import TaskError
from ksearch_ray.taskspec.task import Task, find_task, solution_from_file
from ksearch_ray.text import clip


def check_set(task: Task, wanted: str, scored: str | None = None) -> str:
    """`wanted` where the task has it, else the set the runs scored on, else the task's default."""
    if wanted in task.definition.workload_sets:
        return wanted
    return scored or task.definition.default_workloads or "benchmarks"


def reference_label(reference: str) -> str:
    """How a reference is named in tables and columns: its solution name, or its path's last part."""
    return Path(reference).name.replace(".", "_").replace("-", "_")


def _reference(task: Task, name: str) -> Solution:
    if name in task.solution_names(include_unavailable=True):
        return task.solution(name)  # a TaskError names a module it needs that is not installed
    if Path(name).exists():
        return solution_from_file(Path(name), task)
    raise TaskError(f"no solution of {task.name} or file named {name}")


def measure(task_name: str, task_dirs: list[str], device: str, wanted: str, bests: dict[str, Path],
            references: list[str], work_dir: Path, say: Callable[[str], None] = lambda _t: None,
            line_workloads: str | None = None) -> list[dict[str, Any]]:
    """One row per kernel: role (baseline, reference, best), name, run, workloads, status, speedups.

    With `line_workloads` (the set the searches scored on) the baseline and the references are also
    measured on that set: their lines in the progress plots compare with the searches' own numbers."""
    from ksearch_ray.config import EvaluationConfig
    from ksearch_ray.run.evaluators import build_evaluator

    task = find_task(task_name, task_dirs)
    workloads = check_set(task, wanted, line_workloads)
    rows: list[dict[str, Any]] = []

    def row(role: str, name: str, run: str | None, result: EvalResult | None, status: str | None = None,
            message: str = "", on: str = workloads, speedup: float | None = None,
            vs: dict[str, float | None] | None = None) -> dict[str, Any]:
        out = {"task": task.name, "role": role, "name": name, "run": run, "workloads": task.workload_set_name(on, device),
               "status": result.status.value if result else status, "passed": bool(result and result.passed),
               "score": result.score if result and result.passed else None, "message": clip(result.message if result else message, 300),
               "speedup": speedup, **(vs or {})}
        rows.append(out)
        return out

    with build_evaluator(EvaluationConfig(), device, work_dir) as evaluator:
        def evaluate(solution: Solution, on: str = workloads) -> EvalResult:
            say(f"{task.name}: checking {solution.name} on {on}")
            return evaluator.evaluate(task, solution, workload_set=on)

        solutions: dict[str, Solution] = {}
        for reference in references:
            try:
                solutions[reference_label(reference)] = _reference(task, reference)
            except TaskError as exc:
                say(f"{task.name}: reference {reference} left out: {exc}")
                row("reference", reference_label(reference), None, None, status="UNAVAILABLE", message=str(exc))
        if line_workloads and line_workloads != workloads:
            line_base = evaluate(task.baseline(), line_workloads)
            row("baseline", task.definition.baseline, None, line_base, on=line_workloads, speedup=1.0 if line_base.passed else None)
            for label, solution in solutions.items():
                result = evaluate(solution, line_workloads)
                row("reference", label, None, result, on=line_workloads, speedup=ratio(task.definition, line_base, result))
        base = evaluate(task.baseline())
        row("baseline", task.definition.baseline, None, base, speedup=1.0 if base.passed else None)
        refs: dict[str, EvalResult] = {}
        for label, solution in solutions.items():
            refs[label] = evaluate(solution)
            row("reference", label, None, refs[label], speedup=ratio(task.definition, base, refs[label]))
        measured: dict[str, EvalResult] = {}  # runs that found the same kernel share one measurement of it
        for run, run_dir in sorted(bests.items()):
            best_file = run_dir / "best.json"
            if not best_file.is_file():
                row("best", run, run, None, status="NO_BEST", message="the run has no best kernel")
                continue
            solution = Solution.model_validate(json.loads(best_file.read_text())["solution"])
            if solution.id not in measured:
                measured[solution.id] = evaluate(solution)
            result = measured[solution.id]
            row("best", solution.name, run, result, speedup=ratio(task.definition, base, result),
                vs={f"vs_{label}": ratio(task.definition, ref, result) for label, ref in refs.items()})
    return rows


def main(argv: list[str]) -> int:
    request = json.loads(Path(argv[0]).read_text())
    rows = measure(request["task"], request["task_dirs"], request["device"], request["workloads"],
                   {k: Path(v) for k, v in request["bests"].items()}, request["references"], Path(request["work_dir"]),
                   say=lambda text: print(text, flush=True), line_workloads=request.get("line_workloads"))
    Path(request["output"]).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
