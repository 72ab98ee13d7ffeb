"""The experiment scripts: the README's commands parsed into the grids they run (without running them),
and the whole pipeline (cells, resume of short cells, final check, Parquet, tables, plots) end to end on
the toy task, as a user types it, from a directory holding only a copy of `experiments/`."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import polars as pl
import pytest

from ksearch_ray.analysis.records import read_run
from ksearch_ray.analysis.runs import EVALUATION_SCHEMA, RUN_SCHEMA
from ksearch_ray.config import validate_config
from ksearch_ray.events import Resume, RunEnd
from ksearch_ray.store import RunStore
from ksearch_ray.studies.grid import Cell, cells
from ksearch_ray.studies.launch import CellState, LocalLauncher, cell_command, cell_state, local_cpus_for
from ksearch_ray.studies.study import grid_from

ROOT = Path(__file__).parent.parent
DATA = Path(__file__).parent / "data"
PNG = b"\x89PNG\r\n\x1a\n"


def script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"experiments_{name}", ROOT / "experiments" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def readme_command(start: str) -> list[str]:
    """The README's command line that begins with `start`, as its argument list (continuations joined)."""
    text = (ROOT / "README.md").read_text().replace("\\\n", " ")
    line = next(line for line in text.splitlines() if line.startswith(start))
    return shlex.split(line.split("#")[0])[2:]  # drop "python" and the script


def grid_cells(name: str, argv: list[str]) -> list[Cell]:
    module = script(name)
    args = module.parse(argv)
    extra = ({"methods": args.methods or (None if args.config else ["ksearch", "evolve", "refine"]), "widths": args.widths}
             if name == "reproduce" else {"widths": args.widths or (None if args.config else [1, 2, 4, 8])})
    return cells(grid_from(args, **extra), args.device)


def test_the_readme_width_study_command_is_four_trimul_cells_at_cpu_settings():
    found = grid_cells("width_study", readme_command("python experiments/width_study.py --task trimul"))
    assert [(c.method, c.width, c.seed) for c in found] == [("ksearch", 1, 0), ("ksearch", 1, 1), ("ksearch", 2, 0), ("ksearch", 2, 1)]
    config = validate_config(found[0].config())
    assert config.task == "trimul" and config.budget.rounds == 4 and config.evaluation.device == "cpu"
    assert config.evaluation.workloads == "smoke" and config.search.confirm_repeats == 0 and not config.cluster.ray


def test_the_readme_reproduction_commands_are_the_grids_they_name():
    local = grid_cells("reproduce", readme_command("python experiments/reproduce.py --task trimul"))
    assert sorted(c.method for c in local) == ["evolve", "ksearch", "refine"]
    paper = grid_cells("reproduce", readme_command("python experiments/reproduce.py --config experiments/paper.yaml --out runs"))
    assert len(paper) == 4 * 3 * 3 and {c.seed for c in paper} == {0, 1, 2} and {c.width for c in paper} == {8}
    config = validate_config(paper[0].config())
    assert config.llm.model == "openai/gpt-5" and config.search.ksearch.stagnation_window == 5
    assert config.budget.rounds == 120 and config.budget.max_cost_usd == 40 and config.cluster.ray
    cluster = readme_command("python experiments/reproduce.py --config experiments/paper.yaml --out /shared")
    assert script("reproduce").parse(cluster).ray_address == "http://head:8265"


def test_every_experiment_config_file_is_a_valid_run_configuration():
    validate_config(json.loads(json.dumps(__import__("yaml").safe_load((ROOT / "experiments/trimul.yaml").read_text()))))


def fresh_home(tmp_path: Path) -> Path:
    home = tmp_path / "user"
    shutil.copytree(ROOT / "experiments", home / "experiments")
    return home


def run_script(home: Path, argv: list[str], timeout: int = 600) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, *argv], cwd=home, capture_output=True, text=True, timeout=timeout,
                          env={**__import__("os").environ, "RAY_AUTH_MODE": "disabled"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def assert_outputs(out: Path) -> None:
    assert list(out.glob("*.parquet")) and list(out.glob("*.md"))
    images = list(out.glob("*.png"))
    assert images and all(p.stat().st_size > 5_000 and p.read_bytes().startswith(PNG) for p in images)


@pytest.mark.slow
def test_the_comparison_with_the_llm_standin_and_a_reference_skips_complete_cells_when_run_again(tmp_path):
    home = fresh_home(tmp_path)
    # evolve and refine: the methods only this test runs through the grid (the width study runs ksearch's cells).
    argv = ["experiments/reproduce.py", "--task", "toy_axpy", "--task-dir", str(DATA), "--device", "cpu", "--methods",
            "evolve", "refine", "--seeds", "1", "--rounds", "3", "--standin", "--from-solution", "triton_seed",
            "--reference", str(DATA / "toy/solutions/good"), "--out", "rep"]
    run_script(home, argv)
    out = home / "rep"
    assert_outputs(out)
    runs = pl.read_parquet(out / "runs.parquet")
    evals = pl.read_parquet(out / "evaluations.parquet")
    assert dict(runs.schema).items() >= RUN_SCHEMA.items() and dict(evals.schema) == EVALUATION_SCHEMA
    assert (runs["policy"] == "hosted_vllm/standin").all() and (runs["llm_calls"] > 0).all()
    assert sorted(runs["method"].to_list()) == ["evolve", "refine"]
    assert runs["complete"].all() and (runs["rounds"] == 3).all()
    assert runs["check_passed"].all() and runs["vs_good"].is_not_null().all()  # each best beside the reference
    assert {"evolve", "improve"} <= set(evals["kind"].to_list())
    text = (out / "results.md").read_text()
    assert "vs good on" in text and "## Reference solutions" in text and "Command: `python experiments/reproduce.py" in text
    events = RunStore(out / "runs/toy_axpy-evolve-w2-s0").read_events()
    assert any(e.kind == "llm_call" and e.call.kind == "evolve" for e in events)  # type: ignore[union-attr]

    before = {p: p.stat().st_size for p in out.glob("runs/*/events.jsonl")}
    again = run_script(home, [*argv, "--no-check"])
    assert again.stdout.count("complete, skipped") == 2
    assert {p: p.stat().st_size for p in out.glob("runs/*/events.jsonl")} == before


@pytest.mark.slow
def test_the_width_study_pipeline_writes_its_frames_tables_and_plots(tmp_path):
    home = fresh_home(tmp_path)
    run_script(home, ["experiments/width_study.py", "--task", "toy_axpy", "--task-dir", str(DATA), "--device", "cpu",
                      "--from-solution", "triton_seed", "--widths", "1", "2", "--seeds", "1", "--rounds", "2", "--out", "ws"])
    out = home / "ws"
    assert_outputs(out)
    runs = pl.read_parquet(out / "runs.parquet")
    assert sorted(runs["width"].to_list()) == [1, 2] and runs["complete"].all() and (runs["policy"] == "offline").all()
    assert runs["busy_share"].is_between(0, 1).all() and (runs["evals_per_min"] > 0).all()
    table = pl.read_parquet(out / "width.parquet")
    assert table["width"].to_list() == [1, 2] and (table["runs"] == 1).all()
    assert "| toy_axpy | ksearch | 2 | 1 |" in (out / "width.md").read_text()


def test_a_cell_without_a_normal_end_is_resumed_at_the_grids_budget(tmp_path):
    cell = Cell(task="toy_axpy", method="evolve", width=2, seed=1,
                settings={"budget": {"rounds": 6}, "evaluation": {"device": "cpu"}, "task_dirs": [str(DATA)]})
    assert cell_state(cell, tmp_path) is CellState.NEW
    command = cell_command(cell, tmp_path, CellState.NEW, "python")
    config = Path(command[command.index("--config") + 1])
    assert "random_seed: 1" in config.read_text() and "method: evolve" in config.read_text()
    run_dir = cell.run_dir(tmp_path)
    small = validate_config(cell.config()).with_settings({"budget.rounds": 4})
    store = RunStore.create(run_dir, {"run_id": run_dir.name, "config": small.model_dump(mode="json")})
    store.append(RunEnd(reason="rounds", rounds=4))
    _, run = read_run(run_dir)
    assert run["complete"] and run["rounds_budget"] == 4
    assert cell_state(cell, tmp_path) is CellState.INCOMPLETE  # complete, but at a smaller budget
    assert cell_command(cell, tmp_path, CellState.INCOMPLETE, "python")[-2:] == ["--rounds", "6"]
    store.append(Resume(budget={"rounds": 6}))
    store.close()
    assert not read_run(run_dir)[1]["complete"] and cell_state(cell, tmp_path) is CellState.INCOMPLETE


def test_a_grids_shared_local_ray_declares_cpus_for_any_cells_evaluators_and_a_build_together(tmp_path):
    """The grid's cells attach to one local Ray; on a 2-core machine it once declared 2 CPUs, where a C++ cell's
    evaluator (1 CPU) and its 2-CPU build could never run at once, and the cell waited for ever."""
    import ray

    small = Cell(task="toy_axpy_cpp", method="ksearch", width=2, seed=1, settings={"task_dirs": [str(DATA)]})
    wide = Cell(task="toy_axpy_cpp", method="ksearch", width=2, seed=2, settings={
        "task_dirs": [str(DATA)], "evaluation": {"evaluators": 4}, "cluster": {"build_cpus": 8}})
    assert local_cpus_for([small]) == max(os.cpu_count() or 1, 3)
    assert local_cpus_for([small, wide]) == max(os.cpu_count() or 1, 12)
    with LocalLauncher(tmp_path, lambda _line: None, cpus=local_cpus_for([small, wide])):
        assert ray.cluster_resources()["CPU"] == max(os.cpu_count() or 1, 12)
    assert not ray.is_initialized()


def test_a_bad_grid_file_is_one_line(tmp_path):
    grid = tmp_path / "grid.yaml"
    grid.write_text("tasks: [trimul]\nrounds: 4\nsettings:\n  search: {widht: 3}\n")
    done = subprocess.run([sys.executable, "experiments/reproduce.py", "--config", str(grid), "--out", "out"],
                          cwd=fresh_home(tmp_path), capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stderr.strip().count("\n") == 0, done.stderr
    assert "widht" in done.stderr and "did you mean search.width" in done.stderr


def test_the_kernel_scripts_coordinate_sweep_keeps_each_groups_best_and_skips_failures(capsys):
    sweep = script("tunable_sweep").coordinate_sweep
    cost = {("a", 1): 3.0, ("a", 2): 1.0, ("a", 3): None, ("b", "x"): 0.0, ("b", "y"): 0.5}
    seen: list[dict] = []

    def measure(values: dict) -> float | None:  # None: a variant that fails, skipped
        seen.append(dict(values))
        a, b = cost[("a", values["A"])], cost[("b", values["B"])]
        return None if a is None else a + b

    result = sweep(["A=1,2,3", "B=x,y"], {"A": 1, "B": "y"}, measure, skip_best=True)
    assert result["best"] == {"A": 2, "B": "x"} and result["best_ms"] == 1.0 and result["start_ms"] == 3.5
    # The start point is measured once (skip_best); the failing variant is logged with no time.
    assert seen.count({"A": 1, "B": "y"}) == 1 and {"values": {"A": 3, "B": "y"}, "ms": None} in result["log"]
    assert "best after B=x,y: 1.0000 ms" in capsys.readouterr().out
    # Without skip_best the best so far is measured again ...
    seen.clear()
    sweep(["A=1,2"], {"A": 1, "B": "y"}, measure)
    assert seen == [{"A": 1, "B": "y"}, {"A": 1, "B": "y"}, {"A": 2, "B": "y"}]
    # ... and past the deadline nothing more is started.
    late = sweep(["A=1,2"], {"A": 1, "B": "y"}, measure, deadline=0.0)
    assert late["best"] == {"A": 1, "B": "y"} and len(late["log"]) == 1


def test_trimul_kernels_takes_several_tunables_of_a_solution_in_a_comma_separated_list(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "experiments"))  # trimul_kernels imports tunable_sweep beside it
    tk = script("trimul_kernels")
    from ksearch_ray.taskspec.task import find_task
    from ksearch_ray.taskspec.tunables import read_tunables

    task = find_task("trimul")
    for spec in ("triton_fused:PROJ_BLOCK_M=64;PROJ_WARPS=8", "triton_fused:PROJ_BLOCK_M=64,PROJ_WARPS=8"):
        solution = tk._solution(task, spec)
        values = {t.name: t.value for t in read_tunables(solution.sources[solution.entry_file]).values()}
        assert (values["PROJ_BLOCK_M"], values["PROJ_WARPS"]) == (64, 8), spec


def test_the_triton_builds_search_summary_reads_a_runs_own_evaluation_records():
    """issue 40's figures from a run directory: new candidates once each, busy time, the timed share."""
    run = DATA / "old_run_dirs" / "schema2_offline"
    out = subprocess.run([sys.executable, str(ROOT / "experiments" / "triton_builds.py"), "search", str(run)],
                         capture_output=True, text=True, check=True, cwd=ROOT).stdout
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    evaluations = [e for e in events if e["kind"] == "evaluation"]
    new = {e["solution_id"] for e in evaluations if e["evaluator"] >= 0}
    share = sum(e["result"]["timed_seconds"] for e in evaluations) / sum(e["result"]["seconds"] for e in evaluations)
    assert f"{len(new)} new candidates;" in out and f"kernels timed {100 * share:.1f} %" in out, out
    first: dict[str, dict] = {}
    for e in evaluations:
        if e["evaluator"] >= 0:
            first.setdefault(e["solution_id"], e["result"])
    timing = statistics.median(r["stages"]["timing"] for r in first.values())
    assert f"timing {timing:.2f}" in out.split("stages, medians (s): ")[1], out
    # Every idle second is put down to a written candidate that had not started, or to no candidate at all.
    idle = re.search(r"longest [\d.]+ s, ([\d.]+) s in all", out)
    split = re.search(r"idle time, ([\d.]+) s had a written candidate waiting .*?, ([\d.]+) s had none", out)
    assert idle and split, out
    assert abs(float(split[1]) + float(split[2]) - float(idle[1])) <= 0.2, out


def test_the_judge_cost_script_times_both_comparisons_and_finds_them_equal(tmp_path):
    """A user's directory, a relative task path: every workload's row, the two comparisons' verdicts equal
    (the script asserts it)."""
    shutil.copytree(DATA / "toy", tmp_path / "toy")
    out = subprocess.run([sys.executable, str(ROOT / "experiments" / "judge_cost.py"), "--task", "toy", "--device", "cpu",
                          "--workloads", "benchmarks", "--repeats", "3", "--json"],
                         capture_output=True, text=True, check=True, cwd=tmp_path).stdout
    summary = json.loads(out.splitlines()[-1])
    assert [r["workload"] for r in summary["rows"]] == ["n1000", "n4096"]
    assert all(r["reference_ms"] > 0 and r["compare_full_ms"] > 0 for r in summary["rows"])
    assert "full/short" in out
