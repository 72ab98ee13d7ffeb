"""A search on a real multi-node Ray cluster, simulated on this machine (`ray.cluster_utils.Cluster`).

Nodes: a head without GPUs (the driver attaches there, and its world-model and policy actors
are pinned there), two GPU worker nodes with two fake GPUs each (evaluators on the CPU path,
one per GPU), and a CPU node that declares `ksearch_build`, where builds go. Every worker node
gets its own TMPDIR, so each has its own node-local scratch directory (sandboxes, build cache),
as separate machines would. The driver is `ksearch run --ray-address ...`, started from a
working directory of its own. Mid-run, a GPU node is removed while one of its evaluators is
measuring a candidate.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ray.cluster_utils import Cluster

DATA = Path(__file__).parent / "data"
ROUNDS = 8


def _scratch(tmpdir: Path) -> Path:
    return tmpdir / "ksearch-ray" / "scratch"  # what buildcache.default_scratch_dir() gives there (XDG_CACHE_HOME)


def _sandboxes(node_tmp: Path) -> list[Path]:
    """The evaluators' private sandbox folders on that node (sandbox.handle.default_work_root)."""
    return list((node_tmp / "ksearch").glob("sandbox-*"))


def _in_flight(node_tmp: Path) -> int:
    return sum(1 for sandbox in _sandboxes(node_tmp) for _ in sandbox.glob("jobs/*"))


def _cache_entries(node_tmp: Path) -> set[str]:
    return {p.name for p in _scratch(node_tmp).glob("build-cache/*/*") if (p / "record.json").is_file()}


def _node_env(node_tmp: Path) -> dict[str, str]:
    # XDG_CACHE_HOME: the node-local scratch (build cache, builders); XDG_RUNTIME_DIR: where evaluators make
    # their private sandboxes (else a per-user folder that all simulated nodes would share).
    return {"TMPDIR": str(node_tmp), "XDG_CACHE_HOME": str(node_tmp), "XDG_RUNTIME_DIR": str(node_tmp)}


@pytest.fixture
def cluster(tmp_path: Path):
    tmp = {name: tmp_path / "nodes" / name for name in ("gpu_a", "gpu_b", "build")}
    for path in tmp.values():
        path.mkdir(parents=True)
    # Node deaths are noticed within a few seconds (the defaults take ~30 s).
    fast = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 1000, "health_check_failure_threshold": 3}
    c = Cluster(initialize_head=True, connect=False, head_node_args={
        "num_cpus": 2, "num_gpus": 0, "include_dashboard": False, "_system_config": fast,
    })
    nodes = {
        "gpu_a": c.add_node(wait=False, num_cpus=2, num_gpus=2, env_vars=_node_env(tmp["gpu_a"])),
        "gpu_b": c.add_node(wait=False, num_cpus=2, num_gpus=2, env_vars=_node_env(tmp["gpu_b"])),
        "build": c.add_node(wait=False, num_cpus=2, num_gpus=0, resources={"ksearch_build": 2},
                            env_vars=_node_env(tmp["build"])),
    }
    c.wait_for_nodes(timeout=180)  # generous: raylets start slowly on a loaded 2-core machine
    yield c, nodes, tmp
    c.shutdown()


@pytest.mark.slow
def test_search_survives_losing_a_gpu_node_and_counts_nothing_twice(cluster, tmp_path: Path) -> None:
    c, nodes, tmp = cluster
    work = tmp_path / "work"
    work.mkdir()
    (work / "cluster-run.yaml").write_text(  # lean; the re-timing at the end runs after the node is gone
        "evaluation: {evaluator_gpus: true}\ncluster: {build_resource: ksearch_build, build_cpus: 1}\n"
        "search: {noise_repeats: 1, confirm_repeats: 1, ksearch: {stagnation_window: 2}}\n"
    )
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    cmd = [sys.executable, "-m", "ksearch_ray", "run", "--task", "toy_axpy_cpp", "--task-dir", str(DATA),
           "--from-solution", "cpp_seed", "--device", "cpu", "--rounds", str(ROUNDS), "--width", "4",
           "--config", "cluster-run.yaml", "--ray-address", c.address, "--run-dir", "run", "--no-progress"]
    driver = subprocess.Popen(cmd, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    events = work / "run" / "events.jsonl"
    placed: dict[str, int] = {}
    killed = False
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and driver.poll() is None:
        started = events.is_file() and '"kind": "candidate"' in events.read_text()
        if started and _in_flight(tmp["gpu_a"]) > 0:
            placed = {name: len(_sandboxes(tmp[name])) for name in ("gpu_a", "gpu_b")}
            c.remove_node(nodes["gpu_a"])
            killed = True
            break
        time.sleep(0.05)
    try:
        output, _ = driver.communicate(timeout=300)
    finally:
        driver.kill()
    assert killed, f"no evaluation was ever in flight on the first GPU node: {output[-3000:]}"
    assert driver.returncode == 0, output[-3000:]

    # Evaluators were spread one per GPU over both GPU nodes; builds ran on the build node only.
    assert placed == {"gpu_a": 2, "gpu_b": 2}
    assert list(_scratch(tmp["build"]).glob("builders/*"))
    assert not list(_scratch(tmp["gpu_b"]).glob("builders/*"))
    # Libraries built on the build node reached the GPU node through the object store, and were kept there.
    built = _cache_entries(tmp["build"])
    assert built and _cache_entries(tmp["gpu_b"]) <= built and _cache_entries(tmp["gpu_b"])
    # The run directory exists on the driver's node only: nothing of it under any worker node's scratch.
    assert not [p for name in tmp for p in tmp[name].rglob("events.jsonl")]

    log = [json.loads(line) for line in events.read_text().splitlines()]
    end = next(e for e in log if e["kind"] == "run_end")
    assert end["reason"] == "rounds" and end["rounds"] == ROUNDS
    lost = [e for e in log if e["kind"] == "evaluator_lost"]
    assert lost
    evaluations = [e for e in log if e["kind"] == "evaluation"]
    candidates = [e for e in log if e["kind"] == "candidate" and e["solution_id"]]
    # Each candidate is evaluated exactly once, the lost ones included (on the surviving node).
    assert sorted(e["round"] for e in evaluations) == sorted(e["round"] for e in candidates)
    assert {e["solution_id"] for e in lost} <= {e["solution_id"] for e in evaluations} | {
        e["solution_id"] for e in log if e["kind"] in ("seed", "baseline")
    }
    assert all(e["result"]["status"] == "PASSED" for e in evaluations)
    assert all(e["result"]["build_seconds"] < 5 for e in evaluations)  # loaded a prebuilt library: no compile on the evaluator

    shown = subprocess.run([sys.executable, "-m", "ksearch_ray", "show", "run"], cwd=work, env=env,
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert "evaluations lost to evaluator failures" in shown.stdout
    assert all(e["solution_id"] in shown.stdout for e in lost)
