"""Secrets stay on the trusted side: a candidate's environment is an allow-list, and every secret value
the run holds is redacted from what a candidate produces before it is stored, shown or sent to a model.

The canaries sit where a user keeps them: the variable named by --api-key-env, a database URL and a
package index URL with passwords, a provider key. The end-to-end test runs a real search (no Ray, the
real sandbox, litellm's real HTTP client against a scripted server on loopback) whose coder always
returns a candidate that prints its environment and fails, so its log goes back to the model.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fake_llm_server import Completion, FakeLLMServer, RecordedRequest
from local_backends import settings

from ksearch_ray.evaluation.evaluator import Evaluator
from ksearch_ray.evaluation.sandbox.handle import allowed_variable
from ksearch_ray.evaluation.sandbox.isolation import Isolation
from ksearch_ray.evaluation.settings import Limits
from ksearch_ray.models import Status
from ksearch_ray.report.html import write_report
from ksearch_ray.report.run_tables import Run
from ksearch_ray.session import start
from ksearch_ray.taskspec.task import Task, solution_from_file
from ksearch_ray.text import REDACTED, Redactor, secret_values

DATA = Path(__file__).parent / "data"
CANDIDATES = DATA / "candidates"

CANARIES = {
    "MYLLM_PAT": "canary-pat-5a1f09",  # named by --api-key-env, a name no rule would guess
    "DATABASE_URL": "postgres://u:canarypw@h/db",
    "PIP_INDEX_URL": "https://u:canary@host/simple",
    "OPENAI_API_KEY": "sk-canary-openai-77",
}
PLAN = ('One idea.\n```json\n[{"op": "insert", "parent": "root", "title": "print the environment", '
        '"description": "debug", "difficulty": 1, "score": 0.9, "expected_speedup": 1.1, "rationale": "see"}]\n```')


def _leaks(text: str) -> list[str]:
    found = [name for name, value in CANARIES.items() if value in text]
    return found + (["a canary password"] if "canarypw" in text or "u:canary@" in text else [])


@pytest.fixture
def canaries(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    for name, value in CANARIES.items():
        monkeypatch.setenv(name, value)
    return CANARIES


def test_secret_values_are_found_by_name_by_url_and_by_the_named_variable():
    env = {**CANARIES, "PWD": "/home/u", "HF_HUB_DISABLE_TOKEN": "1", "CUDA_HOME": "/usr/local/cuda",
           "HTTPS_PROXY": "http://proxyuser:proxypass@proxy:3128"}
    values = secret_values(env, ["MYLLM_PAT"])
    assert set(CANARIES.values()) <= values and "canarypw" in values and "proxypass" in values
    assert "/home/u" not in values and "1" not in values and "/usr/local/cuda" not in values
    text = Redactor(values)("key canary-pat-5a1f09, db postgres://u:canarypw@h/db, pw canarypw")
    assert not _leaks(text) and text.count(REDACTED) == 3
    assert not allowed_variable("MYLLM_PAT", "x", refused=frozenset({"MYLLM_PAT"}))
    assert not allowed_variable("CUDA_TOKEN", "x") and not allowed_variable("TRITON_URL", "https://a:b@h/")
    assert allowed_variable("CUDA_VISIBLE_DEVICES", "0") and allowed_variable("LC_ALL", "C.UTF-8")
    assert not allowed_variable("DATABASE_URL", "sqlite:///x") and not allowed_variable("http_proxy", "http://p:3128")


def test_a_candidate_sees_none_of_the_runs_secrets(canaries, tmp_path):
    toy = Task.load(DATA / "toy")
    with Evaluator("cpu", tmp_path / "sb", limits=Limits(idle=30), isolation=Isolation.BEST_EFFORT,
                   secret_names=frozenset({"MYLLM_PAT"})) as ev:
        result = ev.evaluate(toy, solution_from_file(CANDIDATES / "print_environment.py", toy), workload_set="tests")
    assert result.status is Status.RUNTIME_ERROR
    assert "LEAKED=[]" in result.message, result.message


def test_a_secret_value_a_candidate_prints_is_redacted_from_its_result(canaries, tmp_path):
    toy = Task.load(DATA / "toy")
    source = tmp_path / "echo_secret.py"
    source.write_text((CANDIDATES / "echo_secret.py").read_text().replace("@TARGET@", CANARIES["MYLLM_PAT"]))
    with Evaluator("cpu", tmp_path / "sb", limits=Limits(idle=30), secret_names=frozenset({"MYLLM_PAT"})) as ev:
        result = ev.evaluate(toy, solution_from_file(source, toy), workload_set="tests")
    assert result.status is Status.RUNTIME_ERROR
    text = result.model_dump_json()
    assert not _leaks(text), text
    assert f"the key is {REDACTED}" in result.message and f"the key is {REDACTED}" in result.log


@pytest.mark.slow
def test_no_canary_reaches_the_run_directory_the_report_or_the_model(canaries, tmp_path):
    """The attack of issue 36: a candidate that prints its environment put the key named by --api-key-env,
    a database password and an index password into events.jsonl, report.html, the world-model record
    and the LLM request bodies (its failure logs go back to the model)."""
    hostile = "```python\n" + (CANDIDATES / "print_environment.py").read_text() + "```"

    def script(request: RecordedRequest) -> Completion:
        text = " ".join(str(m.get("content")) for m in request.body["messages"])
        if "Output format: edit ops" in text:
            return Completion(PLAN if "initialize" in text.lower() or "Call: propose_actions" in text else
                              "Nothing.\n```json\n[]\n```")
        return Completion(hostile)

    with FakeLLMServer(script) as server:
        config = settings(
            task="toy_axpy", task_dirs=[str(DATA)], model="hosted_vllm/fake-coder", api_base=server.api_base,
            api_key_env="MYLLM_PAT", device="cpu", ray=False, width=1, rounds=3, stagnation_window=3,
            max_retries=0, timeout_s=20, limits={"idle": 20}, run_dir=str(tmp_path / "run"), progress=False,
            noise_repeats=1, confirm_repeats=0,
        )
        search = start(config, progress=False)
        bodies = [json.dumps(r.body) for r in server.chat_requests]
    run_dir = Path(search.store.root)
    events = (run_dir / "events.jsonl").read_text()
    failures = [json.loads(line)["result"] for line in events.splitlines() if '"kind": "evaluation"' in line]
    assert failures and all(r["status"] == "RUNTIME_ERROR" for r in failures)
    assert all("LEAKED=[]" in r["message"] for r in failures), [r["message"] for r in failures]
    assert any("LEAKED=[]" in body for body in bodies[1:])  # the failure did go back to the model
    report = write_report(Run.load(run_dir), tmp_path / "report.html").read_text()
    snapshots = "".join(p.read_text() for p in sorted((run_dir / "world_model").iterdir()))  # deltas, checkpoints
    assert snapshots
    for where, text in [("events.jsonl", events), ("report.html", report), ("world-model record", snapshots),
                        *((f"LLM request body {i}", body) for i, body in enumerate(bodies))]:
        assert not _leaks(text), f"{where} holds {_leaks(text)}"


def test_one_input_secret_per_run_shared_by_its_evaluators_and_kept_for_a_resume(tmp_path):
    from ksearch_ray.run.local import local_backends
    from ksearch_ray.store import RunStore

    config = settings(task="toy_axpy", task_dirs=[str(DATA)], device="cpu", ray=False, evaluators=2)
    store = RunStore(tmp_path / "run")
    store.root.mkdir()
    pool = local_backends(config, Task.load(DATA / "toy"), store).evaluators
    first, second = pool._make(0), pool._make(1)
    try:
        assert first.secret == second.secret == store.seed_secret()  # the same inputs on every evaluator
    finally:
        first.close()
        second.close()
    secret_file = store.root / "seed_secret"
    assert secret_file.stat().st_mode & 0o777 == 0o600
    assert RunStore(store.root).seed_secret() == first.secret  # a resumed session draws the same inputs


def test_a_variable_the_task_declares_reaches_the_candidate_and_a_credential_never_does(tmp_path, monkeypatch):
    import shutil

    bundle = tmp_path / "toy"
    shutil.copytree(DATA / "toy", bundle)
    definition = json.loads((bundle / "task.json").read_text())
    definition["environment"] = ["TOY_BLOCK_HINT", "TOY_SERVICE_TOKEN"]
    (bundle / "task.json").write_text(json.dumps(definition))
    monkeypatch.setenv("TOY_BLOCK_HINT", "128")
    monkeypatch.setenv("TOY_SERVICE_TOKEN", "canary-token-31")
    monkeypatch.setenv("TOY_UNDECLARED", "x")
    probe = tmp_path / "probe.py"
    probe.write_text("import os\n\ndef run(x, a, b):\n"
                     "    raise RuntimeError('SEEN=' + ','.join(sorted(k for k in os.environ if k.startswith('TOY_'))))\n")
    toy = Task.load(bundle)
    with Evaluator("cpu", tmp_path / "sb", limits=Limits(idle=30)) as ev:
        result = ev.evaluate(toy, solution_from_file(probe, toy), workload_set="tests")
    assert result.message.endswith("SEEN=TOY_BLOCK_HINT"), result.message  # not the token, not the undeclared one
