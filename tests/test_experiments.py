"""The experiment scripts end to end on the CPU path, as a user types them: the README's commands, run as
subprocesses from a directory of their own (holding only a copy of `experiments/`, so nothing of the
checkout but the scripts is used), with the offline policy and with the LLM stand-in."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from ksearch_ray.analysis.runs import EVALUATION_SCHEMA, RUN_SCHEMA, read_run
from ksearch_ray.experiments.grid import Cell
from ksearch_ray.experiments.launch import CellState, cell_command, cell_state

ROOT = Path(__file__).parent.parent
DATA = Path(__file__).parent / "data"
PNG = b"\x89PNG\r\n\x1a\n"


def script_dir(tmp_path: Path) -> Path:
    home = tmp_path / "user"
    shutil.copytree(ROOT / "experiments", home / "experiments")
    return home


def run_script(home: Path, command: str, timeout: int = 2300) -> subprocess.CompletedProcess[str]:
    args = command.split()
    assert args[0] == "python"
    done = subprocess.run([sys.executable, *args[1:]], cwd=home, capture_output=True, text=True, timeout=timeout,
                          env={**__import__("os").environ, "RAY_AUTH_MODE": "disabled"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def assert_outputs(out: Path) -> None:
    assert list(out.glob("*.parquet")) and list(out.glob("*.md"))
    images = list(out.glob("*.png"))
    assert images and all(p.stat().st_size > 5_000 and p.read_bytes().startswith(PNG) for p in images)


def fresh(out: str) -> Path:
    path = Path(out)
    if path.exists():
        shutil.rmtree(path)  # the command as written writes here; an earlier run's cells would be skipped
    return path


@pytest.mark.slow
@pytest.mark.timeout(2400)  # 16 TriMul evaluations in Triton's interpreter: tens of seconds each
def test_the_width_study_command_as_written(tmp_path):
    out = fresh("/tmp/ws")
    run_script(script_dir(tmp_path),
               "python experiments/width_study.py --task trimul --device cpu --widths 1 2 --seeds 2 --rounds 4 --out /tmp/ws")
    assert_outputs(out)
    runs = pl.read_parquet(out / "runs.parquet")
    evals = pl.read_parquet(out / "evaluations.parquet")
    assert dict(runs.schema) == RUN_SCHEMA and dict(evals.schema) == EVALUATION_SCHEMA
    assert runs.height == 4 and sorted(runs["width"].to_list()) == [1, 1, 2, 2]
    assert runs["complete"].all() and (runs["rounds"] == 4).all() and (runs["policy"] == "offline").all()
    assert runs["busy_share"].is_between(0, 1).all() and (runs["evals_per_min"] > 0).all()
    table = pl.read_parquet(out / "width.parquet")
    assert table["width"].to_list() == [1, 2] and (table["runs"] == 2).all()
    text = (out / "width.md").read_text()
    assert "| task | method | width |" in text and "| trimul | ksearch | 2 | 2 |" in text
    assert {"width_trimul.png", "progress_trimul.png"} <= {p.name for p in out.glob("*.png")}


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_the_reproduction_command_as_written(tmp_path):
    out = fresh("/tmp/rep")
    run_script(script_dir(tmp_path),
               "python experiments/reproduce.py --task trimul --device cpu --methods ksearch evolve refine --seeds 1 --rounds 4 --out /tmp/rep")
    assert_outputs(out)
    runs = pl.read_parquet(out / "runs.parquet")
    assert sorted(runs["method"].to_list()) == ["evolve", "ksearch", "refine"]
    assert runs["complete"].all() and (runs["rounds"] == 4).all()
    assert runs["check_passed"].all() and (runs["check_speedup"] > 0).all()  # every best passes its final check
    checks = pl.read_parquet(out / "checks.parquet")
    assert set(checks["role"].to_list()) == {"baseline", "best"}
    text = (out / "results.md").read_text()
    for method in ("ksearch", "evolve", "refine"):
        assert f"| trimul | {method} | 1 |" in text
    assert "correct on `smoke-cpu`" in text and "Command: `python experiments/reproduce.py" in text


@pytest.mark.slow
def test_the_comparison_with_the_llm_standin_and_a_reference_skips_complete_cells_when_run_again(tmp_path):
    home = script_dir(tmp_path)
    command = (f"python experiments/reproduce.py --task toy_axpy --task-dir {DATA} --device cpu --methods ksearch evolve refine "
               f"--seeds 1 --rounds 4 --standin --from-solution triton_seed --reference {DATA / 'toy/solutions/good'} --out rep")
    run_script(home, command)
    out = home / "rep"
    assert_outputs(out)
    runs = pl.read_parquet(out / "runs.parquet")
    assert (runs["policy"] == "hosted_vllm/standin").all() and (runs["llm_calls"] > 0).all()
    assert runs["complete"].all() and (runs["rounds"] == 4).all()
    assert runs["vs_good"].is_not_null().all()  # each best against the reference, side by side
    evals = pl.read_parquet(out / "evaluations.parquet")
    assert {"evolve", "improve"} <= set(evals["kind"].to_list())
    text = (out / "results.md").read_text()
    assert "vs good on" in text and "## Reference solutions" in text
    events = [json.loads(line) for line in (out / "runs/toy_axpy-evolve-w2-s0/events.jsonl").read_text().splitlines()]
    assert any(e["kind"] == "llm_call" and e["call"]["kind"] == "evolve" for e in events)

    before = {p: p.stat().st_size for p in out.glob("runs/*/events.jsonl")}
    again = run_script(home, command + " --no-check")
    assert again.stdout.count("complete, skipped") == 3
    assert {p: p.stat().st_size for p in out.glob("runs/*/events.jsonl")} == before


def test_a_cell_without_a_normal_end_is_resumed_at_the_grids_budget(tmp_path):
    cell = Cell(task="toy_axpy", method="evolve", width=2, seed=1, settings={"rounds": 6, "device": "cpu"})
    assert cell_state(cell, tmp_path) is CellState.NEW
    command = cell_command(cell, tmp_path, CellState.NEW, "python")
    config = Path(command[command.index("--config") + 1])
    assert "random_seed: 1" in config.read_text() and "method: evolve" in config.read_text()
    run_dir = cell.run_dir(tmp_path)
    run_dir.mkdir(parents=True)
    (run_dir / "manifest.json").write_text(json.dumps({"config": cell.config() | {"rounds": 4}}))
    (run_dir / "events.jsonl").write_text(json.dumps({"seq": 1, "t": 0.0, "kind": "run_end", "reason": "rounds"}) + "\n")
    _, run = read_run(run_dir)
    assert run["complete"] and run["rounds_budget"] == 4
    assert cell_state(cell, tmp_path) is CellState.INCOMPLETE  # complete, but at a smaller budget
    assert cell_command(cell, tmp_path, CellState.INCOMPLETE, "python")[-2:] == ["--rounds", "6"]
    with (run_dir / "events.jsonl").open("a") as log:
        log.write(json.dumps({"seq": 2, "t": 1.0, "kind": "resume", "budget": {"rounds": 6}}) + "\n")
    assert not read_run(run_dir)[1]["complete"] and cell_state(cell, tmp_path) is CellState.INCOMPLETE


def test_a_bad_grid_file_is_one_line(tmp_path):
    grid = tmp_path / "grid.yaml"
    grid.write_text("tasks: [trimul]\nrounds: 4\nsettings:\n  widht: 3\n")
    home = script_dir(tmp_path)
    done = subprocess.run([sys.executable, "experiments/reproduce.py", "--config", str(grid), "--out", "out"], cwd=home,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stderr.strip().count("\n") == 0, done.stderr
    assert "widht" in done.stderr
