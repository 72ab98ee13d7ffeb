"""Reproduce the K-Search paper's comparison: tasks × methods × seeds at one budget; tables and plots.

    python experiments/reproduce.py --config experiments/paper.yaml --out runs/paper
    python experiments/reproduce.py --task trimul --device cpu --methods ksearch evolve refine --seeds 1 --rounds 4 --out /tmp/rep
    python experiments/reproduce.py --config experiments/paper.yaml --out /shared/paper --ray-address http://head:8265

Every cell is a `ksearch run` in its own run directory (`--out/runs/...`); a cell already complete
is skipped and an unfinished one resumed, so the same command finishes an interrupted grid. Then
every run's best kernel, the task's baseline and the named reference solutions are evaluated side by
side on the check set (`all` where the task has it, else the runs' scoring set), and the script
writes under --out:

    evaluations.parquet   one row per evaluation of every run (ksearch_ray.analysis.runs)
    runs.parquet          one row per run, with its final check
    checks.parquet        one row per kernel of the final check (also checks.json)
    results.md            per task and method: best speedup, its check, rounds, dollars; then per run
    progress_<task>.png   best-so-far speedup against rounds, wall time and dollars, per method

`--no-report` stops after the runs and the check (a machine without polars, such as the lent GPU
machine); `--report-only` writes the Parquet, tables and plots later from what --out holds.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import polars as pl

try:
    import ksearch_ray  # noqa: F401  (installed: `pip install .`)
except ImportError:  # a checkout without an install: the package beside this folder
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ksearch_ray.studies.final_check import check_set, measure
from ksearch_ray.studies.grid import Cell, Grid
from ksearch_ray.studies.study import (
    arguments,
    fail,
    grid_from,
    provenance,
    run_grid,
    say,
    write_provenance,
)

CHECKS = "checks.json"


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    arguments(parser)
    parser.add_argument("--methods", nargs="+", help="Search methods: ksearch, evolve, refine (default: all three).")
    parser.add_argument("--widths", nargs="+", type=int, help="Search widths (default: 2).")
    parser.add_argument("--reference", action="append", default=[],
                        help="A solution to report and draw against: NAME (every task) or TASK=NAME; a name of the "
                             "task's solutions (e.g. flashinfer) or a solution directory or file. Repeatable.")
    parser.add_argument("--check-workloads", help="Set the best kernels are checked on (default: all, else the runs' scoring set).")
    parser.add_argument("--no-check", action="store_true", help="Skip the final check of the best kernels.")
    return parser.parse_args(argv)


def references_of(grid: Grid, flags: list[str]) -> dict[str, list[str]]:
    refs = {task: list(names) for task, names in grid.references.items()}
    for flag in flags:
        task, _, name = flag.rpartition("=")
        where = Path(name).expanduser()
        for t in [task] if task else grid.tasks:  # a path is made absolute: the check may run elsewhere
            refs.setdefault(t, []).append(str(where.resolve()) if where.exists() else name)
    return refs


def final_check(grid: Grid, cells: list[Cell], refs: dict[str, list[str]], args: argparse.Namespace) -> list[dict]:
    """The final check of every task, here (locally) or as a Ray job on a GPU node (cluster)."""
    from ksearch_ray.taskspec.task import find_task

    rows = []
    for task_name in grid.tasks:
        task_cells = [c for c in cells if c.task in (task_name, str(Path(task_name).resolve()))]
        if not task_cells:
            continue
        first = task_cells[0]
        device = first.setting("evaluation.device") or ("cuda" if _has_cuda() else "cpu")
        task_dirs = first.setting("task_dirs") or []
        task = find_task(first.task, task_dirs)
        bests = {c.name: c.run_dir(args.out.resolve()) for c in task_cells}
        wanted = args.check_workloads or grid.check_workloads
        scored = first.setting("evaluation.workloads") or task.definition.default_workloads or "benchmarks"
        request: dict[str, Any] = {"task": first.task, "task_dirs": task_dirs, "device": device,
                   "workloads": wanted, "line_workloads": scored, "bests": {k: str(v) for k, v in bests.items()},
                   "references": refs.get(task_name, []), "work_dir": str(args.out.resolve() / "sandbox")}
        say(f"{task.name}: final check on {check_set(task, wanted, scored)} ({len(bests)} best kernel(s), "
            f"{len(request['references'])} reference(s))")
        if args.ray_address:
            rows += _check_as_job(request, args, device)
        else:
            rows += measure(request["task"], request["task_dirs"], device, wanted, bests, request["references"],
                            Path(request["work_dir"]), say=say, line_workloads=request["line_workloads"])
    return rows


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _check_as_job(request: dict, args: argparse.Namespace, device: str) -> list[dict]:
    from ksearch_ray.studies.launch import JobLauncher
    from ksearch_ray.studies.study import checkout

    out = args.out.resolve() / "checks"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{Path(request['task']).name}.request.json"
    request = {**request, "output": str(out / f"{Path(request['task']).name}.json")}
    path.write_text(json.dumps(request, indent=1))
    jobs = JobLauncher(args.ray_address, args.out, say, working_dir=checkout())
    job = jobs.submit(["python", "-m", "ksearch_ray.studies.final_check", str(path)], gpus=1 if device == "cuda" else 0)
    code, logs = jobs.wait(job)
    (out / f"{Path(request['task']).name}.log").write_text(logs)
    if code != 0:
        fail(f"the final check of {request['task']} failed as Ray job {job} (log: {out})")
    return json.loads(Path(request["output"]).read_text())


def main(argv: list[str]) -> int:
    args = parse(argv)
    out = args.out.resolve()
    if not args.report_only:
        grid = grid_from(args, methods=args.methods or (None if args.config else ["ksearch", "evolve", "refine"]),
                         widths=args.widths, check_workloads=args.check_workloads)
        cells, _ = run_grid(grid, args)
        write_provenance(out, ["experiments/reproduce.py", *argv])
        if not any((c.run_dir(out) / "manifest.json").is_file() for c in cells):
            fail(f"no run directory was written; see the logs under {out / 'runs'}")
        if not args.no_check:
            (out / CHECKS).write_text(json.dumps(final_check(grid, cells, references_of(grid, args.reference), args), indent=1))
    if not args.no_report:
        report(out)
    return 0


def report(out: Path) -> None:
    """Parquet, results.md and the plots, from the run directories under `out` and the final check."""
    import polars as pl

    from ksearch_ray.analysis.records import find_runs
    from ksearch_ray.analysis.runs import read_runs

    run_dirs = find_runs(out / "runs")
    if not run_dirs:
        fail(f"no run directory under {out / 'runs'}")
    evals, runs = read_runs(run_dirs)
    rows = json.loads((out / CHECKS).read_text()) if (out / CHECKS).is_file() else []
    extra = sorted({k for r in rows for k in r if k.startswith("vs_")})
    schema = {"task": pl.Utf8, "role": pl.Utf8, "name": pl.Utf8, "run": pl.Utf8, "workloads": pl.Utf8, "status": pl.Utf8,
              "passed": pl.Boolean, "score": pl.Float64, "message": pl.Utf8, "speedup": pl.Float64,
              **{k: pl.Float64 for k in extra}}
    checks = pl.DataFrame(rows, schema=schema)
    bests = checks.filter((pl.col("role") == "best") & pl.col("run").is_not_null())
    if bests.height:
        runs = runs.join(bests.select("run", pl.col("status").alias("check_status"), pl.col("passed").alias("check_passed"),
                                      pl.col("speedup").alias("check_speedup"), *extra), on="run", how="left")
    evals.write_parquet(out / "evaluations.parquet")
    runs.write_parquet(out / "runs.parquet")
    checks.write_parquet(out / "checks.parquet")
    write_results(out, evals, runs, checks, [k.removeprefix("vs_") for k in extra],
                  ", ".join(bests["workloads"].unique().sort().to_list()) or None)


def write_results(out: Path, evals: pl.DataFrame, runs: pl.DataFrame, checks: pl.DataFrame, references: list[str],
                  check_name: str | None) -> None:
    import polars as pl

    from ksearch_ray.analysis.curves import Axis, curves, method_table
    from ksearch_ray.analysis.markdown import markdown, method_markdown, runs_markdown
    from ksearch_ray.analysis.plots import progress_figure

    parts = ["# Comparison of search methods\n", provenance(out),
             "Speedups are over the task's baseline measured on the same machine; `mean ± sd (runs)` over seeds. "
             "\"best speedup (search)\" is the best the run measured on its scoring set; the check columns "
             "evaluate each run's best kernel again, beside the baseline and the references, on the check set.\n",
             method_markdown(method_table(runs), references, check_name)]
    lines = checks.filter(pl.col("role") == "reference")
    if lines.height:
        parts += ["\n## Reference solutions\n", markdown(["task", "reference", "workloads", "status", "speedup over the baseline"], [
            [r["task"], r["name"], r["workloads"], r["status"] or "", f"{r['speedup']:.3g}x" if r["speedup"] else "—"]
            for r in lines.iter_rows(named=True)])]
    parts += ["\n## Runs\n", runs_markdown(runs, references, check_name)]
    if not evals.height:
        parts.append("\nNo candidate or seed was evaluated: nothing to plot (see the runs' logs).\n")
    for (task,), part in evals.group_by(["task"], maintain_order=True):
        axes: list[Axis] = ["round", "wall_s", *(["cost_usd"] if part["cost_usd"].max() else [])]  # type: ignore[list-item]
        data = {axis: curves(part, axis, ["method"]) for axis in axes}
        # Reference lines as measured on the set the searches scored on (else on the check set).
        mine = [r for r in lines.iter_rows(named=True) if r["task"] == task and r["speedup"]]
        scored = {r["workloads"] for r in mine} & set(part["workloads"].unique().to_list())
        refs = {f"{r['name']} ({r['workloads']})": r["speedup"] for r in mine if not scored or r["workloads"] in scored}
        path = progress_figure(data, "method", refs, f"{task}: best speedup so far (mean over seeds, band: min..max)",
                               out / f"progress_{task}.png")
        parts.append(f"\n![{task}]({path.name})\n")
        if "cost_usd" not in axes:
            parts.append("No LLM cost was spent (offline policy or a free model): no plot against dollars.\n")
    (out / "results.md").write_text("\n".join(parts))
    say(f"wrote {out / 'results.md'}, Parquet and plots under {out}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
