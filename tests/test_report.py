"""What a user can look at: `ksearch report`, `ksearch show` (and --follow, --json), `ksearch tasks`.

Two real runs feed the tests: an offline search started with `ksearch run` while
`ksearch show --follow` watches it from another process, and an LLM search (in this process) against
the scripted loopback server whose replies include failing kernels and hostile markup in titles and
code. The HTML report is opened in a real headless Chromium.
"""

from __future__ import annotations

import fcntl
import io
import json
import os
import pty
import re
import shutil
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from cli_runner import ksearch as cli
from fake_llm_server import Completion, FakeLLMServer, HTTPError, RecordedRequest

from ksearch_ray.events import NO_CODE
from ksearch_ray.models import Status

ROOT = Path(__file__).parent.parent
DATA = Path(__file__).parent / "data"

HOSTILE = '<img src=x onerror="console.error(1)">'
"""Markup a model might write anywhere; the report must show it as text, never as HTML."""


def ksearch(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 600):  # type: ignore[no-untyped-def]
    return cli(cwd, *args, env=env)


def ksearch_popen(*args: str, cwd: Path) -> subprocess.Popen[str]:
    environ = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled", "COLUMNS": "80"}
    environ.pop("RAY_ADDRESS", None)
    return subprocess.Popen([sys.executable, "-m", "ksearch_ray", *args], cwd=cwd, env=environ, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


def events_of(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


# ------------------------------------------------------------------------------- an offline run, watched


class Lines:
    """A process's standard output, line by line as it comes, with the time each line arrived."""

    def __init__(self, proc: subprocess.Popen[str]):
        self.proc = proc
        self.lines: list[tuple[float, str]] = []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append((time.time(), line.rstrip("\n")))

    def wait_for(self, text: str, timeout_s: float = 120) -> float:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for at, line in self.lines:
                if text in line:
                    return at
            time.sleep(0.1)
        raise AssertionError(f"no line with {text!r} within {timeout_s} s: {self.text()}")

    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)


@dataclass
class WatchedRun:
    cwd: Path
    run_dir: Path
    follow: Lines
    follow_started: float
    follow_returncode: int
    follow_stderr: str


@pytest.fixture(scope="module")
def watched(tmp_path_factory) -> WatchedRun:
    """`ksearch run` in one process, `ksearch show --follow` started beside it as soon as the run exists."""
    cwd = tmp_path_factory.mktemp("user")
    run_dir = cwd / "runs" / "toy"
    run = ksearch_popen("run", "--task", "toy_axpy", "--task-dir", str(DATA), "--device", "cpu", "--rounds", "4",
                        "--width", "1", "--run-dir", "runs/toy", "--no-progress", "--no-ray", cwd=cwd)
    deadline = time.monotonic() + 300
    while not (run_dir / "manifest.json").exists():
        assert run.poll() is None, run.communicate()
        assert time.monotonic() < deadline, "the run never created its directory"
        time.sleep(0.2)
    proc = ksearch_popen("show", "--follow", "runs/toy", cwd=cwd)
    follow = Lines(proc)
    started = follow.wait_for("following runs/toy")
    run_out, run_err = run.communicate(timeout=600)
    assert run.returncode == 0, run_out + run_err
    proc.wait(timeout=60)  # it must stop by itself once the run has ended
    follow.thread.join(10)
    assert proc.stderr is not None
    return WatchedRun(cwd, run_dir, follow, started, proc.returncode, proc.stderr.read())


@pytest.mark.slow
def test_follow_prints_each_evaluation_of_a_live_run_and_stops_when_it_ends(watched):
    events = events_of(watched.run_dir)
    evaluations = [e for e in events if e["kind"] == "evaluation"]
    assert watched.follow_started < evaluations[-1]["t"]  # it was watching while the run went on
    assert watched.follow_returncode == 0, watched.follow_stderr
    lines = watched.follow.text().splitlines()
    for ev in evaluations:
        status = ev["result"]["status"]
        assert any(f"round {ev['round']} " in line and status in line for line in lines), (ev["round"], lines)
    bests = [e for e in events if e["kind"] == "best" and e["why"] == "new best"]
    assert sum("new best" in line for line in lines) == len(bests)
    assert lines[-1].endswith("run ended: rounds")


@pytest.mark.slow
def test_follow_reads_a_line_being_written_and_stops_on_ctrl_c_with_one_line(watched, tmp_path):
    run_dir = tmp_path / "copy"
    shutil.copytree(watched.run_dir, run_dir, ignore=shutil.ignore_patterns("sandbox"))
    raw = (run_dir / "events.jsonl").read_bytes().splitlines(keepends=True)
    first_eval = next(i for i, line in enumerate(raw) if b'"kind": "evaluation"' in line)
    ev = json.loads(raw[first_eval])
    # The log as a busy driver leaves it: the first evaluation only half written.
    (run_dir / "events.jsonl").write_bytes(b"".join(raw[:first_eval]) + raw[first_eval][:40])
    proc = ksearch_popen("show", "--follow", "copy", cwd=tmp_path)
    follow = Lines(proc)
    try:
        follow.wait_for(" baseline on evaluator 0 PASSED")
        time.sleep(1.5)  # a few polls over the half line
        assert f"round {ev['round']} " not in follow.text()
        with open(run_dir / "events.jsonl", "ab") as f:  # the writer finishes the line
            f.write(raw[first_eval][40:])
        follow.wait_for(f"round {ev['round']} ")
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    follow.thread.join(10)
    assert proc.returncode == 130
    assert proc.stderr is not None and proc.stderr.read().strip() == "stopped following copy; the run itself goes on"
    assert sum(f"round {ev['round']} " in line for line in follow.text().splitlines()) == 1
    assert "run ended" not in follow.text()


@pytest.mark.slow
def test_follow_stops_when_the_session_stops_early_and_the_report_says_how_to_go_on(watched, tmp_path):
    run_dir = tmp_path / "stopped"
    shutil.copytree(watched.run_dir, run_dir, ignore=shutil.ignore_patterns("sandbox", "lock"))
    events = [e for e in events_of(run_dir) if e["kind"] not in ("confirm", "run_end")]
    events.append({"seq": events[-1]["seq"] + 1, "t": events[-1]["t"] + 1, "kind": "stopped", "reason": "interrupted"})
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    followed = ksearch("show", "--follow", "stopped", cwd=tmp_path, timeout=60)
    assert followed.returncode == 0, followed.stderr
    assert followed.stdout.splitlines()[-1].endswith("session stopped: interrupted")
    summary = json.loads(ksearch("show", "--json", "stopped", cwd=tmp_path).stdout)
    assert summary["finished"] is None and summary["stopped"] == "interrupted"
    assert ksearch("report", "stopped", cwd=tmp_path).returncode == 0
    html = (run_dir / "report.html").read_text()
    assert "stopped: interrupted" in html and f"ksearch resume {run_dir.resolve()}" in html


@pytest.mark.slow
def test_show_and_report_take_relative_paths_from_the_users_directory(watched):
    shown = ksearch("show", "runs/toy", cwd=watched.cwd, env={"COLUMNS": "80"})
    assert shown.returncode == 0, shown.stderr
    assert "candidates: PASSED" in shown.stdout and "finished (rounds)" in shown.stdout
    made = ksearch("report", "runs/toy", cwd=watched.cwd)
    assert made.returncode == 0, made.stderr
    assert (watched.run_dir / "report.html").is_file() and "wrote runs/toy/report.html" in made.stderr
    html = (watched.run_dir / "report.html").read_text()
    assert "finished: rounds" in html and "No LLM calls" in html
    # The settings say what the defaults resolved to; the per-workload bars are on a log scale whose full width
    # is parity: far below 1 (the CPU path) a bar is short, neither full (misread as a win) nor a tick; names
    # wrap anywhere.
    assert "(none given: started from triton_seed)" in html and "(the task&#x27;s default: benchmarks)" in html
    widths = [int(w) for w in re.findall(r'class="bar" style="width:(\d+)%"', html)]
    assert widths and all(1 < w < 100 for w in widths), widths
    assert "full width 1.00x (parity)" in html and "overflow-wrap: anywhere" in html


@pytest.mark.slow
def test_follow_in_a_terminal_draws_a_finished_run_once_and_returns(watched):
    screen = _in_a_terminal(["show", "--follow", "runs/toy"], 80, watched.cwd)
    assert "finished (rounds)" in screen and "recent evaluations" in screen and "Traceback" not in screen


def test_report_of_a_run_that_has_only_just_started_says_what_is_missing(tmp_path):
    from ksearch_ray.report.html import render
    from ksearch_ray.report.run_tables import Run

    run_dir = tmp_path / "fresh"
    run_dir.mkdir()
    (run_dir / "manifest.json").write_text(json.dumps({"run_id": "fresh", "schema": 2, "created": time.time(),
                                                       "config": {"task": "toy_axpy", "budget": {"rounds": 5}}}))
    html = render(Run.load(run_dir))
    for said in ("not finished", "Nothing has been measured yet.", "The world model has not been created yet.",
                 "No evaluations yet.", "The baseline has not been measured yet.", "No LLM calls", "No best solution yet."):
        assert said in html, said


def test_show_and_report_refuse_what_is_not_a_run_in_one_line(tmp_path):
    (tmp_path / "afile").write_text("x")
    for args in (["show", "afile"], ["show", "--follow", "nowhere"], ["report", "afile"], ["show", "--json", "nowhere"]):
        result = ksearch(*args, cwd=tmp_path)
        assert result.returncode == 2, (args, result.stderr)
        assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert "is a file" in result.stderr or "is not a run directory" in result.stderr


# ----------------------------------------------------------------------------------- an LLM run, failing a lot

CODE = "```python\n# model says: " + HOSTILE + "\ndef run(x, a, b):\n    return a * x + b\n```"
SYNTAX = "```python\n# " + HOSTILE + "\ndef run(x, a, b)\n    return a * x + b\n```"
WRONG = "```python\ndef run(x, a, b):\n    return a * x - b\n```"
CRASH = "```python\nimport os\n\ndef run(x, a, b):\n    os.abort()\n```"
PROSE = "I would rather not write code today."
PLAN = """```json
[
 {"op": "insert", "parent": "root", "title": "fuse it TITLE", "description": "DESC", "difficulty": 1, "score": 0.9, "expected_speedup": 1.2, "rationale": "one kernel"},
 {"op": "insert", "parent": "root", "title": "vectorize", "description": "wider loads", "difficulty": 2, "score": 0.7, "expected_speedup": 1.1, "rationale": "bandwidth"}
]
```""".replace("TITLE", HOSTILE.replace('"', '\\"')).replace("DESC", "</details><script>console.error(2)</script>")


class Script:
    def __init__(self, coder_steps):
        self.coder_steps = list(coder_steps)
        self.lock = threading.Lock()
        self.planner_calls = 0

    def __call__(self, request: RecordedRequest):
        text = " ".join(m["content"] for m in request.body["messages"])
        with self.lock:
            if "Output format: edit ops" in text:
                self.planner_calls += 1
                return Completion(PLAN if self.planner_calls == 1 else "Nothing to add.\n```json\n[]\n```",
                                  prompt_tokens=100, completion_tokens=40)
            return self.coder_steps.pop(0) if self.coder_steps else HTTPError(500, "script exhausted")


@pytest.fixture(scope="module")
def llm_run(tmp_path_factory) -> Path:
    from local_backends import settings

    from ksearch_ray.session import start

    script = Script([Completion(CODE, 200, 30), Completion(SYNTAX, 200, 30), Completion(PROSE, 200, 20),
                     Completion(WRONG, 200, 30), Completion(CRASH, 200, 30), Completion(CODE.replace("a * x", "x * a"), 200, 30)])
    run_dir = tmp_path_factory.mktemp("llm") / "run"
    with FakeLLMServer(script) as server:
        config = settings(
            task="toy_axpy", task_dirs=[str(DATA)], model="hosted_vllm/fake-coder", api_base=server.api_base, width=2,
            rounds=6, stagnation_window=3, device="cpu", ray=False, max_retries=1, backoff_base_s=0.01,
            timeout_s=20, limits={"idle": 5}, run_dir=str(run_dir), progress=False,
        )
        start(config, progress=False)
    return run_dir


def _outcomes(events: list[dict]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for e in events:
        status = e["result"]["status"] if e["kind"] == "evaluation" else NO_CODE if e["kind"] == "candidate" and not e["solution_id"] else None
        if status:
            counts[status] = counts.get(status, 0) + 1
    return counts


@pytest.mark.slow
def test_show_counts_failed_and_crashed_candidates_per_status(llm_run):
    expected = _outcomes(events_of(llm_run))
    assert {Status.PASSED, Status.COMPILE_ERROR, Status.INCORRECT_NUMERICAL, Status.CRASHED, NO_CODE} <= set(expected)
    summary = json.loads(ksearch("show", "--json", str(llm_run), cwd=llm_run.parent).stdout)
    assert summary["outcomes"] == expected
    assert summary["evaluations"] == sum(n for s, n in expected.items() if s != NO_CODE)
    assert summary["rounds_used"] == 6 and summary["finished"] == "rounds"
    # The baseline was measured more than once, and the best re-timed at the end: the noise is known.
    assert summary["noise"] is not None and summary["confirmed"][0]["solution_id"] == summary["best"]["solution_id"]
    assert sum(row["calls"] for row in summary["ledger"]) == summary["llm_calls"] > 0
    assert {row["role"] for row in summary["ledger"]} == {"planner", "coder"}
    assert summary["world_model"]["nodes"]["n1"]["title"].endswith(HOSTILE)
    shown = ksearch("show", "run", cwd=llm_run.parent, env={"COLUMNS": "80"})
    assert shown.returncode == 0, shown.stderr
    line = next(line for line in shown.stdout.splitlines() if line.startswith("candidates: "))
    assert all(f"{status} {n}" in line for status, n in expected.items()), line
    assert "failed candidates" in shown.stdout and "CRASHED" in shown.stdout


@pytest.mark.slow
def test_report_is_one_self_contained_file_that_tells_the_story(llm_run, tmp_path):
    made = ksearch("report", str(llm_run), "--out", "story.html", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    html = (tmp_path / "story.html").read_text()
    # Nothing to fetch: no tag refers to anything outside the page, and a policy forbids fetching.
    assert "default-src 'none'" in html and "@import" not in html and "url(" not in html
    for tag in re.findall(r"<[a-zA-Z][^>]*>", html):
        assert " src=" not in tag and "<link" not in tag, tag
        assert "href=" not in tag or 'href="#' in tag, tag
    events = events_of(llm_run)
    for section in ("Outcome", "Best so far", "World model", "Evaluations", "per workload", "LLM ledger", "Best kernel", "Settings"):
        assert section in html
    assert "<svg" in html and "fuse it &lt;img src=x" in html and HOSTILE not in html
    measured = [e for e in events if e["kind"] in ("baseline", "seed_failed", "remeasure", "evaluation", "tune") or
                e["kind"] == "seed" and e["solution_id"] or e["kind"] == "candidate" and not e["solution_id"]]
    assert html.count("<tr data-status=") == len(measured)
    assert "SyntaxError" in html or "invalid syntax" in html or "expected ':'" in html  # the first lines of the compile error
    best = next(e for e in reversed(events) if e["kind"] == "best")
    assert f"Solution <code>{best['solution_id']}</code>" in html


@pytest.mark.slow
def test_report_page_loads_in_a_real_browser_without_errors_and_is_not_blank(llm_run, tmp_path):
    from browser import Browser
    from PIL import Image

    made = ksearch("report", str(llm_run), "--out", str(tmp_path / "report.html"), cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    with Browser(width=1280, height=1000) as browser:
        browser.open(tmp_path / "report.html")
        assert browser.console_errors() == []
        assert browser.requests() == [(tmp_path / "report.html").as_uri()]
        # The hostile markup stayed text: no image, no script of its own, the words on screen.
        assert browser.evaluate("document.images.length") == 0
        assert browser.evaluate("document.scripts.length") == 1
        assert HOSTILE in browser.evaluate("document.body.innerText")
        assert browser.evaluate("document.querySelectorAll('svg.chart').length") >= 2
        png = browser.screenshot()
        # The page's own script works: a status filter hides that status's rows, a heading sorts.
        rows = browser.evaluate("document.querySelectorAll('#evaluations tbody tr').length")
        browser.click("button.filter[data-status=PASSED]")
        hidden = browser.evaluate("document.querySelectorAll('#evaluations tbody tr[hidden]').length")
        passed = browser.evaluate("document.querySelectorAll('#evaluations tbody tr[data-status=PASSED]').length")
        assert hidden == passed > 0 and rows > passed
        browser.click("#evaluations thead th:nth-child(6)")
        assert browser.evaluate("document.querySelector('#evaluations thead th:nth-child(6)').dataset.dir") == "asc"
        assert browser.console_errors() == []
    image = Image.open(io.BytesIO(png)).convert("RGB")
    assert image.size == (1280, 1000)
    colours = image.getcolors(maxcolors=1 << 20) or []
    most = max(n for n, _ in colours)
    assert len(colours) > 20 and most < 0.97 * image.size[0] * image.size[1], "the screenshot is (nearly) one colour"


def _rewrite(run_dir: Path, keep) -> None:  # type: ignore[no-untyped-def]
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    (run_dir / "events.jsonl").write_text("".join(line + "\n" for line in lines if keep(json.loads(line))))


@pytest.mark.slow
def test_report_works_on_a_run_in_progress_and_on_a_method_without_a_world_model(llm_run, tmp_path):
    events = events_of(llm_run)
    # In progress: the log as it stood when the third candidate had just been generated.
    live = tmp_path / "live"
    shutil.copytree(llm_run, live, ignore=shutil.ignore_patterns("sandbox"))
    third = [e for e in events if e["kind"] == "candidate"][2]["seq"]
    _rewrite(live, lambda e: e["seq"] <= third)
    made = ksearch("report", "live", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    html = (live / "report.html").read_text()
    assert "not finished" in html and "3 of 6" in html

    # Another search method: the same candidate, evaluation, best and llm_call events, no world model, no cycles.
    flat = tmp_path / "flat"
    shutil.copytree(llm_run, flat, ignore=shutil.ignore_patterns("sandbox"))
    manifest = json.loads((flat / "manifest.json").read_text())
    manifest["config"]["search"]["method"] = "evolve"
    (flat / "manifest.json").write_text(json.dumps(manifest))
    _rewrite(flat, lambda e: not e["kind"].startswith(("wm", "cycle")))
    lines = (flat / "events.jsonl").read_text().splitlines()
    stripped = [json.loads(line) for line in lines]
    for e in stripped:
        if e["kind"] in ("candidate", "evaluation", "tune", "tuned"):
            e.update(cycle=None, node=None, method="evolve", lane="e1")
    (flat / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in stripped))
    made = ksearch("report", "flat", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    html = (flat / "report.html").read_text()
    assert "This run keeps no world model (method evolve)" in html and "<svg" in html
    shown = ksearch("show", "flat", cwd=tmp_path)
    assert shown.returncode == 0 and "keeps no world model" in shown.stdout, shown.stderr


# -------------------------------------------------------------------------------------------- tasks


def _bundled_tasks() -> dict[str, Path]:
    """The bundled tasks as `ksearch` sees them here: the copy this process imports (the installed one,
    with a non-editable install), which the terminal run below imports too."""
    from ksearch_ray.taskspec.task import discover

    return dict(discover([]))


def _in_a_terminal(args: list[str], columns: int, cwd: Path) -> str:
    """Run `ksearch` on a pseudo-terminal `columns` wide; what the user would see."""
    parent, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    # The package as this process imports it (no PYTHONPATH: an installed copy stays the one used).
    environ = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "COLUMNS": str(columns), "TERM": "xterm"}
    proc = subprocess.Popen([sys.executable, "-m", "ksearch_ray", *args], cwd=cwd, env=environ, stdin=child, stdout=child,
                            stderr=child, close_fds=True)
    os.close(child)
    chunks = []
    while True:
        try:
            data = os.read(parent, 65536)
        except OSError:  # EIO: the other side closed
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=120)
    os.close(parent)
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode()).replace("\r", "")


def test_tasks_prints_whole_names_and_paths_in_a_pipe_and_in_an_80_column_terminal(tmp_path):
    tasks = _bundled_tasks()
    assert any(len(name) > 40 for name in tasks)  # the FlashInfer names that used to be cut
    piped = ksearch("tasks", cwd=tmp_path, env={"COLUMNS": "80"})
    assert piped.returncode == 0, piped.stderr
    terminal = _in_a_terminal(["tasks"], 80, tmp_path)
    for shown in (piped.stdout, terminal):
        lines = shown.splitlines()
        assert "…" not in shown
        for name, root in tasks.items():
            assert name in lines, (name, shown)  # alone on a line: ready to copy
            assert f"  path: {root}" in lines


def test_tasks_counts_the_workloads_that_run_on_this_machine_and_says_so_in_json(tmp_path):
    from ksearch_ray.taskspec.task import find_task

    listed = ksearch("tasks", "--json", "--device", "cpu", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    entries = {e["name"]: e for e in json.loads(listed.stdout)}
    trimul = find_task("trimul")
    sets = {s["name"]: s for s in entries["trimul"]["workload_sets"]}
    assert sets["benchmarks"]["resolved"] == "benchmarks-cpu"
    assert sets["benchmarks"]["workloads"] == len(trimul.workloads("benchmarks", "cpu")) != len(trimul.workloads("benchmarks", "cuda"))
    assert "benchmarks-cpu" not in sets  # a -cpu twin is how its set runs, not a set of its own
    on_gpu = next(e for e in json.loads(ksearch("tasks", "--json", "--device", "cuda", cwd=tmp_path).stdout) if e["name"] == "trimul")
    on_gpu = {s["name"]: s for s in on_gpu["workload_sets"]}
    assert on_gpu["benchmarks"]["resolved"] == "benchmarks"
    plain = ksearch("tasks", "--device", "cpu", cwd=tmp_path).stdout
    assert f"benchmarks ({len(trimul.workloads('benchmarks', 'cpu'))}, as benchmarks-cpu" in plain
    # where scores compare and where runs start, by name
    roles = {s["name"]: s["role"] for s in entries["trimul"]["solutions"]}
    assert roles == {"baseline": "baseline", "triton_fused": "default seed", "triton_seed": None}
    assert "  solutions: baseline (baseline), triton_fused (default seed), triton_seed" in plain.splitlines()


def test_the_per_workload_table_shows_the_measurement_the_headline_speedup_comes_from(tmp_path):
    """The seed is measured twice (the first measurement of a session is often the slow one on a CPU): the
    best's speedup comes from the first, so the per-workload table must show that one, not the repeat."""
    from ksearch_ray.events import Baseline, Best, Remeasure, Seed
    from ksearch_ray.models import EvalResult, Solution, Timing, WorkloadResult
    from ksearch_ray.report.run_tables import Run
    from ksearch_ray.store import RunStore

    def measured(solution: Solution, ms: float) -> EvalResult:
        workloads = [WorkloadResult(workload=f"w{i}", status=Status.PASSED,
                                    timing=Timing(mean_ms=ms * (i + 1), median_ms=ms * (i + 1), min_ms=ms, std_ms=0.0, clock="host_wall",
                                                  count=3, wall_median_ms=ms * (i + 1))) for i in range(2)]
        return EvalResult(task="toy_axpy", solution_id=solution.id, solution_name=solution.name, status=Status.PASSED,
                          workload_set="smoke", mode="fresh", device="cpu", workloads=workloads, score=ms,
                          score_kind="geomean_latency_ms")

    base = Solution(name="base", task="toy_axpy", language="python", entry_file="k.py", entry_point="run",
                    sources={"k.py": "# base\n"})
    seed = base.model_copy(update={"name": "seed", "sources": {"k.py": "# seed\n"}})
    store = RunStore.create(tmp_path / "run", {"config": {"task": "toy_axpy"}})
    for solution in (base, seed):
        store.save_solution(solution)
    store.append(Baseline(solution_id=base.id, evaluator=0, gpu="cpu", result=measured(base, 1.0)))
    store.append(Seed(solution_id=seed.id, evaluator=0, gpu="cpu", result=measured(seed, 4.0), speedup=0.25))
    store.append(Best(solution_id=seed.id, speedup=0.25, node="root", round=0, gpu="cpu", why="the seed"))
    store.append(Remeasure(role="seed", solution_id=seed.id, evaluator=0, gpu="cpu", result=measured(seed, 2.0),
                           speedup=0.5))
    store.close()
    frame = Run.load(tmp_path / "run").workload_comparison()
    assert frame["speedup"].to_list() == [0.25, 0.25]  # the measurement behind "best: 0.25x", not the 0.5x repeat
