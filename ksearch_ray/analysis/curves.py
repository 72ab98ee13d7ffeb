"""From the frames of `runs.py` to what experiments report: progress curves over seeds, when a
target speedup was reached, and per-group statistics.

Spread over seeds is min..max (with few repetitions a standard deviation says little); tables
give the mean, the standard deviation and the count beside it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import polars as pl

Axis = Literal["round", "wall_s", "cost_usd"]
GRID_POINTS = 120


def _running_best(run: pl.DataFrame, x: Axis) -> tuple[np.ndarray, np.ndarray]:
    """(x, best speedup so far) of one run, x ascending. By round: the best of the candidates of that
    round and earlier (lanes finish out of order); by time or dollars: as the run saw it."""
    rows = run.sort(x if x == "round" else "wall_s", maintain_order=True)
    xs = rows[x].to_numpy().astype(float)
    speedups = rows["speedup"].fill_null(-np.inf).to_numpy().astype(float)
    best = np.maximum.accumulate(speedups) if len(speedups) else speedups
    best[np.isinf(best)] = np.nan
    return xs, best


def _step_at(xs: np.ndarray, ys: np.ndarray, grid: np.ndarray) -> np.ndarray:
    idx = np.searchsorted(xs, grid, side="right") - 1
    return np.where(idx >= 0, ys[np.clip(idx, 0, None)], np.nan)


def curves(evals: pl.DataFrame, x: Axis, by: Sequence[str]) -> pl.DataFrame:
    """Best-so-far speedup on a common x grid per group: mean, min and max over the group's runs
    (a run counts from its first point on)."""
    rows: list[dict[str, object]] = []
    for key, group in evals.group_by(list(by), maintain_order=True):
        runs = [g for _, g in group.group_by("run", maintain_order=True)]
        top = float(group[x].max() or 0.0)  # type: ignore[arg-type]
        grid = np.arange(0, int(top) + 1, dtype=float) if x == "round" else np.linspace(0.0, top, GRID_POINTS)
        values = np.vstack([_step_at(*_running_best(run, x), grid) for run in runs])
        for i, point in enumerate(grid):
            column = values[:, i]
            present = column[~np.isnan(column)]
            if len(present) == 0:
                continue
            rows.append({**dict(zip(by, key, strict=True)), x: float(point), "mean": float(present.mean()),
                         "lo": float(present.min()), "hi": float(present.max()), "runs": len(present)})
    schema: dict[str, Any] = {**{b: evals.schema[b] for b in by}, x: pl.Float64, "mean": pl.Float64, "lo": pl.Float64, "hi": pl.Float64,
              "runs": pl.Int64}
    return pl.DataFrame(rows, schema=schema)


def reach(evals: pl.DataFrame, target: float) -> pl.DataFrame:
    """Per run: the first round, and the first active second, at which the best reached `target`."""
    rows = []
    for (run,), group in evals.group_by(["run"], maintain_order=True):
        out: dict[str, object] = {"run": run}
        for x, column in (("round", "rounds_to_target"), ("wall_s", "wall_s_to_target")):
            xs, best = _running_best(group, x)  # type: ignore[arg-type]
            hit = np.nonzero(np.nan_to_num(best, nan=-np.inf) >= target)[0]
            out[column] = float(xs[hit[0]]) if len(hit) else None
        rows.append(out)
    return pl.DataFrame(rows, schema={"run": pl.Utf8, "rounds_to_target": pl.Float64, "wall_s_to_target": pl.Float64})


def stats(column: str) -> list[pl.Expr]:
    """mean, sd, min, max and count of a column, named `<column>_<stat>`."""
    c = pl.col(column)
    return [c.mean().alias(f"{column}_mean"), c.std().alias(f"{column}_sd"), c.min().alias(f"{column}_min"),
            c.max().alias(f"{column}_max"), c.count().alias(f"{column}_n")]


def width_table(runs: pl.DataFrame, evals: pl.DataFrame, target: float) -> pl.DataFrame:
    """One row per (task, method, width): the width study's numbers over its seeds."""
    joined = runs.join(reach(evals, target), on="run", how="left")
    return joined.group_by(["task", "method", "width"]).agg(
        pl.len().alias("runs"),
        *stats("best_speedup"),
        *stats("rounds_to_target"),
        *stats("wall_s_to_target"),
        *stats("evals_per_min"),
        *stats("busy_share"),
        *stats("failure_rate"),
        pl.col("rounds").mean().alias("rounds_mean"),
        pl.col("wall_s").mean().alias("wall_s_mean"),
    ).with_columns(pl.lit(target).alias("target_speedup")).sort(["task", "method", "width"])


def method_table(runs: pl.DataFrame) -> pl.DataFrame:
    """One row per (task, method): the comparison's numbers over its seeds. `runs` may carry the
    columns of the final check (`check_*`, `vs_<reference>`), which are summarized too."""
    extra = [c for c in runs.columns if c.startswith("vs_") or c == "check_speedup"]
    return runs.group_by(["task", "method"]).agg(
        pl.len().alias("runs"),
        *stats("best_speedup"),
        *[e for c in extra for e in stats(c)],
        *([pl.col("check_passed").sum().alias("check_passed"), pl.col("check_passed").count().alias("checked")]
          if "check_passed" in runs.columns else []),
        *stats("rounds"),
        *stats("cost_usd"),
        *stats("wall_s"),
    ).sort(["task", "method"])
