"""What a new user meets, typed as they type it: `ksearch` from a working directory of their own,
relative paths, default options, real sandboxes. The README's first command and the TriMul search run
as subprocesses of the installed package (no PYTHONPATH) on a real Ray of their own; the rest runs in
this process through typer's test runner (`cli_runner`), without Ray where Ray is not the point, and
in a pseudo-terminal where signals and the live view are.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pty
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_runner import ksearch as cli
from fake_llm_server import Completion, FakeLLMServer, HTTPError, always

from ksearch_ray.events import Baseline, Candidate, Evaluation, Resume, Stopped
from ksearch_ray.store import RunStore

DATA = Path(__file__).parent / "data"
TOY = ["--task", "toy_axpy", "--task-dir", "data", "--device", "cpu"]
FEW_BASELINES = ["--noise-repeats", "2"]
"""These searches are about what a user meets, not about the noise's precision (tests/test_run_noise.py and
tests/test_noise_reproducible.py are): two baseline measurements a session, not the default two dozen."""
LOCAL = [*TOY, "--no-ray", *FEW_BASELINES]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RAY_ADDRESS")}
    return {**env, "RAY_AUTH_MODE": "disabled", "COLUMNS": "80"}


def ksearch(cwd: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ksearch_ray", *args], cwd=cwd, env={**_env(), **(env or {})},
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A user's own working directory, holding a copy of the test task bundles as `data/`."""
    shutil.copytree(DATA, tmp_path / "data", ignore=shutil.ignore_patterns("candidates"))
    return tmp_path


def _events(run_dir: Path) -> list:
    return RunStore(run_dir).read_events()


def _only_run(home: Path) -> Path:
    runs = list((home / "runs").iterdir())
    assert len(runs) == 1, runs
    return runs[0]


def test_search_with_default_run_dir_then_resume_with_a_relative_path_and_a_bigger_budget(home):
    first = cli(home, "run", *LOCAL, "--width", "2", "--rounds", "3", "--confirm-repeats", "2")
    assert first.returncode == 0, first.stderr + first.stdout
    run_dir = _only_run(home)
    evaluations = [e for e in _events(run_dir) if isinstance(e, Evaluation)]
    assert evaluations and all(e.result.passed for e in evaluations), evaluations
    # Plain lines on stdout: the path is printed whole even in an 80-column pipe; the policy is named.
    assert f"run directory: {run_dir}" in first.stdout.splitlines()
    assert "offline policy" in first.stdout and "offline policy" in first.stderr
    said = " ".join(first.stderr.split())
    assert "nine in ten repeated measurements of one kernel differ by less" in said  # what the noise figure is
    assert "measured 2x on each of 1 evaluator(s) after a warm-up in" in said  # what the start spent on it
    assert "one evaluation takes about" in said and "more round(s) at width 2" in said  # how long the run will take
    assert "new candidates are screened (timed by the full rule with max_calls 20, target_rel_err 0.01)" in said
    assert all("below 1.00% of the mean" in e.result.timing_rule for e in evaluations)  # the screening rule, by default
    # Re-timed twice, or once where the first repeat already settled it (on a noisy CPU a best may lose).
    retimed = re.search(r"re-timed (\d)x, interleaved with the baseline: .*", first.stdout)
    assert retimed and (retimed[1] == "2" or "stopped early: decisive" in retimed[0]), first.stdout
    assert "±" in first.stdout
    assert (run_dir / "best").is_dir() and any((run_dir / "best").iterdir())

    relative = run_dir.relative_to(home)
    more = cli(home, "resume", str(relative), "--rounds", "5")
    assert more.returncode == 0, more.stderr + more.stdout
    events = _events(run_dir)
    assert sorted(e.round for e in events if isinstance(e, Candidate)) == [1, 2, 3, 4, 5]
    assert all(e.result.passed for e in events if isinstance(e, Evaluation))
    resumed = [e for e in events if isinstance(e, Resume)]
    assert resumed and resumed[-1].budget == {"rounds": 5}
    # The resumed session measured the baseline again before spending a round.
    first_round = next(e.seq for e in events if isinstance(e, Candidate) and e.round == 4)
    assert any(isinstance(e, Baseline) and resumed[-1].seq < e.seq < first_round for e in events)


@pytest.mark.slow
def test_readme_main_job_and_eval_with_a_relative_work_dir(home):
    main_job = ksearch(home, "eval", "--task", "trimul", "triton_seed")
    assert main_job.returncode == 0, main_job.stderr + main_job.stdout
    assert "PASSED" in main_job.stdout
    local = cli(home, "eval", *TOY, "good", "--work-dir", "scratch", "--json")
    assert local.returncode == 0, local.stderr
    assert json.loads(local.stdout)["result"]["status"] == "PASSED"
    assert "correct on" in local.stderr  # progress per workload


@pytest.mark.slow
def test_trimul_search_from_a_fresh_directory_on_a_ray_of_its_own(home, monkeypatch):
    # Tracked in MLflow where the extra is installed (the README's test command installs it): the
    # driver of a Ray run feeds the tracker as an in-process run does.
    track = ["--track", "mlflow"] if importlib.util.find_spec("mlflow") else []
    result = ksearch(home, "run", "--task", "trimul", "--width", "1", "--rounds", "1", "--workloads", "smoke",
                     "--noise-repeats", "1", "--confirm-repeats", "0", *track)
    assert result.returncode == 0, result.stderr + result.stdout
    assert "starting Ray" in result.stderr and "offline policy" in result.stderr
    run_dir = _only_run(home)
    events = _events(run_dir)
    assert [e.result.status.value for e in events if isinstance(e, Evaluation)] == ["PASSED"]
    if track:
        from mlflow.tracking import MlflowClient

        monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 reads a file store only when told to
        state = json.loads((run_dir / "tracking.json").read_text())["mlflow"]
        client = MlflowClient(tracking_uri=state["tracking_uri"])
        run = client.get_run(state["run_id"])
        assert run.info.status == "FINISHED" and run.data.params["task"] == "trimul"
        assert [m.value for m in client.get_metric_history(state["run_id"], "eval/passed")] == [1.0]


def _needs_a_secret(home: Path) -> None:
    """A task bundle whose reference needs an environment variable the sandbox scrubs."""
    reference = home / "data" / "toy" / "reference.py"
    reference.write_text(
        "import os\nif 'KSEARCH_TEST_TOKEN' not in os.environ:\n"
        "    raise RuntimeError('this reference needs KSEARCH_TEST_TOKEN')\n" + reference.read_text()
    )


def test_a_sandbox_that_cannot_start_stops_the_run_with_its_cause_and_resume_checks_again(home):
    _needs_a_secret(home)
    env = {"KSEARCH_TEST_TOKEN": "1"}
    result = cli(home, "run", *LOCAL, "--rounds", "3", env=env)
    assert result.returncode == 3, result.stderr + result.stdout
    said = " ".join(result.stderr.split())
    assert "the sandbox could not start a worker" in said and "needs KSEARCH_TEST_TOKEN" in said
    assert "Traceback" not in result.stderr
    run_dir = _only_run(home)
    assert f"ksearch resume {run_dir}" in said
    again = cli(home, "resume", str(run_dir.relative_to(home)), env=env)
    assert again.returncode == 3 and "the sandbox could not start a worker" in again.stderr
    events = _events(run_dir)
    assert not any(isinstance(e, Candidate | Evaluation) for e in events)
    assert sum(isinstance(e, Stopped) for e in events) == 2


def test_a_rejected_api_key_ends_the_run_loudly_and_it_resumes_once_fixed(home):
    with FakeLLMServer(always(HTTPError(401, "Incorrect API key provided"))) as server:
        args = ["run", *LOCAL, "--rounds", "2", "--model", "hosted_vllm/m", "--api-base", server.api_base,
                "--from-solution", "triton_seed"]
        result = cli(home, *args)
        asked = len(server.chat_requests)
    assert result.returncode == 3, result.stderr + result.stdout
    said = " ".join(result.stderr.split())
    assert "retrying cannot fix it" in said and "auth" in said and "Incorrect API key" in said
    assert asked == 1  # no retries of an authentication error, no further calls
    run_dir = _only_run(home)
    assert not any(isinstance(e, Candidate) for e in _events(run_dir))

    plan = '```json\n[{"op": "insert", "parent": "root", "title": "fma", "difficulty": 1, "score": 0.9, "expected_speedup": 1.1}]\n```'
    code = "```python\ndef run(x, a, b):\n    return a * x + b\n```"

    def answer(request):
        text = json.dumps(request.body["messages"])
        return Completion(plan if "edit ops" in text else code)

    with FakeLLMServer(answer) as fixed:
        # The model settings are part of the run; a user fixes the key (or the server), not the run.
        manifest = json.loads((run_dir / "manifest.json").read_text())
        manifest["config"]["llm"]["api_base"] = fixed.api_base
        (run_dir / "manifest.json").write_text(json.dumps(manifest))
        resumed = cli(home, "resume", str(run_dir))
    assert resumed.returncode == 0, resumed.stderr + resumed.stdout
    assert sum(isinstance(e, Candidate) for e in _events(run_dir)) == 2


@pytest.mark.slow
def test_waiting_is_visible_a_second_writer_is_refused_and_ctrl_c_prints_the_resume_command(home):
    with FakeLLMServer(always(Completion("never sent", delay_s=3600))) as server:
        main, follower = pty.openpty()
        proc = subprocess.Popen(
            [sys.executable, "-m", "ksearch_ray", "run", *LOCAL, "--rounds", "2", "--model", "hosted_vllm/m",
             "--api-base", server.api_base, "--run-dir", "hanging"],
            cwd=home, env={**_env(), "TERM": "xterm", "COLUMNS": "100"}, stdin=follower, stdout=follower,
            stderr=follower, start_new_session=True,
        )
        os.close(follower)
        screen = b""
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not (b"planner initialize_tree" in screen and b" s" in screen):
            ready, _, _ = select.select([main], [], [], 1.0)
            if ready:
                try:
                    screen += os.read(main, 65536)
                except OSError:
                    break
        text = screen.decode(errors="replace")
        assert "waiting for" in text and "planner initialize_tree" in text, text[-3000:]
        assert f"run directory {home / 'hanging'}" in " ".join(text.split()), text[-3000:]  # in the live view's header
        assert "since" in text and "waiting for / for" not in text

        second = cli(home, "resume", "hanging")
        assert second.returncode == 2
        assert "is in use by process" in second.stderr and "Traceback" not in second.stderr

        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in the terminal does
        rest = b""
        end = time.monotonic() + 60
        while time.monotonic() < end and proc.poll() is None:
            ready, _, _ = select.select([main], [], [], 0.5)
            if ready:
                try:
                    rest += os.read(main, 65536)
                except OSError:
                    break
        proc.wait(timeout=60)
        os.close(main)
    tail = " ".join(rest.decode(errors="replace").split())
    assert proc.returncode == 130, tail
    assert f"interrupted; resume with: ksearch resume {home / 'hanging'}" in tail
    assert any(isinstance(e, Stopped) and e.reason == "interrupted" for e in _events(home / "hanging"))


def test_the_seed_stays_the_best_when_nothing_beats_it(home):
    slow = "```python\nimport time\n\ndef run(x, a, b):\n    time.sleep(0.2)\n    return a * x + b\n```"
    plan = '```json\n[{"op": "insert", "parent": "root", "title": "sleep", "difficulty": 1, "score": 0.9, "expected_speedup": 1.1}]\n```'

    def answer(request):
        return Completion(plan if "edit ops" in json.dumps(request.body["messages"]) else slow)

    with FakeLLMServer(answer) as server:
        result = cli(home, "run", *LOCAL, "--rounds", "2", "--model", "hosted_vllm/m", "--api-base", server.api_base,
                     "--from-solution", "good", "--confirm-repeats", "1")
    assert result.returncode == 0, result.stderr + result.stdout
    assert "best: the seed; the search found nothing faster" in result.stdout
    run_dir = _only_run(home)
    best = json.loads((run_dir / "best.json").read_text())
    assert best["node"] == "root" and best["solution"]["name"] == "good"
    assert (run_dir / "best" / "good.py").read_text() == (DATA / "toy" / "solutions" / "good" / "good.py").read_text()
    # The toy task is no FlashInfer-Bench definition: its best is in best/, and export says so in one line.
    exported = cli(home, "export", str(run_dir.relative_to(home)), "--task-dir", "data")
    assert exported.returncode == 2 and "is not a FlashInfer-Bench definition" in exported.stderr, exported.stderr


def test_a_model_run_starts_from_the_seed_says_so_and_shows_what_a_model_said_instead_of_code(home):
    prose = "I am sorry, but I cannot help with writing kernels today. Perhaps ask again later?"
    plan = '```json\n[{"op": "insert", "parent": "root", "title": "x", "difficulty": 1, "score": 0.9, "expected_speedup": 1.1}]\n```'

    def answer(request):
        return Completion(plan if "edit ops" in json.dumps(request.body["messages"]) else prose)

    with FakeLLMServer(answer) as server:
        result = cli(home, "run", *LOCAL, "--rounds", "1", "--model", "hosted_vllm/m", "--api-base", server.api_base,
                     "--confirm-repeats", "0")
        # Every reply was prose: the run evaluated nothing of its own, and says so (exit 4, not "finished").
        assert result.returncode == 4, result.stderr + result.stdout
        assert result.stdout.startswith("no candidate evaluated: 1 replies, none had usable code"), result.stdout
        said = " ".join(result.stderr.split())
        assert "starting from the seed triton_seed" in said  # the default with a model too, said at the start
        assert "no code" in said and "the reply began: 'I am sorry, but I cannot help" in said
        run_dir = _only_run(home)
        assert cli(home, "report", str(run_dir)).returncode == 0
        assert "the reply began: I am sorry, but I cannot help" in (run_dir / "report.html").read_text()
        spec = cli(home, "run", *LOCAL, "--rounds", "1", "--model", "hosted_vllm/m", "--api-base", server.api_base,
                   "--confirm-repeats", "0", "--start", "spec", "--run-dir", "from-spec")
    assert spec.returncode == 4, spec.stderr
    assert "starting from the specification" in spec.stderr
    assert "the seed" not in spec.stdout and "started from the specification" in spec.stdout


def test_show_without_a_run_directory_shows_the_latest_and_a_config_typo_is_one_line_with_a_guess(home):
    assert cli(home, "show").returncode == 2  # no runs yet: one line that says so
    assert cli(home, "report").returncode == 2
    first = cli(home, "run", *TOY, "--no-ray", "--rounds", "1", "--confirm-repeats", "0", "--noise-repeats", "1")
    assert first.returncode == 0, first.stderr
    shown = cli(home, "show")
    assert shown.returncode == 0 and f"showing the latest run: runs/{_only_run(home).name}" in shown.stderr
    assert "finished (rounds)" in shown.stdout
    reported = cli(home, "report")  # like show, the latest run when none is named
    assert reported.returncode == 0 and f"reporting on the latest run: runs/{_only_run(home).name}" in reported.stderr
    assert (_only_run(home) / "report.html").is_file()
    (home / "typo.yaml").write_text("search:\n  widht: 3\n")
    typo = cli(home, "run", "--config", "typo.yaml", *LOCAL)
    assert typo.returncode == 2 and len(typo.stderr.strip().splitlines()) == 1
    assert "typo.yaml: unknown setting search.widht (did you mean search.width?)" in " ".join(typo.stderr.split())
    flat = cli(home, "run", "--config", "flat.yaml", *LOCAL) if (home / "flat.yaml").write_text("width: 3\n") else None
    assert flat is not None and "unknown setting width (did you mean search.width?)" in " ".join(flat.stderr.split())


def test_bad_paths_get_one_line_errors(home):
    (home / "afile").write_text("not a directory")
    (home / "emptydir").mkdir()
    cases = [
        (["run", *TOY, "--run-dir", "afile"], "exists and is not a directory"),
        (["eval", *TOY, "emptydir"], "not a solution directory (no solution.json)"),
        (["export", "emptydir"], "neither a run directory (no manifest.json) nor a solution directory"),
        (["export", "emptydir", "--task", "trimul"], "neither a run directory"),
    ]
    for args, message in cases:
        result = cli(home, *args)
        assert result.returncode == 2, (args, result.stderr)
        assert message in " ".join(result.stderr.split()), (args, result.stderr)
        assert "Traceback" not in result.stderr + result.stdout
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_help_shows_the_defaults_and_every_option_in_a_pipe(home):
    result = ksearch(home, "run", "--help")
    text = " ".join(result.stdout.split())
    assert "[default: 40]" in text and "[default: 2]" in text and "[default: fresh]" in text
    assert "runs/<task>-<time>-<id>" in text  # the run directory's default, uncut


def test_the_task_default_seed_decides_where_a_run_starts_and_a_wrong_one_is_refused_in_one_line(home):
    toy = home / "data" / "toy"
    shutil.copytree(toy / "solutions" / "triton_seed", toy / "solutions" / "a_seed")  # first by name now
    meta = json.loads((toy / "solutions" / "a_seed" / "solution.json").read_text())
    (toy / "solutions" / "a_seed" / "solution.json").write_text(json.dumps({**meta, "name": "a_seed"}))
    run = [*LOCAL, "--rounds", "1", "--confirm-repeats", "0"]
    spec = json.loads((toy / "task.json").read_text())

    first = cli(home, "run", *run, "--run-dir", "by-name")
    assert first.returncode == 0, first.stderr + first.stdout
    assert "starting from the seed a_seed" in " ".join(first.stderr.split())

    (toy / "task.json").write_text(json.dumps({**spec, "default_seed": "triton_seed"}))
    second = cli(home, "run", *run, "--run-dir", "by-default")
    assert second.returncode == 0, second.stderr + second.stdout
    assert "starting from the seed triton_seed" in " ".join(second.stderr.split())

    (toy / "task.json").write_text(json.dumps({**spec, "default_seed": "trition_seed"}))
    wrong = cli(home, "run", *run, "--run-dir", "wrong")
    assert wrong.returncode != 0 and "Traceback" not in wrong.stderr
    [line] = [ln for ln in wrong.stderr.splitlines() if "default_seed" in ln]
    assert "'trition_seed' is not a solution" in line
    assert not (home / "wrong").exists()  # refused before anything was written
