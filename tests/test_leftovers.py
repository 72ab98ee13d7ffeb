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

from ksearch_ray.evaluation.sandbox.handle import default_work_root

MAKE = ("import sys, time; from ksearch_ray.evaluation.sandbox.handle import default_work_root; "
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

    from ksearch_ray.distributed.stale_agents import sweep_agents

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


def _alive(identity: tuple[int, int]) -> bool:
    from ksearch_ray.distributed.watchdog import _stat

    pid, start = identity
    info = _stat(pid)
    return info is not None and info[1] == start and not _gone(pid)


def test_a_local_ray_dies_with_its_driver_killed_with_sigkill(tmp_path):
    """A real `ksearch run` on the local Ray it starts, its driver killed with SIGKILL once its actors work:
    within 10 s no process that descended from the driver (GCS, raylet, agents, workers, sandboxes) is left.
    Measured before: the dashboard and runtime-env agents lived 61-65 s."""
    import time

    from ksearch_ray.distributed.stale_agents import _argv0
    from ksearch_ray.distributed.watchdog import _parents, descendants

    data = Path(__file__).parent / "data"
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONUNBUFFERED": "1"}
    driver = subprocess.Popen(
        [sys.executable, "-m", "ksearch_ray", "run", "--task", "toy_axpy", "--task-dir", str(data), "--device", "cpu",
         "--rounds", "400", "--no-progress", "--run-dir", str(tmp_path / "run")],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    noted: set[tuple[int, int]] = set()
    try:
        assert driver.stdout is not None
        seen = []
        for line in driver.stdout:
            seen.append(line)
            if "evaluating the seed" in line:
                break
        else:
            raise AssertionError("the run ended before its evaluators worked:\n" + "".join(seen[-20:]))
        noted = descendants({driver.pid}, _parents())
        names = {os.path.basename(_argv0(pid).split()[0]) if _argv0(pid) else "" for pid, _ in noted}
        assert "raylet" in names and any(n.startswith("ray::") for n in names), names  # a real Ray to take down
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait()
        deadline = time.monotonic() + 10
        left = {p for p in noted if _alive(p)}
        while left and time.monotonic() < deadline:
            time.sleep(0.2)
            left = {p for p in left if _alive(p)}
        assert not left, [f"{pid} {_argv0(pid)}" for pid, _ in sorted(left)]
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        for pid, _start in noted:  # whatever a failed test leaves, by pid
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


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
        swept = sweep_cgroups(mine.parent)  # with any other dead zygote's (a test beside this one may have killed one)
        assert dead in swept and mine.home not in swept, swept
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
    from ksearch_ray.evaluation.sandbox.handle import Sandbox
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
