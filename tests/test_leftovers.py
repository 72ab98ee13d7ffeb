"""Nothing left behind: a sandbox folder whose process was killed with SIGKILL is removed by the next
sandbox made under the same root; a folder whose process lives is never touched. The same for a
zygote's pids cgroups (sandbox/pids.py), with the processes left in them."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from ksearch_ray.evaluation.sandbox.client import default_work_root

MAKE = ("import sys, time; from ksearch_ray.evaluation.sandbox.client import default_work_root; "
        "print(default_work_root(), flush=True); time.sleep(600)")


def _holder(tmp: Path) -> tuple[subprocess.Popen[str], Path]:
    env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"} | {"TMPDIR": str(tmp)}
    proc = subprocess.Popen([sys.executable, "-c", MAKE], stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    return proc, Path(proc.stdout.readline().strip())


def test_a_sandbox_folder_of_a_killed_process_is_swept_by_the_next_one_and_a_live_ones_is_kept(tmp_path, monkeypatch):
    killed, dead_folder = _holder(tmp_path)
    alive, live_folder = _holder(tmp_path)
    try:
        (dead_folder / "jobs").mkdir()
        os.kill(killed.pid, signal.SIGKILL)  # as `kill -9` of a driver: nothing of it runs again
        killed.wait()
        assert dead_folder.is_dir() and live_folder.is_dir()
        monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
        monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
        mine = default_work_root()
        assert not dead_folder.exists()
        assert live_folder.is_dir() and mine.is_dir() and mine.parent == dead_folder.parent
    finally:
        for proc in (killed, alive):
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()


def _gone(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True
    return "\nState:\tZ" in status  # dead, waiting for a parent (init) to reap it


def test_ray_agents_whose_cluster_is_gone_are_killed_and_a_live_clusters_are_not():
    """Processes titled as Ray's agents (as `ray::DashboardAgent` is): one orphaned (its raylet died), one
    whose parent is a (stand-in) raylet. Measured before: orphaned agents lived 61-65 s after kill -9."""
    import time

    from ksearch_ray.distributed.leftovers import sweep_agents

    orphan_maker = subprocess.run(["bash", "-c", "(exec -a ray::DashboardAgent sleep 600 </dev/null >/dev/null 2>&1) & echo $!"],
                                  capture_output=True, text=True, check=True)
    orphan = int(orphan_maker.stdout.strip())
    raylet = subprocess.Popen(["bash", "-c", "exec -a raylet bash -c '(exec -a ray::RuntimeEnvAgent sleep 600) & wait'"],
                              start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        children: list[int] = []
        while not children and time.monotonic() < deadline:
            children = [int(p) for p in Path(f"/proc/{raylet.pid}/task/{raylet.pid}/children").read_text().split()]
            time.sleep(0.05)
        assert children, "the stand-in raylet started no agent"
        killed = sweep_agents()
        assert orphan in killed and children[0] not in killed
        deadline = time.monotonic() + 5
        while not _gone(orphan) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _gone(orphan) and not _gone(children[0])
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(orphan, signal.SIGKILL)
        os.killpg(raylet.pid, signal.SIGKILL)
        raylet.wait()


def _pids_cgroups():
    import pytest

    from ksearch_ray.evaluation.sandbox.pids import PidsCgroups

    cgroups, why = PidsCgroups.open()
    if cgroups is None:
        pytest.skip(f"no pids cgroup can be made here: {why}")
    return cgroups


def test_the_pids_cgroups_of_a_killed_zygote_are_swept_with_their_processes_and_a_live_ones_kept():
    from ksearch_ray.evaluation.sandbox.leftovers import sweep_cgroups
    from ksearch_ray.evaluation.sandbox.pids import members, remove, start_time

    mine = _pids_cgroups()  # this process's folder: a live zygote's
    zygote = subprocess.Popen(["sleep", "600"])
    left = subprocess.Popen(["sleep", "600"], start_new_session=True)  # a candidate's process that outlived it
    dead = mine.parent / f"zygote-{zygote.pid}-{start_time(zygote.pid)}"
    try:
        (dead / "worker-1").mkdir(parents=True)
        (dead / "worker-1" / "cgroup.procs").write_text(str(left.pid))
        mine.enter(os.getpid(), 0)  # this live zygote's worker: this very process
        zygote.kill()
        zygote.wait()
        assert sweep_cgroups(mine.parent) == [dead]
        assert not dead.exists() and left.wait(timeout=5) == -signal.SIGKILL
        assert mine.worker(os.getpid()).is_dir() and members(mine.worker(os.getpid())) == [os.getpid()]
    finally:
        (mine.home.parent.parent / "cgroup.procs").write_text(str(os.getpid()))  # back where it was
        for proc in (zygote, left):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for cgroup in (dead / "worker-1", dead, mine.worker(os.getpid()), mine.home):
            remove(cgroup)


def test_a_sandbox_removes_its_zygotes_pids_cgroups_when_it_closes(tmp_path):
    from ksearch_ray.evaluation.sandbox.client import Sandbox
    from ksearch_ray.evaluation.sandbox.isolation import Isolation
    from ksearch_ray.evaluation.sandbox.pids import remove

    remove(_pids_cgroups().home)
    sandbox = Sandbox("cpu", tmp_path / "sandbox", isolation=Isolation.OFF)
    try:
        sandbox.ensure_started()
        home = sandbox.pids_cgroup
        assert home is not None and home.is_dir()
    finally:
        sandbox.close()
    assert not home.exists()
