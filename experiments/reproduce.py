"""Reproduce the K-Search paper's comparison: tasks × methods × seeds at one budget; tables and plots.

    python experiments/reproduce.py --config experiments/paper.yaml --out runs/paper
    python experiments/reproduce.py --task trimul --device cpu --methods ksearch evolve refine --seeds 1 --rounds 4 --out /tmp/rep
    python experiments/reproduce.py --config experiments/paper.yaml --out /shared/paper --ray-address http://head:8265

Every cell is a `ksearch run` in its own run directory (`--out/runs/...`); a cell already complete
is skipped and an unfinished one resumed, so the same command finishes an interrupted grid. Then
every run's best kernel, the task's baseline and the named reference solutions are evaluated side by
side on the check set (`all` where the task has it), and the script writes under --out:

    evaluations.parquet   one row per evaluation of every run (ksearch_ray.analysis.runs)
    runs.parquet          one row per run, with its final check
    checks.parquet        one row per kernel of the final check
    results.md            per task and method: best speedup, its check, rounds, dollars; then per run
    progress_<task>.png   best-so-far speedup against rounds, wall time and dollars, per method
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

try:
    import ksearch_ray  # noqa: F401  (installed: `pip install .`)
except ImportError:  # a checkout without an install: the package beside this folder
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import polars as pl

from ksearch_ray.analysis.plots import progress_figure
from ksearch_ray.analysis.runs import read_runs
from ksearch_ray.analysis.summary import curves, method_table
from ksearch_ray.analysis.tables import markdown, method_markdown, runs_markdown
from ksearch_ray.experiments.driver import arguments, fail, grid_from, provenance, run_grid, say
from ksearch_ray.experiments.grid import Cell, Grid
from ksearch_ray.experiments.measure import check_set, measure, reference_label

CHECK_SCHEMA = {"task": pl.Utf8, "role": pl.Utf8, "name": pl.Utf8, "run": pl.Utf8, "workloads": pl.Utf8, "status": pl.Utf8,
                "passed": pl.Boolean, "score": pl.Float64, "message": pl.Utf8, "speedup": pl.Float64}


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    arguments(parser)
    parser.add_argument("--methods", nargs="+", help="Search methods: ksearch, evolve, refine (default: all three).")
    parser.add_argument("--widths", nargs="+", type=int, help="Search widths (default: 2).")
    parser.add_argument("--reference", action="append", default=[],
                        help="A solution to report and draw against: NAME (every task) or TASK=NAME; a name of the "
                             "task's solutions (e.g. flashinfer) or a solution directory or file. Repeatable.")
    parser.add_argument("--check-workloads", help="Set the best kernels are checked on (default: all, else the task's default).")
    parser.add_argument("--no-check", action="store_true", help="Skip the final check of the best kernels.")
    return parser.parse_args(argv)


def references_of(grid: Grid, flags: list[str]) -> dict[str, list[str]]:
    refs = {task: list(names) for task, names in grid.references.items()}
    for flag in flags:
        task, _, name = flag.rpartition("=")
        for t in [task] if task else grid.tasks:
            refs.setdefault(t, []).append(name)
    return refs


def final_check(grid: Grid, cells: list[Cell], refs: dict[str, list[str]], args: argparse.Namespace) -> pl.DataFrame:
    """The final check of every task, here (locally) or as a Ray job on a GPU node (cluster)."""
    from ksearch_ray.taskspec.task import find_task

    rows = []
    for task_name in grid.tasks:
        task_cells = [c for c in cells if c.task in (task_name, str(Path(task_name).resolve()))]
        if not task_cells:
            continue
        settings = task_cells[0].settings
        device = settings.get("device") or ("cuda" if _has_cuda() else "cpu")
        task = find_task(task_cells[0].task, settings.get("task_dirs") or [])
        bests = {c.name: c.run_dir(args.out.resolve()) for c in task_cells}
        wanted = args.check_workloads or grid.check_workloads
        lines = [settings.get("workloads") or task.definition.default_workloads or "benchmarks"]
        request = {"task": task_cells[0].task, "task_dirs": settings.get("task_dirs") or [], "device": device,
                   "workloads": wanted, "line_workloads": lines[0], "bests": {k: str(v) for k, v in bests.items()},
                   "references": refs.get(task_name, []), "work_dir": str(args.out.resolve() / "sandbox")}
        say(f"{task.name}: final check on {check_set(task, wanted, lines[0])} ({len(bests)} best kernel(s), "
            f"{len(request['references'])} reference(s))")
        if args.ray_address:
            rows += _check_as_job(request, args, device)
        else:
            rows += measure(request["task"], request["task_dirs"], device, wanted, bests, request["references"],
                            Path(request["work_dir"]), say=say, line_workloads=request["line_workloads"])
    extra = sorted({k for r in rows for k in r if k.startswith("vs_")})
    return pl.DataFrame(rows, schema={**CHECK_SCHEMA, **{k: pl.Float64 for k in extra}})


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _check_as_job(request: dict, args: argparse.Namespace, device: str) -> list[dict]:
    from ksearch_ray.experiments.driver import checkout
    from ksearch_ray.experiments.launch import JobLauncher

    out = args.out.resolve() / "checks"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{Path(request['task']).name}.request.json"
    request = {**request, "output": str(out / f"{Path(request['task']).name}.json")}
    path.write_text(json.dumps(request, indent=1))
    jobs = JobLauncher(args.ray_address, args.out, say, working_dir=checkout())
    job = jobs.submit(["python", "-m", "ksearch_ray.experiments.measure", str(path)], gpus=1 if device == "cuda" else 0)
    code, logs = jobs.wait(job)
    (out / f"{Path(request['task']).name}.log").write_text(logs)
    if code != 0:
        fail(f"the final check of {request['task']} failed as Ray job {job} (log: {out})")
    return json.loads(Path(request["output"]).read_text())


def with_checks(runs: pl.DataFrame, checks: pl.DataFrame) -> pl.DataFrame:
    """The run rows with their best's check: check_status, check_passed, check_speedup, vs_<reference>."""
    bests = checks.filter((pl.col("role") == "best") & pl.col("run").is_not_null())
    vs = [c for c in bests.columns if c.startswith("vs_")]
    bests = bests.select("run", pl.col("status").alias("check_status"), pl.col("passed").alias("check_passed"),
                         pl.col("speedup").alias("check_speedup"), *vs)
    return runs.join(bests, on="run", how="left")


def main(argv: list[str]) -> int:
    args = parse(argv)
    grid = grid_from(args, methods=args.methods or (None if args.config else ["ksearch", "evolve", "refine"]),
                     widths=args.widths, check_workloads=args.check_workloads)
    cells, _ = run_grid(grid, args)
    run_dirs = [c.run_dir(args.out.resolve()) for c in cells if (c.run_dir(args.out.resolve()) / "manifest.json").is_file()]
    if not run_dirs:
        fail("no run directory was written; see the logs under " + str(args.out / "runs"))
    evals, runs = read_runs(run_dirs)
    refs = references_of(grid, args.reference)
    labels = {task: [reference_label(r) for r in names] for task, names in refs.items()}
    check_name = None
    if not args.no_check:
        checks = final_check(grid, cells, refs, args)
        checks.write_parquet(args.out / "checks.parquet")
        runs = with_checks(runs, checks)
        checked = checks.filter(pl.col("role") == "best")["workloads"].unique().sort().to_list()
        check_name = ", ".join(checked) or (args.check_workloads or grid.check_workloads)
    else:
        checks = pl.DataFrame(schema=CHECK_SCHEMA)
    evals.write_parquet(args.out / "evaluations.parquet")
    runs.write_parquet(args.out / "runs.parquet")
    write_results(args, argv, evals, runs, checks, labels, check_name)
    return 0


def write_results(args: argparse.Namespace, argv: list[str], evals: pl.DataFrame, runs: pl.DataFrame, checks: pl.DataFrame,
                  labels: dict[str, list[str]], check_name: str | None) -> None:
    all_refs = sorted({name for names in labels.values() for name in names})
    parts = ["# Comparison of search methods\n", provenance(["experiments/reproduce.py", *argv]),
             "Speedups are over the task's baseline measured on the same machine; `mean ± sd (runs)` over seeds. "
             "\"best speedup (search)\" is the best the run measured on its scoring set; the check columns "
             "evaluate each run's best kernel again, beside the baseline and the references, on the check set.\n",
             method_markdown(method_table(runs), all_refs, check_name)]
    lines = checks.filter(pl.col("role") == "reference") if checks.height else checks
    if lines.height:
        parts += ["\n## Reference solutions\n", markdown(["task", "reference", "workloads", "status", "speedup over the baseline"], [
            [r["task"], r["name"], r["workloads"], r["status"] or "", f"{r['speedup']:.3g}x" if r["speedup"] else "—"]
            for r in lines.iter_rows(named=True)])]
    parts += ["\n## Runs\n", runs_markdown(runs, all_refs, check_name)]
    for (task,), part in evals.group_by(["task"], maintain_order=True):
        axes = ["round", "wall_s"] + (["cost_usd"] if part["cost_usd"].max() else [])
        data = {axis: curves(part, axis, ["method"]) for axis in axes}  # type: ignore[arg-type]
        # Reference lines as measured on the set the searches scored on (else on the check set).
        mine = [r for r in lines.iter_rows(named=True) if r["task"] == task and r["speedup"]] if lines.height else []
        scored = {r["workloads"] for r in mine} & set(part["workloads"].unique().to_list()) if mine else set()
        refs = {f"{r['name']} ({r['workloads']})": r["speedup"] for r in mine if not scored or r["workloads"] in scored}
        path = progress_figure(data, "method", refs, f"{task}: best speedup so far (mean over seeds, band: min..max)",
                               args.out / f"progress_{task}.png")
        parts.append(f"\n![{task}]({path.name})\n")
        if "cost_usd" not in axes:
            parts.append("No LLM cost was spent (offline policy or a free model): no plot against dollars.\n")
    (args.out / "results.md").write_text("\n".join(parts))
    say(f"wrote {args.out / 'results.md'}, Parquet and plots under {args.out}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
