"""Experiment trackers as sinks of a run's events (`--track mlflow`, `--track wandb`): real MLflow on a
file store and real W&B in offline mode, fed by scripted searches of the toy task in this process, then
read back from what they wrote. A resumed run goes on in the same tracked run; a tracker that fails
mid-run costs one warning line, not the search; without `--track` neither library is imported."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from local_backends import DATA, FakeEvaluators, ScriptedPolicy, settings

from ksearch_ray import session as sessions
from ksearch_ray.config import ConfigError
from ksearch_ray.methods.registry import method_for
from ksearch_ray.models import Solution, Status
from ksearch_ray.policies.contract import CodeReply, CodeRequest, PlanReply, PlanRequest
from ksearch_ray.policies.llm.types import LLMCall
from ksearch_ray.run.engine import Search
from ksearch_ray.run.local import local_backends
from ksearch_ray.run.progress import PlainLines
from ksearch_ray.store import RunStore
from ksearch_ray.taskspec.task import find_task
from ksearch_ray.tracking.sink import ledger

TESTS = Path(__file__).parent


def needs(module: str) -> None:
    """CI installs the extras and must run these tests; elsewhere a missing extra skips them."""
    if importlib.util.find_spec(module) is None and not os.environ.get("CI"):
        pytest.skip(f"{module} is not installed (pip install '.[wandb,mlflow]')")


# ms per workload of each kernel; the toy task's baseline is `good`, its seed `triton_seed`.
MS = {"good": 1.0, "triton_seed": 2.0, "k1": 0.8, "k2": 0.5, "k4": 0.4, "k5": 0.25}
PRICE = 0.01  # dollars per scripted LLM call


def kernel(tag: str) -> Solution:
    return Solution(name=tag, task="toy_axpy", language="python", entry_file="k.py", entry_point="run",
                    sources={"k.py": f"# {tag}\ndef run(x, a, b):\n    return a * x + b\n"})


def call(kind: str) -> LLMCall:
    return LLMCall(kind=kind, model="scripted", prompt_tokens=100, completion_tokens=20, cost_usd=PRICE,
                   cost_known=True, request_hash=kind, attempts=1)


def planner() -> ScriptedPolicy:
    def plan(request: PlanRequest) -> PlanReply:
        return PlanReply(ops=[{"op": "insert", "parent": request.node_id or "root", "title": f"idea {len(request.tree.nodes)}",
                               "difficulty": 1, "score": 0.5, "expected_speedup": 1.2}], calls=[call("plan")])
    return ScriptedPolicy(plan=plan)


def coder(*tags: str) -> ScriptedPolicy:
    queue = list(tags)

    def code(request: CodeRequest) -> CodeReply:
        return CodeReply(solution=kernel(queue.pop(0) if queue else tags[-1] + "x"), calls=[call("code")])
    return ScriptedPolicy(code=code)


def judge(solution: Solution) -> tuple[float | None, Status, str]:
    if solution.name in MS:
        return MS[solution.name], Status.PASSED, ""
    return None, Status.CRASHED, "the scripted kernel crashed"


def session(root: Path, tags: list[str], rounds: int, track: list[str], capfd: Any,
            budget_change: dict[str, Any] | None = None) -> tuple[Search, list[str]]:
    """One session of a scripted search through the session's own wiring (`session._execute`, as `ksearch
    run` and `ksearch resume` use it); its output lines."""
    cfg = settings(task="toy_axpy", task_dirs=[str(DATA)], device="cpu", width=1, rounds=rounds, noise_repeats=1,
                   confirm_repeats=0, run_dir=str(root), track=track, ray=False)
    store = RunStore.open(root) if (root / "manifest.json").exists() else RunStore.create(
        root, {"run_id": root.name, "config": cfg.model_dump(mode="json")})
    task = find_task(cfg.task, cfg.task_dirs)

    def make(config: Any, store: RunStore, **options: Any) -> Search:
        backends = local_backends(config, task, store, planner=planner(), coder=coder(*tags),
                                  evaluators=FakeEvaluators(judge))
        return Search(config, task, store, backends, method_for(config, store.load_solution), **options)

    capfd.readouterr()
    try:
        search = sessions._execute(make, cfg, store, PlainLines(), budget_change=budget_change)
    finally:
        store.close()
    captured = capfd.readouterr()
    return search, (captured.out + captured.err).splitlines()


def history(client: Any, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


# ------------------------------------------------------------------------------------------------ MLflow


def test_mlflow_gets_the_curves_the_ledger_and_the_best_kernel_and_a_resume_goes_on_in_the_same_run(
        tmp_path, capfd, monkeypatch):
    needs("mlflow")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    root = tmp_path / "run"
    first, lines = session(root, ["k1", "broken"], 2, ["mlflow"], capfd)
    assert any("tracking in mlflow: run_id " in line for line in lines), lines
    state = json.loads((root / "tracking.json").read_text())["mlflow"]
    assert state["tracking_uri"] == f"file:{root / 'mlruns'}"

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=state["tracking_uri"])
    run_id = state["run_id"]
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    assert run.data.params["budget.rounds"] == "2" and run.data.params["task"] == "toy_axpy"
    best = dict(history(client, run_id, "best_speedup"))  # the last figure of each round
    assert best == {0: pytest.approx(0.5), 1: pytest.approx(1.25), 2: pytest.approx(1.25)}  # the seed, k1, a crash
    assert [p for _s, p in history(client, run_id, "eval/passed")] == [1.0, 0.0]  # k1 passed, round 2 crashed
    cost = history(client, run_id, "cost_usd")
    assert cost[-1][1] == pytest.approx(first.view.llm_cost_usd) and first.view.llm_cost_usd > 0
    assert [v for _s, v in cost] == sorted(v for _s, v in cost)  # dollars only ever add up

    # Resume with a bigger budget: the same MLflow run, its history continued.
    second, lines = session(root, ["k2", "k4"], 4, ["mlflow"], capfd, budget_change={"rounds": 4})
    assert json.loads((root / "tracking.json").read_text())["mlflow"]["run_id"] == run_id
    runs = client.search_runs([run.info.experiment_id])
    assert [r.info.run_id for r in runs] == [run_id]
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["resume.budget.rounds"] == "4"
    best = dict(history(client, run_id, "best_speedup"))
    assert best == {0: pytest.approx(0.5), 1: pytest.approx(1.25), 2: pytest.approx(1.25), 3: pytest.approx(2.0),
                    4: pytest.approx(2.5)}
    assert [s for s, _v in history(client, run_id, "eval/passed")] == [1, 2, 3, 4]
    assert history(client, run_id, "session")[-1][1] == 1.0
    # The ledger: by role, as the run's read model counts it, as metrics and as a file.
    view = second.view
    folder = tmp_path / "artifacts"
    client.download_artifacts(run_id, "", str(folder))
    assert json.loads((folder / "llm_ledger.json").read_text()) == ledger(view)
    coder_calls = ledger(view)["coder"]["calls"]
    assert coder_calls == 4 and history(client, run_id, "llm.coder.calls")[-1] == (4, coder_calls)
    assert history(client, run_id, "llm.coder.cost_usd")[-1][1] == pytest.approx(4 * PRICE)
    table = json.loads((folder / "evaluations.json").read_text())
    status = table["columns"].index("status")
    assert [row[status] for row in table["rows"]] == ["PASSED", "CRASHED", "PASSED", "PASSED"]
    assert (folder / "best" / "k.py").read_text() == kernel("k4").sources["k.py"]
    assert json.loads((folder / "best" / "solution.json").read_text())["name"] == "k4"


def test_a_tracker_that_fails_mid_run_costs_one_warning_line_not_the_search(tmp_path, capfd, monkeypatch):
    needs("mlflow")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    from mlflow.tracking import MlflowClient

    real = MlflowClient.log_batch
    calls = {"n": 0}

    def full_disk(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] > 4:
            raise OSError(28, "No space left on device")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(MlflowClient, "log_batch", full_disk)
    search, lines = session(tmp_path / "run", ["k1", "k2", "k4"], 3, ["mlflow"], capfd)
    assert search.view.finished == "rounds" and search.view.rounds_used == 3  # the search did not notice
    warnings = [line for line in lines if "tracking in mlflow failed" in line]
    assert len(warnings) == 1 and "No space left on device" in warnings[0], lines
    state = json.loads((tmp_path / "run" / "tracking.json").read_text())
    assert "No space left on device" in state["mlflow_failed"]
    assert "No space left on device" in (tmp_path / "run" / "driver.log").read_text()


# ---------------------------------------------------------------------------------------------- the flag


def test_an_unknown_tracker_and_a_missing_package_are_one_line_before_anything_starts(tmp_path, monkeypatch):
    with pytest.raises(ConfigError) as error:
        settings(task="toy_axpy", track=["wandb,tensorboard"])
    assert str(error.value) == "config: track: unknown tracker 'tensorboard': --track takes wandb or mlflow"
    assert settings(task="toy_axpy", track=["wandb,mlflow", "mlflow"]).track == ["wandb", "mlflow"]

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    config = settings(task="toy_axpy", task_dirs=[str(DATA)], device="cpu", track=["wandb"], ray=False,
                      run_dir=str(tmp_path / "run"))
    with pytest.raises(ConfigError) as error:
        sessions.start(config, progress=False)
    assert str(error.value) == "--track wandb needs `pip install 'ksearch-ray[wandb]'`"
    assert not (tmp_path / "run").exists()


def test_the_cli_flag_is_made_from_the_field_and_takes_both_forms(tmp_path):
    from cli_runner import ksearch

    done = ksearch(tmp_path, "run", "--help", env={"COLUMNS": "200"})
    assert "--track" in done.stdout and "wandb|mlflow" in done.stdout
    done = ksearch(tmp_path, "run", "--task", "toy_axpy", "--task-dir", str(DATA), "--track", "wandb",
                   "--track", "nope", "--no-ray")
    assert done.returncode != 0 and "unknown tracker 'nope'" in done.stdout + done.stderr
    assert not (tmp_path / "runs").exists()


SCRIPT = """
import sys
from pathlib import Path
sys.path.insert(0, {tests!r})
import pytest
from test_tracking import session

class Quiet:
    def readouterr(self):
        class C: out = err = ""
        return C()

search, _ = session(Path({root!r}), ["k1"], 1, [], Quiet())
assert search.view.finished
print(sorted(m for m in ("wandb", "mlflow") if m in sys.modules))
"""


def test_a_run_without_track_imports_neither_tracker(tmp_path):
    done = subprocess.run([sys.executable, "-c", SCRIPT.format(tests=str(TESTS), root=str(tmp_path / "run"))],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"
    assert not (tmp_path / "run" / "tracking.json").exists()
