"""Run directories as polars frames: one row per evaluation, one row per run (`records.read_run`'s
records, in the schemas below)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import polars as pl

from ksearch_ray.analysis.records import read_run

EVALUATION_SCHEMA: dict[str, Any] = {
    "run": pl.Utf8,  # the run directory's name
    "task": pl.Utf8,
    "method": pl.Utf8,
    "width": pl.Int64,
    "random_seed": pl.Int64,
    "policy": pl.Utf8,  # "offline" or the model string
    "round": pl.Int64,  # 0: the seed kernel's evaluation
    "kind": pl.Utf8,  # the attempt kind (generate_from_base, debug, improve, evolve, ...) or "seed"
    "solution_id": pl.Utf8,
    "status": pl.Utf8,
    "passed": pl.Boolean,
    "workloads": pl.Utf8,  # the workload set it was scored on, as the evaluator named it (e.g. smoke-cpu)
    "speedup": pl.Float64,  # over the baseline measured on the same evaluator; null when it failed
    "best_so_far": pl.Float64,  # the run's best speedup once this evaluation is in (the seed's included)
    "wall_s": pl.Float64,  # active seconds since the run started
    "cost_usd": pl.Float64,  # LLM dollars spent so far
    "llm_tokens": pl.Int64,  # LLM tokens spent so far
    "evaluator": pl.Int64,
    "gpu": pl.Utf8,
    "eval_s": pl.Float64,  # how long this evaluation took
    "objective": pl.Utf8,  # which figure `speedup` compares: kernel (graph replay) or call
    "kernel_ms": pl.Float64,  # geomean over workloads of the graph-replayed kernel; null where any has none
    "call_ms": pl.Float64,  # geomean over workloads of the call, host work included
}

RUN_SCHEMA: dict[str, Any] = {
    "run": pl.Utf8,
    "run_dir": pl.Utf8,
    "task": pl.Utf8,
    "method": pl.Utf8,
    "width": pl.Int64,
    "random_seed": pl.Int64,
    "policy": pl.Utf8,
    "device": pl.Utf8,
    "gpu": pl.Utf8,  # the device the evaluators reported (the first, on a mixed cluster)
    "evaluators": pl.Int64,
    "rounds_budget": pl.Int64,
    "cost_budget_usd": pl.Float64,
    "rounds": pl.Int64,  # rounds spent (code generations)
    "evaluations": pl.Int64,  # candidates evaluated (not baselines, seed or re-timings)
    "passed": pl.Int64,
    "no_code": pl.Int64,  # candidates without code (unusable replies)
    "failure_rate": pl.Float64,  # (failed evaluations + candidates without code) / candidates
    "seed_speedup": pl.Float64,
    "best_speedup": pl.Float64,
    "best_solution_id": pl.Utf8,
    "best_round": pl.Int64,
    "confirmed_speedup": pl.Float64,  # median of the final interleaved re-timings of the best, if any
    "cost_usd": pl.Float64,
    "llm_tokens": pl.Int64,
    "llm_calls": pl.Int64,
    "wall_s": pl.Float64,  # active wall time of the whole run
    "search_s": pl.Float64,  # active time from the first candidate to the last evaluation
    "evals_per_min": pl.Float64,  # evaluations per minute of search_s
    "evaluator_busy_s": pl.Float64,  # summed over evaluators and sessions
    "session_wall_s": pl.Float64,  # summed over sessions
    "busy_share": pl.Float64,  # evaluator_busy_s / (session_wall_s * evaluators)
    "finished": pl.Utf8,  # why the last session ended; null if it was stopped, killed or is running
    "complete": pl.Boolean,  # the last session ended normally (a `run_end` after everything else)
}


def read_runs(run_dirs: Iterable[Path]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(evaluations, runs) of every run directory given, in the schemas above."""
    evals: list[dict[str, Any]] = []
    runs: list[dict[str, Any]] = []
    for run_dir in run_dirs:
        rows, run = read_run(run_dir)
        evals += rows
        runs.append(run)
    return pl.DataFrame(evals, schema=EVALUATION_SCHEMA), pl.DataFrame(runs, schema=RUN_SCHEMA)
