"""Runs that lose their driver or an evaluator: nothing lost, nothing counted twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ksearch_ray.config import RunConfig
from ksearch_ray.search.runner import start
from ksearch_ray.search.runstate import fold
from ksearch_ray.search.store import RunStore

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).parent.parent


def _counts(run_dir: Path) -> dict:
    store = RunStore(run_dir)
    events = store.read_events()
    state = fold(events, store.has_solution)
    candidates = [e for e in events if e["kind"] == "candidate"]
    evaluations = [e for e in events if e["kind"] == "evaluation"]
    return {
        "finished": state.finished,
        "rounds": state.rounds_used,
        "candidate_rounds": sorted(c["round"] for c in candidates),
        "evaluated_rounds": sorted(e["round"] for e in evaluations),
        "candidates_with_code": sorted(c["round"] for c in candidates if c["solution_id"]),
        "baselines": sum(e["kind"] == "baseline" for e in events),
    }


def _cli(*args: str, env: dict | None = None) -> subprocess.Popen:
    environ = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(ROOT), **(env or {})}
    environ.pop("RAY_ADDRESS", None)
    return subprocess.Popen([sys.executable, "-m", "ksearch_ray", *args], env=environ, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)


RUN_ARGS = ["--task", "toy_axpy", "--task-dir", str(DATA), "--from-solution", "triton_seed", "--device", "cpu",
            "--width", "2", "--rounds", "8", "--stagnation-window", "2", "--no-progress"]


@pytest.mark.slow
def test_resume_after_kill_counts_each_round_once(tmp_path):
    whole = tmp_path / "whole"
    p = _cli("run", *RUN_ARGS, "--run-dir", str(whole))
    out = p.communicate(timeout=600)[0].decode()
    assert p.returncode == 0, out

    killed = tmp_path / "killed"
    p = _cli("run", *RUN_ARGS, "--run-dir", str(killed))
    events = killed / "events.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:  # kill -9 once a few rounds are in the log, mid-run
        if events.exists() and sum('"kind": "candidate"' in line for line in events.read_text().splitlines()) >= 3:
            break
        time.sleep(0.05)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    before = _counts(killed)
    assert before["finished"] is None and 3 <= before["rounds"] < 8

    r = _cli("resume", str(killed), "--no-progress")
    out = r.communicate(timeout=600)[0].decode()
    assert r.returncode == 0, out
    after, reference = _counts(killed), _counts(whole)
    assert after["finished"] == reference["finished"] == "rounds"
    assert after["rounds"] == reference["rounds"] == 8
    assert after["candidate_rounds"] == reference["candidate_rounds"] == list(range(1, 9))
    # Every candidate that had code was evaluated exactly once, across the kill.
    assert after["evaluated_rounds"] == after["candidates_with_code"]
    assert reference["evaluated_rounds"] == reference["candidates_with_code"]
    # The baseline is measured in every session (noise_repeats times in the first, 2 by default; once after a resume).
    assert reference["baselines"] == 2 and after["baselines"] == 3
    state = fold(RunStore(killed).read_events(), RunStore(killed).has_solution)
    assert state.resumes == 1
    assert not state.open_cycles


@pytest.mark.slow
def test_evaluator_killed_mid_evaluation_the_run_completes(ray_session, tmp_path):
    import ray

    config = RunConfig(task="toy_axpy", task_dirs=[str(DATA)], from_solution="triton_seed", device="cpu",
                       evaluator_gpus=True, width=2, rounds=6, stagnation_window=2,
                       run_dir=str(tmp_path / "run"), progress=False)
    outcome: dict = {}
    runner = threading.Thread(target=lambda: outcome.update(result=start(config, progress=False)))
    runner.start()
    events = tmp_path / "run" / "events.jsonl"
    killed = None
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and killed is None:
        if events.exists() and any('"kind": "candidate"' in line for line in events.read_text().splitlines()):
            names = [n for n in ray.util.list_named_actors() if n.startswith("ksearch-eval-run-")]
            if names:
                killed = names[0]
                ray.kill(ray.get_actor(names[0]))
        time.sleep(0.02)
    runner.join(timeout=600)
    assert killed is not None
    _, state = outcome["result"]
    assert state.finished == "rounds" and state.rounds_used == 6
    log = [json.loads(line) for line in events.read_text().splitlines()]
    assert any(e["kind"] == "evaluator_lost" for e in log)
    counts = _counts(tmp_path / "run")
    assert counts["evaluated_rounds"] == counts["candidates_with_code"]


def test_no_two_cycles_work_one_node_at_once(tmp_path):
    """Replay-level check over the LLM run's log format: leases are exclusive per node."""
    from ksearch_ray.worldmodel.state import WorldModelState
    from ksearch_ray.worldmodel.tree import new_tree

    state = WorldModelState(new_tree("t"), lambda _i: True)
    state.call("apply", {"ops": [
        {"op": "insert", "parent": "root", "title": f"a{i}", "difficulty": 1, "score": 0.5, "expected_speedup": 1.1}
        for i in range(5)
    ]})
    taken = [state.call("select_and_lease", {"k": 1, "holder": f"c{i}", "now": 0.0, "ttl": 60.0,
                                              "max_difficulty": 4, "relax_at": None}) for i in range(7)]
    flat = [i for ids in taken for i in ids]
    assert len(flat) == 5 and len(set(flat)) == 5  # 7 cycles asked, 5 nodes existed, none handed out twice
    assert state.call("expire", {"now": 61.0}) == sorted(flat, key=lambda s: int(s[1:]))
