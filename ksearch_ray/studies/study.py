"""What the experiment scripts share: their flags, the grid they make, running it, and its frames.

`experiments/reproduce.py` and `experiments/width_study.py` are thin: they parse flags with
`arguments`, run the grid with `run_grid` and turn `read_runs`' frames into their tables and plots.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shlex
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

from ksearch_ray.config import ConfigError
from ksearch_ray.studies.grid import Cell, Grid, cells, load_grid
from ksearch_ray.studies.launch import GridError, JobLauncher, LocalLauncher, Outcome, local_cpus_for


def arguments(parser: argparse.ArgumentParser) -> None:
    """The flags both scripts take; each overrides the same key of the --config YAML file."""
    parser.add_argument("--config", type=Path, help="YAML file of the grid (tasks, methods, widths, seeds, budget, ...).")
    parser.add_argument("--task", nargs="+", dest="tasks", help="Task names or bundle paths.")
    parser.add_argument("--seeds", type=int, help="Repetitions per cell (random seeds 0..N-1).")
    parser.add_argument("--rounds", type=int, help="Budget of code generations per run.")
    parser.add_argument("--max-cost-usd", type=float, help="LLM budget per run, in dollars.")
    parser.add_argument("--device", choices=["cuda", "cpu"], help="Where candidates run (default: cuda when Ray sees GPUs).")
    parser.add_argument("--workloads", help="Workload set that scores candidates (default on the CPU: smoke).")
    parser.add_argument("--model", help="litellm model string for every run (default: the offline policy).")
    parser.add_argument("--api-base", help="OpenAI-compatible server URL for --model.")
    parser.add_argument("--from-solution", help="Start every run from this solution of the task (a name or a file); "
                                                "with a model, runs without one write their first kernel from the specification.")
    parser.add_argument("--task-dir", action="append", help="Extra directory of task bundles (repeatable).")
    parser.add_argument("--standin", action="store_true",
                        help="Start the LLM stand-in here and point every run at it (tests and demos; not a model).")
    parser.add_argument("--ray-address", help="Submit each run as a Ray job to this cluster (http://head:8265).")
    parser.add_argument("--parallel", type=int, default=1, help="Ray jobs at a time on a cluster (default 1).")
    parser.add_argument("--out", type=Path, required=True, help="Output directory: run directories, Parquet, tables, plots.")
    parser.add_argument("--no-report", action="store_true",
                        help="Run the grid only; write tables and plots later with --report-only (where polars is).")
    parser.add_argument("--report-only", action="store_true", help="Tables and plots from the run directories under --out.")


def grid_from(args: argparse.Namespace, **fields: Any) -> Grid:
    settings: dict[str, Any] = {}
    for key, path in (("workloads", "evaluation.workloads"), ("model", "llm.model"), ("api_base", "llm.api_base"),
                      ("from_solution", "search.from_solution")):
        if getattr(args, key) is not None:
            settings[path] = getattr(args, key)
    if args.task_dir:
        settings["task_dirs"] = [str(Path(d).resolve()) for d in args.task_dir]
    overrides = {"tasks": args.tasks, "seeds": args.seeds, "rounds": args.rounds, "max_cost_usd": args.max_cost_usd,
                 "settings": settings, **fields}
    try:
        return load_grid(args.config, overrides)
    except ConfigError as exc:
        fail(str(exc))


def fail(message: str) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


@contextlib.contextmanager
def _standin(grid: Grid, wanted: bool) -> Iterator[None]:
    if not wanted:
        yield
        return
    from ksearch_ray.policies.standin.server import StandIn

    # No 429s: an experiment compares methods; the retry path has tests of its own.
    with StandIn(rate_limit_every=0) as server:
        grid.settings.setdefault("llm", {}).update(model="hosted_vllm/standin", api_base=server.api_base)
        say(f"LLM stand-in at {server.api_base} (not a model: it applies tunable changes it reads in the prompts)")
        yield


def run_grid(grid: Grid, args: argparse.Namespace) -> tuple[list[Cell], list[Outcome]]:
    """Run (or resume, or skip) every cell of the grid; returns the cells and what became of them."""
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.standin and args.ray_address:
        fail("--standin serves on this machine's loopback: a cluster's jobs cannot reach it")
    try:
        with _standin(grid, args.standin):
            grid_cells = cells(grid, args.device)
            say(f"{len(grid_cells)} run(s) under {out / 'runs'}")
            if args.ray_address:
                launcher: Any = JobLauncher(args.ray_address, out, say, parallel=args.parallel, working_dir=checkout())
                return grid_cells, launcher.run(grid_cells)
            on_ray = any(cell.setting("cluster.ray") is not False for cell in grid_cells)
            with LocalLauncher(out, say, ray=on_ray, cpus=local_cpus_for(grid_cells) if on_ray else None) as local:
                return grid_cells, local.run(grid_cells)
    except (ConfigError, GridError) as exc:
        fail(str(exc))


def checkout() -> Path | None:
    """The repository this package runs from, when it is a checkout (a job's working directory)."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").is_file() and (root / "experiments").is_dir() else None


PROVENANCE = "provenance.md"


def write_provenance(out: Path, argv: list[str]) -> None:
    """The command, date and machine of the runs, kept for the head of the results (which may be
    written later, on another machine, with --report-only)."""
    import torch

    if torch.cuda.is_available():
        gpu = f"{torch.cuda.device_count()}x {torch.cuda.get_device_name(0)}"
    else:
        gpu = "none: CPU results (Triton interpreter, host wall-clock timings; they only rank variants on this machine)"
    (out / PROVENANCE).write_text(
        f"Command: `python {shlex.join(argv)}`  \n"
        f"Date: {time.strftime('%Y-%m-%d %H:%M %Z')}; machine: {platform.node()} ({platform.machine()}, "
        f"{os.cpu_count()} CPUs); GPU: {gpu}\n")


def provenance(out: Path) -> str:
    path = out / PROVENANCE
    return path.read_text() if path.is_file() else "(no provenance.md: the runs' command and machine are unknown)\n"
