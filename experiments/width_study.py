"""How search width changes a search: widths × seeds at one budget; tables and plots.

    python experiments/width_study.py --task trimul --device cpu --widths 1 2 --seeds 2 --rounds 4 --out /tmp/ws
    python experiments/width_study.py --task trimul --widths 1 2 4 8 16 32 --seeds 3 --rounds 64 --out runs/width
    python experiments/width_study.py --config my_widths.yaml --out /shared/width --ray-address http://head:8265

Every cell is a `ksearch run` (the K-Search method unless --method says otherwise) in its own run
directory under --out/runs; complete cells are skipped and unfinished ones resumed. Per width, over
the seeds: the best speedup, the rounds and wall time until the best first reached the target speedup
(--target-speedup; default: the median of the runs' final bests, so about half the runs reach it),
evaluations per minute of search, the evaluators' busy share and the failure rate (failed
evaluations and candidates without code, over all candidates). Writes under --out:

    evaluations.parquet, runs.parquet    ksearch_ray.analysis.runs' frames
    width.parquet, width.md              the table per width
    width_<task>.png                     the table's numbers against the width
    progress_<task>.png                  best-so-far speedup against rounds and wall time, per width

`--no-report` stops after the runs (a machine without polars, such as the lent GPU machine);
`--report-only` writes the Parquet, tables and plots later from what --out holds.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

try:
    import ksearch_ray  # noqa: F401  (installed: `pip install .`)
except ImportError:  # a checkout without an install: the package beside this folder
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import json
from typing import Any

from ksearch_ray.studies.study import (
    arguments,
    fail,
    grid_from,
    provenance,
    run_grid,
    say,
    write_provenance,
)

STUDY = "study.json"


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    arguments(parser)
    parser.add_argument("--widths", nargs="+", type=int, help="Search widths (default: 1 2 4 8).")
    parser.add_argument("--method", help="Search method (default: ksearch).")
    parser.add_argument("--target-speedup", type=float, help="The speedup whose rounds and time to reach are reported.")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse(argv)
    out = args.out.resolve()
    if not args.report_only:
        grid = grid_from(args, widths=args.widths or (None if args.config else [1, 2, 4, 8]),
                         methods=[args.method] if args.method else None, target_speedup=args.target_speedup)
        cells, _ = run_grid(grid, args)
        write_provenance(out, ["experiments/width_study.py", *argv])
        if not any((c.run_dir(out) / "manifest.json").is_file() for c in cells):
            fail(f"no run directory was written; see the logs under {out / 'runs'}")
        (out / STUDY).write_text(json.dumps({"target_speedup": grid.target_speedup, "rounds": grid.rounds,
                                             "max_cost_usd": grid.max_cost_usd}))
    if not args.no_report:
        report(out, args.target_speedup)
    return 0


def report(out: Path, target_flag: float | None) -> None:
    """Parquet, width.md and the plots, from the run directories under `out`."""
    import polars as pl

    from ksearch_ray.analysis.curves import curves, width_table
    from ksearch_ray.analysis.markdown import width_markdown
    from ksearch_ray.analysis.plots import progress_figure, width_figure
    from ksearch_ray.analysis.records import find_runs
    from ksearch_ray.analysis.runs import read_runs

    study: dict[str, Any] = json.loads((out / STUDY).read_text()) if (out / STUDY).is_file() else {}
    run_dirs = find_runs(out / "runs")
    if not run_dirs:
        fail(f"no run directory under {out / 'runs'}")
    evals, runs = read_runs(run_dirs)
    finals = runs["best_speedup"].drop_nulls()
    given = target_flag or study.get("target_speedup")
    target = given or (float(finals.median()) if len(finals) else None)  # type: ignore[arg-type]
    if target is None:
        fail("no run measured a speedup: nothing to study (see runs.parquet and the logs)")
    table = width_table(runs, evals, target)
    evals.write_parquet(out / "evaluations.parquet")
    runs.write_parquet(out / "runs.parquet")
    table.write_parquet(out / "width.parquet")
    budget = f"{study.get('rounds') or '-'} rounds" + (f" / ${study['max_cost_usd']}" if study.get("max_cost_usd") else "")
    parts = ["# Search width study\n", provenance(out),
             f"Each row: one width, `mean ± sd (runs)` over seeds, at a budget of {budget} per run. Speedups are over "
             "the task's baseline measured on the same machine. Target speedup: "
             + (f"{target:.3g}x (given)" if given else f"{target:.3g}x (the median of the runs' final bests)")
             + ". Evaluations per minute count the search phase (first candidate to last evaluation); the busy share "
             "is the evaluators' time spent evaluating over the sessions' wall time, per evaluator; the failure rate "
             "counts failed evaluations and candidates without code over all candidates.\n", width_markdown(table)]
    for (task,), part in evals.group_by(["task"], maintain_order=True):
        data = {axis: curves(part, axis, ["width"]) for axis in ("round", "wall_s")}
        progress = progress_figure(data, "width", {}, f"{task}: best speedup so far per width (mean over seeds, band: min..max)",
                                   out / f"progress_{task}.png")
        numbers = width_figure(table.filter(pl.col("task") == task), f"{task}: search width", out / f"width_{task}.png")
        parts.append(f"\n![{task} width]({numbers.name})\n\n![{task} progress]({progress.name})\n")
    (out / "width.md").write_text("\n".join(parts))
    say(f"wrote {out / 'width.md'}, Parquet and plots under {out}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
