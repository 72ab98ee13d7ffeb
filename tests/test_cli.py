"""The `ksearch` command line as a user meets it: one-line errors and exit codes, through typer's test runner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from cli_runner import ksearch as cli

import ksearch_ray

ROOT = Path(__file__).parent.parent
DATA = Path(__file__).parent / "data"
GQA = "gqa_paged_decode_h32_kv4_d128_ps1"


def ksearch(*args: str, cwd: Path = ROOT):  # type: ignore[no-untyped-def]
    return cli(cwd, *args)


@pytest.mark.parametrize(("args", "message"), [
    (["eval", "--task", "no_such_task", "x.py"], "unknown task 'no_such_task'"),
    (["eval", "--task", "toy_axpy", "--task-dir", str(DATA), "missing.py"], "no such file or solution"),
    (["eval", "--task", "toy_axpy", "--task-dir", str(DATA), "good", "--mode", "sometimes"], "--mode must be fresh or reuse"),
    (["eval", "--task", "toy_axpy", "--task-dir", str(DATA), "good", "--workloads", "nope"], "no workload set 'nope'"),
    (["run", "--task", "trimul", "--width", "0"], "search.width: Input should be greater than or equal to 1"),
    (["run", "--task", "trimul", "--method", "greedy"], "search.method: Input should be 'ksearch', 'evolve' or 'refine'"),
    (["run", "--task", "trimul", "--objective", "wall"], "'wall' is not one of 'kernel', 'call'"),
    (["run", "--task", "trimul", "--from-solution", "nosuch.py"], "--from-solution: no solution of trimul"),  # before Ray
    (["run", "--task", "trimul", "--model", "hosted_vllm/m", "--api-base", "http://127.0.0.1:9/v1"], "cannot reach the model endpoint"),
    (["resume", "/nonexistent/run"], "is not a run directory"),
    (["run", "--task", "toy_axpy", "--task-dir", str(DATA), "--model", "hosted_vllm/m", "--api-base", "http://127.0.0.1:9/v1",
      "--max-cost-usd", "1"], "--max-cost-usd needs a price for hosted_vllm/m"),
    (["run", "--task", "toy_axpy", "--task-dir", str(DATA), "--price-per-mtok", "3"], "--price-per-mtok wants two numbers"),
    pytest.param(
        ["run", "--task", "toy_axpy", "--task-dir", str(DATA), "--device", "cuda", "--run-dir", "no-gpu-run"],
        "no evaluator resources", marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU"),
    ),
    (["tasks", "--dataset", "/nonexistent/dataset"], "not a directory"),
])
def test_bad_input_gets_one_line_and_exit_status_2(args, message, tmp_path):
    result = ksearch(*args, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert message in " ".join(result.stderr.split())
    assert "Traceback" not in result.stderr + result.stdout


def test_eval_prints_a_table_and_fails_with_status_1_for_a_wrong_kernel():
    ok = ksearch("eval", "--task", "toy_axpy", "--task-dir", str(DATA), "good", "--json")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["result"]["status"] == "PASSED"
    bad = ksearch("eval", "--task", "toy_axpy", "--task-dir", str(DATA), str(DATA / "candidates" / "wrong_values.py"))
    assert bad.returncode == 1
    assert "INCORRECT_NUMERICAL" in bad.stdout and "first value outside tolerance" in " ".join(bad.stdout.split())


def _dataset(tmp_path: Path) -> Path:
    """A FlashInfer-Bench dataset: the definition JSON and one workload line in its own format."""
    ds = tmp_path / "dataset"
    (ds / "definitions" / "gqa_paged").mkdir(parents=True)
    (ds / "workloads" / "gqa_paged").mkdir(parents=True)
    definition = ROOT / "tasks" / "flashinfer" / GQA / "definition.json"
    (ds / "definitions" / "gqa_paged" / f"{GQA}.json").write_text(definition.read_text())
    workload = {"definition": GQA, "solution": None, "workload": {
        "uuid": "0000-test", "axes": {"batch_size": 2, "num_pages": 64, "len_indptr": 3, "num_kv_indices": 40},
        "inputs": {"q": {"type": "random"}, "k_cache": {"type": "random"}, "v_cache": {"type": "random"},
                   "kv_indptr": {"type": "safetensors", "path": "./blob/x.safetensors", "tensor_key": "kv_indptr"},
                   "kv_indices": {"type": "safetensors", "path": "./blob/x.safetensors", "tensor_key": "kv_indices"},
                   "sm_scale": {"type": "scalar", "value": 0.08838834764831845}}}}
    (ds / "workloads" / "gqa_paged" / f"{GQA}.jsonl").write_text(json.dumps(workload) + "\n")
    return ds


def test_dataset_flag_loads_flashinfer_bench_files_and_evaluates_against_them(tmp_path):
    ds = _dataset(tmp_path)
    listed = ksearch("tasks", "--dataset", str(ds), "--device", "cuda")  # on the CPU `all` runs as its -cpu twin
    assert listed.returncode == 0, listed.stderr
    assert GQA in listed.stdout.splitlines() and "all (1)" in listed.stdout
    result = ksearch("eval", "--task", GQA, "--dataset", str(ds), "reference", "--workloads", "all", "--device", "cpu",
                     "--max-calls", "3", "--json")
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)["result"]
    # On the CPU a set resolves to its reduced "-cpu" twin, which the generated bundle carries.
    assert payload["status"] == "PASSED" and payload["workload_set"] == "all-cpu"


def test_export_writes_flashinfer_bench_solution_json_that_reads_back(tmp_path):
    out = tmp_path / "solution.json"
    seed = ROOT / "tasks" / "flashinfer" / GQA / "solutions" / "triton_seed"
    result = ksearch("export", str(seed), "--task", GQA, "--out", str(out), "--target-hardware", "H200")
    assert result.returncode == 0, result.stderr
    exported = json.loads(out.read_text())
    assert exported["definition"] == GQA and exported["spec"]["target_hardware"] == ["H200"]
    assert exported["spec"]["entry_point"].endswith("::run")

    from ksearch_ray.taskspec.flashinfer_format import solution_from_json
    from ksearch_ray.taskspec.task import Task, load_solution_dir

    task = Task.load(ROOT / "tasks" / "flashinfer" / GQA)
    assert solution_from_json(out, task).id == load_solution_dir(seed, GQA).id


def _toy_with_optional_solutions(tmp_path: Path) -> Path:
    """The toy bundle plus two copies of its good solution: one needs a module no one has, one needs json."""
    import shutil

    root = tmp_path / "toy"
    shutil.copytree(DATA / "toy", root)
    for name, module in (("needs_absent", "ksearch_no_such_module"), ("needs_json", "json")):
        sol = root / "solutions" / name
        sol.mkdir()
        (sol / "good.py").write_text((DATA / "toy" / "solutions" / "good" / "good.py").read_text())
        (sol / "solution.json").write_text(json.dumps(
            {"name": name, "language": "python", "entry_file": "good.py", "entry_point": "run", "requires": [module]}))
    return root


def test_a_solution_needing_a_missing_module_is_listed_as_such_and_refused_in_one_line(tmp_path):
    root = _toy_with_optional_solutions(tmp_path)
    listed = ksearch("tasks", "--task-dir", str(root))
    assert listed.returncode == 0, listed.stderr
    flat = " ".join(listed.stdout.split())
    assert "needs_absent (needs ksearch_no_such_module)" in flat and "needs_json (needs" not in flat
    refused = ksearch("eval", "--task", "toy_axpy", "--task-dir", str(root), "needs_absent", "--device", "cpu")
    assert refused.returncode == 2
    assert "needs the Python module ksearch_no_such_module, which is not installed here" in " ".join(refused.stderr.split())
    assert "Traceback" not in refused.stderr + refused.stdout
    both = ksearch("eval", "--task", "toy_axpy", "--task-dir", str(root), "good", "--baseline", "--against", "needs_json")
    assert both.returncode == 2 and "give one" in both.stderr


def test_against_measures_any_named_solution_side_by_side(tmp_path):
    root = _toy_with_optional_solutions(tmp_path)
    result = ksearch("eval", "--task", "toy_axpy", "--task-dir", str(root), "good", "--against", "needs_json",
                     "--device", "cpu", "--max-calls", "3", "--json")
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    assert payload["result"]["solution_name"] == "good" and payload["baseline"]["solution_name"] == "needs_json"
    assert payload["baseline"]["status"] == "PASSED" and payload["speedup"] > 0
    assert set(payload["workload_speedups"]) == {w["workload"] for w in payload["result"]["workloads"]}


def test_a_search_from_a_solution_needing_a_missing_module_stops_before_the_run_directory(tmp_path):
    root = _toy_with_optional_solutions(tmp_path)
    run_dir = tmp_path / "run"
    result = ksearch("run", "--task", "toy_axpy", "--task-dir", str(root), "--from-solution", "needs_absent",
                     "--device", "cpu", "--run-dir", str(run_dir), "--no-progress")
    assert result.returncode == 2
    assert "needs the Python module ksearch_no_such_module" in " ".join(result.stderr.split())
    assert "Traceback" not in result.stderr + result.stdout and not run_dir.exists()


def test_a_job_on_a_cluster_says_it_attaches_rather_than_starts_ray(monkeypatch):
    from local_backends import settings

    from ksearch_ray.distributed.cluster import attaching

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert not attaching(settings(task="trimul"))
    assert attaching(settings(task="trimul", address="ray://head:10001"))
    monkeypatch.setenv("RAY_ADDRESS", "http://127.0.0.1:8265")  # what `ray job submit` gives its entrypoint
    assert attaching(settings(task="trimul"))


@pytest.mark.parametrize(("args", "verbatim"), [
    (["run", "--task", "foo[bar]"], "unknown task 'foo[bar]'"),
    (["eval", "--task", "toy_axpy", "--task-dir", str(DATA), "kernels/[draft] axpy.py"], "kernels/[draft] axpy.py"),
    (["resume", "/nonexistent/[red]run"], "/nonexistent/[red]run"),
])
def test_error_messages_print_square_brackets_verbatim(args, verbatim):
    """rich markup would eat `[bar]`, `[draft]` and `[nope]`: every message prints its text as is."""
    done = ksearch(*args)
    assert done.returncode == 2, done.stderr
    assert verbatim in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_a_missing_tracker_gives_install_advice_that_keeps_its_extra(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    done = ksearch("run", "--task", "toy_axpy", "--task-dir", str(DATA), "--device", "cpu", "--track", "wandb", "--no-ray")
    assert done.returncode == 2, done.stderr
    # From a checkout (an editable install) the advice installs the checkout; from an installed
    # package (CI installs it with `pip install .`), the released package: the extra is kept either way.
    checkout = (Path(ksearch_ray.__file__).resolve().parents[1] / "pyproject.toml").is_file()
    assert ("pip install '.[wandb]'" if checkout else "pip install 'ksearch-ray[wandb]'") in done.stderr, done.stderr


def test_a_ray_job_without_a_durable_run_dir_is_refused_in_one_line(tmp_path):
    """`ray job submit` runs the entrypoint in a temporary copy of its working directory (and sets
    RAY_JOB_CONFIG_JSON_ENV_VAR there): a run directory inside it would vanish with the job."""
    job = {"RAY_JOB_CONFIG_JSON_ENV_VAR": "{}"}
    base = ["run", "--task", "toy_axpy", "--task-dir", str(DATA), "--device", "cpu", "--no-ray", "--rounds", "1"]
    for extra in ([], ["--run-dir", "runs/mine"]):
        done = cli(tmp_path, *base, *extra, env=job)
        assert done.returncode == 2, done.stderr
        assert "running as a Ray job" in done.stderr and "--run-dir" in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "runs").exists()
    # An absolute directory outside the job's copy passes this check (and then meets the next one).
    elsewhere = tmp_path.parent / f"{tmp_path.name}-file"
    elsewhere.write_text("not a directory")
    done = cli(tmp_path, *base, "--run-dir", str(elsewhere), env=job)
    assert done.returncode == 2 and "exists and is not a directory" in done.stderr, done.stderr


@pytest.mark.parametrize("body", ['[{"name": "x"}]', '"a string"', "3"])
def test_a_solution_json_that_is_not_an_object_says_so_without_internal_names(tmp_path, body):
    (tmp_path / "solution.json").write_text(body)
    done = ksearch("eval", "--task", GQA, str(tmp_path / "solution.json"), cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "not a FlashInfer-Bench solution" in done.stderr and "_Fib" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
