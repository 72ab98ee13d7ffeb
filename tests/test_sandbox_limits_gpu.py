"""The resource limits at their defaults on a real GPU (skipped without one): CUDA initialises under
them and a normal TriMul evaluation passes, while the hostile candidates of test_sandbox_limits.py
are still stopped, each with Status.RESOURCE_LIMIT, and the GPU evaluator goes on. Where the sandbox
runs as the host's root, the candidate runs as `nobody` where the GPU nodes are open to all (the H200
machine), and RLIMIT_NPROC caps the fork bomb; where they are not, it stays root, whom RLIMIT_NPROC
does not bind, and only the worker's pids cgroup caps it.

Run on the H200: `python -m pytest -q -m gpu tests/test_sandbox_limits_gpu.py`.
"""

from __future__ import annotations

import resource
from pathlib import Path

import pytest

from ksearch_ray.evaluation.evaluator import Evaluator
from ksearch_ray.evaluation.sandbox.isolation import Isolation
from ksearch_ray.evaluation.sandbox.resources import host_root
from ksearch_ray.evaluation.settings import Limits
from ksearch_ray.models import Status
from ksearch_ray.taskspec.task import Task, find_task, solution_from_file

pytestmark = pytest.mark.gpu
DATA = Path(__file__).parent / "data"
CANDIDATES = DATA / "candidates"
DEFAULTS = Limits()


@pytest.fixture(scope="module")
def toy() -> Task:
    return Task.load(DATA / "toy")


@pytest.fixture(scope="module")
def gpu(toy):
    # Every resource limit at its default. The hang floor is raised: on the lent H200 (a microVM whose memory
    # grows as it is used) writing 32 GiB and forking a thousand CUDA-initialised processes outlast the 20 s
    # floor, and this test is about which limit stops them, not how soon a hang is judged.
    ev = Evaluator("cuda", limits=Limits(hang_floor=180), isolation=Isolation.REQUIRE)
    assert ev.evaluate(toy, toy.baseline()).passed
    yield ev
    ev.close()


def scaled(task: Task, name: str, old: str, new: str, tmp_path: Path):
    """A candidate of tests/data/candidates, made big enough to pass the default limits."""
    source = (CANDIDATES / f"{name}.py").read_text()
    assert old in source
    path = tmp_path / f"{name}.py"
    path.write_text(source.replace(old, new))
    return solution_from_file(path, task)


def test_gpu_a_trimul_evaluation_passes_with_the_default_limits(gpu):
    trimul = find_task("trimul")
    for name in ("baseline", "triton_seed"):
        result = gpu.evaluate(trimul, trimul.solution(name), workload_set=trimul.definition.default_workloads)
        assert result.status is Status.PASSED, (name, result.message, result.log[-1000:])


def test_gpu_a_memory_hog_is_stopped_at_the_default_limit(gpu, toy, tmp_path):
    hog = scaled(toy, "memory_hog", "TOTAL = 6 << 30", f"TOTAL = {DEFAULTS.memory_mb // 1024 + 16} << 30", tmp_path)
    result = gpu.evaluate(toy, hog, workload_set="tests")
    assert result.status is Status.RESOURCE_LIMIT, (result.message, result.log[-1000:])
    assert gpu.evaluate(toy, toy.baseline()).passed


def test_gpu_a_fork_bomb_is_capped_at_the_default_limit(gpu, toy, tmp_path):
    bomb = scaled(toy, "fork_bomb", "TRIES = 1000", f"TRIES = {DEFAULTS.processes * 3}", tmp_path)
    result = gpu.evaluate(toy, bomb, workload_set="tests")
    assert result.status is Status.RESOURCE_LIMIT, (result.message, result.log[-1000:])
    assert f"its limit is {DEFAULTS.processes} (evaluation.limits.processes)" in result.message, result.message
    assert int(result.message.split("forked ")[1].split()[0]) < DEFAULTS.processes
    assert gpu.evaluate(toy, toy.baseline()).passed


def test_gpu_a_candidate_runs_as_nobody_where_the_gpu_nodes_are_open_to_all(gpu, toy, tmp_path):
    """A host-root sandbox hands the GPU to `nobody` where the nodes CUDA opens are open to all, so
    RLIMIT_NPROC binds the candidate even without a pids cgroup (the H200 machine: its cgroup does not
    offer the pids controller, and /dev/nvidia-caps/nvidia-cap1 is root's alone, which a whole-GPU
    candidate never opens)."""
    nodes = [p for p in Path("/dev").glob("nvidia*") if not p.is_dir()]
    if not host_root() or not nodes or not all(p.stat().st_mode & 0o006 == 0o006 for p in nodes):
        pytest.skip("needs a host-root sandbox and GPU nodes open to all")
    whoami = tmp_path / "whoami.py"
    whoami.write_text("import os\n\nimport torch\n\n\ndef run(x, a, b):\n"
                      "    torch.ones(1, device='cuda')\n"
                      "    raise RuntimeError(f'running as uid {os.getuid()} with the GPU')\n")
    said = gpu.evaluate(toy, solution_from_file(whoami, toy), workload_set="tests")
    assert "running as uid 65534 with the GPU" in said.message, said.message
    assert gpu.sandbox.report.processes_problem is None, gpu.sandbox.report


def test_gpu_a_gigabyte_of_output_is_capped_while_written(gpu, toy):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = gpu.evaluate(toy, solution_from_file(CANDIDATES / "flood_output.py", toy), workload_set="tests")
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert result.status is Status.RESOURCE_LIMIT and f"more than {DEFAULTS.output_mb} MiB" in result.message, result.message
    assert grown_mb < 200, f"the evaluator grew by {grown_mb:.0f} MB"
    assert gpu.evaluate(toy, toy.baseline()).passed
