"""A candidate's resources are bounded, each limit hit is a status of its own, and the evaluator survives.

Hostile candidates from tests/data/candidates run through the real zygote and namespaces on the CPU
path, with small limits so that each attack ends in seconds: a fork bomb, a memory hog, 1 GiB of
output, a file past the size limit, a job directory filled past the disk limit. After each, the same
evaluator passes the task's baseline. tests/test_sandbox_limits_gpu.py repeats them on a GPU with the
default limits. The fork bomb runs twice: as `nobody` (RLIMIT_NPROC caps it) and as the host's root,
which the kernel exempts from RLIMIT_NPROC (only the worker's pids cgroup caps it).
"""

from __future__ import annotations

import resource
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from ksearch_ray.evaluation.evaluator import Evaluator
from ksearch_ray.evaluation.sandbox.handle import IsolationReport
from ksearch_ray.evaluation.sandbox.isolation import Isolation
from ksearch_ray.evaluation.sandbox.pids import locate, members
from ksearch_ray.evaluation.sandbox.resources import Resources, host_root, read_tail, watch
from ksearch_ray.evaluation.settings import Limits, TimingPolicy
from ksearch_ray.models import Status
from ksearch_ray.taskspec.task import Task, solution_from_file

DATA = Path(__file__).parent / "data"
CANDIDATES = DATA / "candidates"
# A CUDA build of torch maps its libraries' writable data (cuBLAS, cuDNN, ...) even on the CPU path, and
# RLIMIT_DATA counts it: under 1 GiB the H200 machine's reference worker died with MemoryError at import.
# The memory hog asks for 6 GiB, past either.
SMALL = Limits(setup=120, build_python=60, idle=30, total=120, memory_mb=4096 if torch.version.cuda else 1024,
               processes=64, file_mb=16, disk_mb=64, output_mb=8)


@pytest.fixture(scope="module")
def toy() -> Task:
    return Task.load(DATA / "toy")


@pytest.fixture(scope="module")
def bounded():
    ev = Evaluator("cpu", limits=SMALL, timing=TimingPolicy(max_calls=5), isolation=Isolation.REQUIRE)
    yield ev
    ev.close()


def evaluate(ev: Evaluator, task: Task, name: str):
    result = ev.evaluate(task, solution_from_file(CANDIDATES / f"{name}.py", task), workload_set="tests")
    assert ev.evaluate(task, task.baseline(), workload_set="tests").status is Status.PASSED  # the evaluator survives
    return result


def test_a_fork_bomb_is_capped_in_the_candidates_own_namespace(bounded, toy):
    result = evaluate(bounded, toy, "fork_bomb")
    assert result.status is Status.RESOURCE_LIMIT, result.message
    assert "its limit is 64 (evaluation.limits.processes)" in result.message
    forked = int(result.message.split("forked ")[1].split()[0])
    assert 1 <= forked < 64
    subprocess.run(["true"], check=True)  # the host user's own processes are not counted against it


@pytest.fixture(scope="module")
def private_toy(tmp_path_factory) -> Task:
    """The toy task in a folder only its owner may read: a host-root sandbox cannot hand the task's
    files to `nobody`, so its candidates keep the host's root (isolation.candidate_uid), as they do on
    a GPU host whose device nodes are not open to all."""
    folder = tmp_path_factory.mktemp("private") / "toy"
    shutil.copytree(DATA / "toy", folder)
    folder.chmod(0o700)
    return Task.load(folder)


@pytest.mark.skipif(not host_root(), reason="a candidate that stays the host's root needs a sandbox run as the host's root")
def test_a_fork_bomb_is_capped_by_a_pids_cgroup_where_the_candidate_stays_host_root(bounded, private_toy, tmp_path):
    if bounded.sandbox.pids_cgroup is None:
        pytest.skip(f"this host offers no pids cgroup: {bounded.sandbox.report}")
    whoami = tmp_path / "whoami.py"
    whoami.write_text("import os\n\n\ndef run(x, a, b):\n    raise RuntimeError(f'running as uid {os.getuid()}')\n")
    said = bounded.evaluate(private_toy, solution_from_file(whoami, private_toy), workload_set="tests")
    assert "running as uid 0" in said.message, said.message  # RLIMIT_NPROC does not bind this candidate
    result = evaluate(bounded, private_toy, "fork_bomb")
    assert result.status is Status.RESOURCE_LIMIT, result.message
    assert "its limit is 64 (evaluation.limits.processes)" in result.message
    forked = int(result.message.split("forked ")[1].split()[0])
    assert 1 <= forked < 64
    assert bounded.sandbox.pids_cgroup is not None, bounded.sandbox.report
    # Each worker's cgroup went with it: what is left holds a live worker (a task's reference worker,
    # evaluation/reference.py, serves every candidate of the evaluator).
    left = {w.name: members(w) for w in bounded.sandbox.pids_cgroup.glob("worker-*")}
    assert all(left.values()), left


@pytest.mark.parametrize("who", ["nobody", "host root"])
def test_a_candidate_cannot_raise_or_leave_its_process_cap_through_cgroupfs(who, bounded, toy, private_toy):
    """It tries to raise its cgroup's pids.max, move into an ancestor cgroup and make one of its own:
    /sys is read-only in the sandbox, and even a candidate that stays the host's root (private task
    files) gets every write refused."""
    if who == "host root" and not host_root():
        pytest.skip("a candidate that stays the host's root needs a sandbox run as the host's root")
    task = private_toy if who == "host root" else toy
    result = bounded.evaluate(task, solution_from_file(CANDIDATES / "cgroup_escape.py", task), workload_set="tests")
    assert "every cgroup write refused" in result.message and "(0 tries)" not in result.message, result.message
    assert bounded.evaluate(task, task.baseline(), workload_set="tests").status is Status.PASSED


def test_a_host_root_sandbox_without_a_pids_cgroup_says_the_process_limit_is_lost_and_require_refuses():
    hello = {"isolated": True, "root_candidates": True, "pids_cgroup": None, "pids_problem": "no pids controller"}
    report = IsolationReport.of(hello, processes=1024)
    assert any("limit of 1024 processes" in line and "no pids controller" in line
               for line in report.warnings(Isolation.BEST_EFFORT))
    refusal = report.refusal(Isolation.REQUIRE)
    assert refusal is not None and "process limit cannot be enforced" in refusal
    # Where the limit holds (a cgroup, a user other than root) or is off, nothing is said or refused.
    for holds in ({**hello, "pids_cgroup": "/sys/fs/cgroup/pids/x"}, {**hello, "root_candidates": False}):
        assert IsolationReport.of(holds, processes=1024).refusal(Isolation.REQUIRE) is None
        assert not IsolationReport.of(holds, processes=1024).warnings(Isolation.BEST_EFFORT)
    assert IsolationReport.of(hello, processes=0).refusal(Isolation.REQUIRE) is None


_MOUNTS = """\
30 25 0:26 / /sys/fs/cgroup/pids rw,relatime shared:9 - cgroup cgroup rw,pids
31 25 0:27 / /sys/fs/cgroup/memory rw,relatime shared:10 - cgroup cgroup rw,memory
32 25 0:28 / /sys/fs/cgroup/unified rw,relatime shared:11 - cgroup2 cgroup2 rw
"""


def test_the_pids_cgroup_is_found_in_cgroup_v1_or_v2_where_mounted():
    from pathlib import Path

    v1 = "9:pids:/user.slice/ray\n4:memory:/x\n0::/user.slice/ray\n"
    assert locate(_MOUNTS, v1) == (Path("/sys/fs/cgroup/pids/user.slice/ray"), 1)
    v2_only = "32 25 0:28 /kubepods/pod1 /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n"  # a container's view
    assert locate(v2_only, "0::/kubepods/pod1/c1\n") == (Path("/sys/fs/cgroup/c1"), 2)
    assert "not mounted" in str(locate(_MOUNTS.splitlines()[1], v1))
    assert "no pids cgroup controller" in str(locate(_MOUNTS, "4:memory:/x\n"))


def test_a_memory_hog_is_stopped_with_a_clear_status(bounded, toy):
    result = evaluate(bounded, toy, "memory_hog")
    assert result.status is Status.RESOURCE_LIMIT, result.message
    assert f"host memory ({SMALL.memory_mb} MiB, evaluation.limits.memory_mb)" in result.message


def test_output_is_capped_while_written_and_the_evaluator_reads_only_a_tail(bounded, toy):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = evaluate(bounded, toy, "flood_output")  # 1 GiB on stdout, then a crash
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert result.status is Status.RESOURCE_LIMIT, result.message
    assert "printed more than 8 MiB" in result.message
    assert grown_mb < 100, f"the evaluator grew by {grown_mb:.0f} MB"
    assert len(result.log) <= 4000


def test_a_file_past_the_size_limit_is_refused(bounded, toy):
    result = evaluate(bounded, toy, "big_file")
    assert result.status is Status.RESOURCE_LIMIT, result.message
    assert "a file larger than 16 MiB" in result.message


def test_filling_the_job_directory_past_the_disk_limit_stops_the_candidate(bounded, toy):
    result = evaluate(bounded, toy, "fill_disk")
    assert result.status is Status.RESOURCE_LIMIT, result.message
    assert "more than 64 MiB of disk" in result.message


def test_limits_are_settings_and_misspelt_ones_are_refused():
    from ksearch_ray.config import validate_config

    config = validate_config({"task": "trimul", "evaluation": {"limits": {"memory_mb": 2048, "output_mb": 1}}})
    assert config.evaluation.limits.resources()["memory_mb"] == 2048
    with pytest.raises(Exception, match="memory_gb"):
        validate_config({"task": "trimul", "evaluation": {"limits": {"memory_gb": 2}}})


def test_the_watcher_keeps_the_head_of_a_flood_and_a_bounded_tail_is_read(tmp_path):
    import os

    r, w = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(r)
        with open(w, "wb", buffering=0) as out:
            out.write(b"a" * (3 << 20))
        os._exit(0)
    os.close(w)
    log = tmp_path / "stdout.log"
    status = watch(child, {r: log.open("wb", buffering=0)}, Resources(output_mb=1), [], lambda c: os.kill(c, 9))
    assert os.WEXITSTATUS(status) == 92 and log.stat().st_size == 1 << 20
    assert read_tail(log, 100) == "a" * 100
    os.mkfifo(tmp_path / "fifo")  # a candidate may put a FIFO in a log's place: reading it must not block
    assert read_tail(tmp_path / "fifo", 100) == ""
