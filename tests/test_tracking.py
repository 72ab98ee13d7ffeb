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
import time
from pathlib import Path
from typing import Any

import pytest
from local_backends import DATA, FakeEvaluators, ScriptedPolicy, idea_planner, settings
from local_backends import toy_kernel as kernel

import ksearch_ray
from ksearch_ray import session as sessions
from ksearch_ray.config import ConfigError
from ksearch_ray.methods.registry import method_for
from ksearch_ray.models import Solution, Status
from ksearch_ray.policies.contract import CodeReply, CodeRequest
from ksearch_ray.policies.llm_call import LLMCall
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



def call(kind: str) -> LLMCall:
    return LLMCall(kind=kind, model="scripted", prompt_tokens=100, completion_tokens=20, cost_usd=PRICE,
                   cost_known=True, request_hash=kind, attempts=1)


def planner() -> ScriptedPolicy:
    return idea_planner(lambda: [call("plan")])


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


README_READBACK = """
from mlflow import MlflowClient
client = MlflowClient(tracking_uri="sqlite:///RUN_DIR/mlflow.db")
run = client.search_runs([client.get_experiment_by_name("ksearch-ray").experiment_id])[0]
print(run.info.status, run.data.metrics["best_speedup"])
"""
"""The README's read-back of a run tracked in MLflow, verbatim but for RUN_DIR."""


def test_mlflow_gets_the_curves_the_ledger_and_the_best_kernel_and_a_resume_goes_on_in_the_same_run(
        tmp_path, capfd, monkeypatch):
    needs("mlflow")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    root = tmp_path / "run"
    first, lines = session(root, ["k1", "broken"], 2, ["mlflow"], capfd)
    assert any("tracking in mlflow: run_id " in line for line in lines), lines
    state = json.loads((root / "tracking.json").read_text())["mlflow"]
    assert state["tracking_uri"] == f"sqlite:///{root / 'mlflow.db'}"
    # Read back as the README says, in a fresh process that sets nothing for MLflow.
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    readback = subprocess.run([sys.executable, "-c", README_READBACK.replace("RUN_DIR", str(root))], env=env,
                              capture_output=True, text=True, timeout=120)
    assert readback.returncode == 0, readback.stderr
    assert readback.stdout.split() == ["FINISHED", "1.25"], readback.stdout

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
    # The advice installs the checkout where the package runs from one (an editable install), else the
    # released package (CI installs it with `pip install .`).
    checkout = (Path(ksearch_ray.__file__).resolve().parents[1] / "pyproject.toml").is_file()
    hint = "`pip install '.[wandb]'` (in " if checkout else "`pip install 'ksearch-ray[wandb]'`"
    assert str(error.value).startswith(f"--track wandb needs {hint}"), error.value
    assert not (tmp_path / "run").exists()


def test_online_wandb_without_a_key_is_one_line_before_anything_starts(tmp_path, monkeypatch):
    for variable in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))  # none: never logged in
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())
    config = settings(task="toy_axpy", task_dirs=[str(DATA)], device="cpu", track=["wandb"], ray=False,
                      run_dir=str(tmp_path / "run"))
    with pytest.raises(ConfigError, match=r"^--track wandb: not logged in to W&B"):
        sessions.start(config, progress=False)
    assert not (tmp_path / "run").exists()
    (tmp_path / "netrc").write_text("machine api.wandb.ai login user password k\n")
    (tmp_path / "netrc").chmod(0o600)
    from ksearch_ray.tracking import check_trackers

    check_trackers(config)  # logged in: no complaint
    monkeypatch.setenv("NETRC", str(tmp_path / "nothing"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    check_trackers(config)


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
import time
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


# ------------------------------------------------------------------------------------------------- W&B


def wandb_records(path: Path) -> list[Any]:
    """The records of an offline run's .wandb file, read with W&B's own protobuf schema.

    W&B 0.31 ships no reader of its own (its core, in Go, reads them): the file is a LevelDB-style log
    (a 7-byte header, then 32 KiB blocks of records: crc32 u32, length u16, type u8 = full, first,
    middle, last), each record a `wandb_internal_pb2.Record`."""
    import struct

    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", path
    block, header, pos = 32 * 1024, 7, 7
    records, parts = [], []
    while pos + header <= len(data):
        left = block - pos % block
        if left < header:  # the rest of a block too short for a record header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + header])
        body = data[pos + header:pos + header + length]
        pos += header + length
        if kind == 1:
            records.append(pb.Record.FromString(body))
        elif kind == 2:
            parts = [body]
        elif kind == 3:
            parts.append(body)
        elif kind == 4:
            records.append(pb.Record.FromString(b"".join([*parts, body])))
    return records


def finished_records(path: Path, wait_s: float = 10.0) -> list[Any]:
    """The records once W&B's core (its own process) has written the run's exit record: `finish()` hands
    the end over to it, and the last records can reach the file a moment later."""
    from google.protobuf.message import DecodeError

    deadline = time.monotonic() + wait_s
    while True:
        try:
            records = wandb_records(path)
        except DecodeError:  # a record read while the core was still writing it: read again (once past, fail)
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
            continue
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.05)


def wandb_history(records: list[Any]) -> list[tuple[int, dict[str, Any]]]:
    out = []
    for r in records:
        if r.WhichOneof("record_type") == "history":
            out.append((r.history.step.num, {item.key or "/".join(item.nested_key): json.loads(item.value_json)
                                             for item in r.history.item}))
    return out


def test_wandb_offline_gets_the_curves_the_ledger_and_the_best_kernel_and_a_resume_goes_on_in_the_same_run(
        tmp_path, capfd, monkeypatch):
    needs("wandb")
    home = tmp_path / "home"
    for variable in ("HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME"):
        monkeypatch.setenv(variable, str(home))
    for variable in ("WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(home / "config"))  # the user's own W&B settings stay theirs
    monkeypatch.setenv("WANDB_MODE", "offline")
    root = tmp_path / "run"
    session(root, ["k1", "broken"], 2, ["wandb"], capfd)
    run_id = json.loads((root / "tracking.json").read_text())["wandb"]["id"]
    second, lines = session(root, ["k2", "k4"], 4, ["wandb"], capfd, budget_change={"rounds": 4})
    assert json.loads((root / "tracking.json").read_text())["wandb"]["id"] == run_id
    # Offline, each session is a local directory of the same run id; `wandb sync --id` joins them.
    dirs = sorted((root / "wandb").glob(f"offline-run-*-{run_id}"))
    assert len(dirs) == 2, list((root / "wandb").iterdir())
    sessions_ = [finished_records(d / f"run-{run_id}.wandb") for d in dirs]
    histories = [wandb_history(records) for records in sessions_]
    assert max(s for s, _ in histories[0]) < min(s for s, _ in histories[1])  # the history goes on
    rows = [row for h in histories for _s, row in h]
    best: dict[int, float] = {}
    for row in rows:
        if "best_speedup" in row:
            best[row["round"]] = row["best_speedup"]
    assert best == {0: pytest.approx(0.5), 1: pytest.approx(1.25), 2: pytest.approx(1.25), 3: pytest.approx(2.0),
                    4: pytest.approx(2.5)}
    assert [r["eval/status"] for r in rows if "eval/status" in r] == ["PASSED", "CRASHED", "PASSED", "PASSED"]
    costs = [r["cost_usd"] for r in rows if "cost_usd" in r]
    assert costs == sorted(costs) and costs[-1] == pytest.approx(second.view.llm_cost_usd) and costs[-1] > 0
    # The ledger, in the summary of the last session, as the read model counts it.
    summary = {item.key: json.loads(item.value_json) for r in sessions_[1] if r.WhichOneof("record_type") == "summary"
               for item in r.summary.update}
    assert summary["llm"] == ledger(second.view) and summary["llm"]["coder"]["calls"] == 4
    assert summary["best_speedup"] == pytest.approx(2.5) and summary["rounds"] == 4
    config = {item.key: json.loads(item.value_json) for r in sessions_[1] if r.WhichOneof("record_type") == "config"
              for item in r.config.update}
    assert config["budget.rounds"] == 4 and config["task"] == "toy_axpy"
    files = dirs[1] / "files"
    assert (files / "best" / "k.py").read_text() == kernel("k4").sources["k.py"]
    assert any(r.WhichOneof("record_type") == "artifact" and r.artifact.type == "code" for r in sessions_[1])
    # W&B staged the artifact inside the run directory, and wrote nothing under the home beside its settings.
    assert [p for p in (root / "wandb" / "staging").rglob("*") if p.is_file()]
    assert not [p for p in home.rglob("*") if p.is_file() and not p.is_relative_to(home / "config")]
    tables = [json.loads(p.read_text()) for p in (files / "media" / "table").glob("evaluations_*.table.json")]
    assert [row[4] for row in tables[0]["data"]] == ["PASSED", "CRASHED", "PASSED", "PASSED"]
