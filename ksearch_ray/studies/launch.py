"""Running the cells of a grid: `ksearch run` (or `ksearch resume`) per cell, locally or as Ray jobs.

A cell already complete at the grid's budget is skipped; one that was stopped, killed or run at
another budget is resumed with the grid's budget (`ksearch resume --rounds ...`), so rerunning a
grid finishes what is missing and extends what is short. Each cell's output goes to `<run dir>.log`.

* Locally, cells run one after another as subprocesses, each from its own directory. They share one
  Ray instance that this process starts (through RAY_ADDRESS, which the run's manifest does not keep,
  so a later `ksearch resume` of a cell starts Ray of its own as usual).
* On a cluster, each cell is a Ray job (the job submission client; `--ray-address http://head:8265`),
  at most `parallel` at a time. The output directory must be one the cluster's job drivers see (a
  shared file system, or the head node's disk when this runs there).
"""

from __future__ import annotations

import enum
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from ksearch_ray.analysis.records import read_run
from ksearch_ray.studies.grid import Cell


class GridError(Exception):
    """The grid cannot go on (a cell's configuration is refused); the message is one line."""


class CellState(enum.Enum):
    NEW = "new"
    INCOMPLETE = "incomplete"  # stopped, killed, or run at another budget: resumed
    COMPLETE = "complete"


def cell_state(cell: Cell, out: Path) -> CellState:
    run_dir = cell.run_dir(out)
    if not (run_dir / "manifest.json").is_file():
        return CellState.NEW
    _, run = read_run(run_dir)
    rounds, cost = cell.setting("budget.rounds"), cell.setting("budget.max_cost_usd")
    same_budget = (run["rounds_budget"] == (rounds if rounds is not None else run["rounds_budget"])
                   and run["cost_budget_usd"] == (cost if cost is not None else run["cost_budget_usd"]))
    return CellState.COMPLETE if run["complete"] and same_budget else CellState.INCOMPLETE


def cell_command(cell: Cell, out: Path, state: CellState, python: str) -> list[str]:
    run_dir = cell.run_dir(out)
    if state is CellState.NEW:
        config = run_dir.parent / f"{run_dir.name}.yaml"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(yaml.safe_dump(cell.config(), sort_keys=True))
        return [python, "-m", "ksearch_ray", "run", "--config", str(config), "--run-dir", str(run_dir), "--no-progress"]
    command = [python, "-m", "ksearch_ray", "resume", str(run_dir), "--no-progress"]
    if cell.setting("budget.rounds") is not None:
        command += ["--rounds", str(cell.setting("budget.rounds"))]
    if cell.setting("budget.max_cost_usd") is not None:
        command += ["--max-cost-usd", str(cell.setting("budget.max_cost_usd"))]
    return command


@dataclass
class Outcome:
    cell: Cell
    state: CellState  # before this launch
    returncode: int | None  # None: skipped (complete)
    seconds: float = 0.0
    last_line: str = ""


def _last_line(log: Path) -> str:
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()] if log.is_file() else []
    return lines[-1] if lines else ""


def _prepare(cell: Cell, out: Path, say: Callable[[str], None]) -> Outcome | tuple[CellState, Path]:
    """A complete cell's outcome (skipped), or the cell's state and its log beside its run directory (made)."""
    state = cell_state(cell, out)
    if state is CellState.COMPLETE:
        say(f"{cell.name}: complete, skipped")
        return Outcome(cell, state, None)
    run_dir = cell.run_dir(out)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    return state, run_dir.parent / f"{run_dir.name}.log"


def local_cpus_for(cells: Sequence[Cell]) -> int:
    """The CPUs a local Ray shared by `cells` declares: this machine's, and never fewer than any one cell's
    evaluators and one of its builds ask for together (distributed/cluster.py, `local_cpus`)."""
    from ksearch_ray.config import validate_config
    from ksearch_ray.distributed.cluster import local_cpus

    machine = os.cpu_count() or 1
    return max([machine, *(local_cpus(validate_config(cell.config(), cell.name), machine) for cell in cells)])


def _check(outcome: Outcome, log: Path) -> Outcome:
    if outcome.returncode == 2:  # a usage error: every cell like it would fail the same way
        raise GridError(f"{outcome.cell.name}: {_last_line(log)} (log: {log})")
    outcome.last_line = _last_line(log)
    return outcome


class LocalLauncher:
    """Cells as `ksearch` subprocesses, one at a time, on one Ray instance started here (unless no cell
    runs on Ray: `cluster.ray: false`, as CPU cells do)."""

    def __init__(self, out: Path, say: Callable[[str], None], env: dict[str, str] | None = None, *, ray: bool = True,
                 cpus: int | None = None):
        """`cpus`: what the shared Ray declares (default: this machine's); `local_cpus` of the cells gives the
        least that lets each cell's evaluators and a build run together."""
        self.out, self.say, self.ray, self.cpus = out, say, ray, cpus
        self.env = {**os.environ, **(env or {})}

    def __enter__(self) -> LocalLauncher:
        if not self.ray:
            return self
        from ksearch_ray.distributed.jobs import start_local_ray
        from ksearch_ray.run.errors import SearchError

        self.env.setdefault("RAY_AUTH_MODE", "disabled")
        os.environ["RAY_AUTH_MODE"] = self.env["RAY_AUTH_MODE"]
        env_vars = {k: v for k, v in self.env.items() if k in ("PYTHONPATH", "RAY_AUTH_MODE")}
        try:
            self.env["RAY_ADDRESS"] = start_local_ray(env_vars, self.say, self.cpus)
        except SearchError as exc:
            raise GridError(str(exc)) from None
        return self

    def __exit__(self, *exc: object) -> None:
        if self.ray:
            from ksearch_ray.distributed.jobs import stop_ray

            stop_ray()

    def run(self, cells: Sequence[Cell]) -> list[Outcome]:
        outcomes = []
        for cell in cells:
            prepared = _prepare(cell, self.out, self.say)
            if isinstance(prepared, Outcome):
                outcomes.append(prepared)
                continue
            state, log = prepared
            command = cell_command(cell, self.out, state, sys.executable)
            self.say(f"{cell.name}: {'running' if state is CellState.NEW else 'resuming'} (log: {log})")
            t0 = time.monotonic()
            with log.open("a") as sink:
                sink.write("$ " + shlex.join(command[1:]) + "\n")
                sink.flush()
                code = subprocess.run(command, cwd=log.parent, env=self.env, stdout=sink, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, check=False).returncode
            outcome = _check(Outcome(cell, state, code, time.monotonic() - t0), log)
            self.say(f"{cell.name}: exit {code} after {outcome.seconds:.0f} s: {outcome.last_line[:160]}")
            outcomes.append(outcome)
        return outcomes


class JobLauncher:
    """Cells as Ray jobs on a cluster, through the job submission client, `parallel` at a time."""

    def __init__(self, address: str, out: Path, say: Callable[[str], None], *, parallel: int = 1,
                 working_dir: Path | None = None, poll_s: float = 5.0):
        from ksearch_ray.distributed.jobs import JobClient

        self.client = JobClient(address, {"working_dir": str(working_dir)} if working_dir else None)
        self.out, self.say, self.parallel, self.poll_s = out, say, max(parallel, 1), poll_s

    def submit(self, command: Sequence[str], *, gpus: float = 0) -> str:
        return self.client.submit(command, gpus=gpus)

    def wait(self, job_id: str) -> tuple[int, str]:
        """(0 when the job succeeded else 1, its logs)."""
        while (status := self.client.status(job_id)) not in self.client.FINAL:
            time.sleep(self.poll_s)
        return (0 if status == "SUCCEEDED" else 1), self.client.logs(job_id)

    def run(self, cells: Sequence[Cell]) -> list[Outcome]:
        outcomes: list[Outcome] = []
        queue = list(cells)
        running: dict[str, tuple[Cell, CellState, Path, float]] = {}
        while queue or running:
            while queue and len(running) < self.parallel:
                cell = queue.pop(0)
                prepared = _prepare(cell, self.out, self.say)
                if isinstance(prepared, Outcome):
                    outcomes.append(prepared)
                    continue
                state, log = prepared
                job = self.submit(cell_command(cell, self.out, state, "python"))
                self.say(f"{cell.name}: submitted as Ray job {job}")
                running[job] = (cell, state, log, time.monotonic())
            for job in list(running):
                status = self.client.status(job)
                if status not in self.client.FINAL:
                    continue
                cell, state, log, t0 = running.pop(job)
                code, logs = self.wait(job)
                log.write_text(logs)
                outcome = _check(Outcome(cell, state, code, time.monotonic() - t0), log)
                self.say(f"{cell.name}: job {job} {status} after {outcome.seconds:.0f} s: {outcome.last_line[:160]}")
                outcomes.append(outcome)
            if running:
                time.sleep(self.poll_s)
        return outcomes
