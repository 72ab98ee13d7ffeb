"""Hostile candidates against the sandbox's isolation: run directory, home, loopback, signals, survivors.

Each candidate tries one thing and returns the right answer either way; the test checks that
the thing did not happen (the file is unchanged, the listener heard nothing, the sibling lives,
no process survives). The same candidates run once with isolation off, where the attack does
work: that is what shows each test can fail. Everything runs on the CPU path through the real
zygote and namespaces; the GPU script (experiments/gpu/h200_integrity.sh) repeats them on an H200.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from ksearch_ray.evaluation.evaluator import Evaluator
from ksearch_ray.evaluation.sandbox.isolation import Isolation
from ksearch_ray.evaluation.settings import Limits, TimingPolicy
from ksearch_ray.models import Status
from ksearch_ray.taskspec.task import Task, solution_from_file

DATA = Path(__file__).parent / "data"
CANDIDATES = DATA / "candidates"
LIMITS = Limits(setup=120, build_python=60, idle=20, total=120)


@pytest.fixture(scope="module")
def toy() -> Task:
    return Task.load(DATA / "toy")


@pytest.fixture(scope="module")
def jailed():
    ev = Evaluator("cpu", limits=LIMITS, timing=TimingPolicy(max_calls=5), isolation=Isolation.REQUIRE)
    yield ev
    ev.close()


@pytest.fixture(scope="module")
def unjailed():
    ev = Evaluator("cpu", limits=LIMITS, timing=TimingPolicy(max_calls=5), isolation=Isolation.OFF)
    yield ev
    ev.close()


def hostile(task: Task, name: str, target: str, tmp_path: Path):
    source = (CANDIDATES / f"{name}.py").read_text().replace("@TARGET@", target)
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    return solution_from_file(path, task)


def test_sandbox_lives_outside_the_working_directory_and_is_removed_on_close(toy):
    ev = Evaluator("cpu", limits=LIMITS, isolation=Isolation.REQUIRE)
    root = ev.work_root
    try:
        assert not root.is_relative_to(Path.cwd())
        assert root.stat().st_mode & 0o077 == 0
    finally:
        ev.close()
    assert not root.exists()


def test_run_directory_is_out_of_reach(jailed, unjailed, toy, tmp_path):
    run_dir = tmp_path / "runs" / "r1"
    run_dir.mkdir(parents=True)
    events = run_dir / "events.jsonl"
    events.write_text('{"kind": "start"}\n')
    result = jailed.evaluate(toy, hostile(toy, "write_run_dir", str(events), tmp_path), workload_set="tests")
    assert result.status is Status.PASSED, result.message
    assert events.read_text() == '{"kind": "start"}\n'
    unjailed.evaluate(toy, hostile(toy, "write_run_dir", str(events), tmp_path), workload_set="tests")
    assert "speedup" in events.read_text()  # the same candidate, unconfined, does write


def test_home_is_neither_writable_nor_readable(jailed, unjailed, toy, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    secret = home / "auth_token"
    secret.write_text("s3cr3t")
    planted = home / "planted"
    wrote = jailed.evaluate(toy, hostile(toy, "write_home", str(planted), tmp_path), workload_set="tests")
    read = jailed.evaluate(toy, hostile(toy, "read_home", str(secret), tmp_path), workload_set="tests")
    assert wrote.status is Status.PASSED and not planted.exists()
    assert read.status is Status.PASSED, read.message  # a readable secret would have changed the answer
    assert unjailed.evaluate(toy, hostile(toy, "read_home", str(secret), tmp_path), workload_set="tests").status \
        is Status.INCORRECT_NUMERICAL


def test_loopback_services_are_unreachable(jailed, unjailed, toy, tmp_path):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        server.settimeout(0.5)
        port = str(server.getsockname()[1])
        result = jailed.evaluate(toy, hostile(toy, "loopback", port, tmp_path), workload_set="tests")
        assert result.status is Status.PASSED, result.message
        with pytest.raises(TimeoutError):
            server.accept()
        unjailed.evaluate(toy, hostile(toy, "loopback", port, tmp_path), workload_set="tests")
        server.accept()[0].close()  # unconfined, the connection arrives


def test_other_processes_cannot_be_signalled(jailed, unjailed, toy, tmp_path):
    sibling = subprocess.Popen(["sleep", "300"])
    try:
        jailed.evaluate(toy, hostile(toy, "kill_sibling", str(sibling.pid), tmp_path), workload_set="tests")
        time.sleep(0.2)
        assert sibling.poll() is None
        unjailed.evaluate(toy, hostile(toy, "kill_sibling", str(sibling.pid), tmp_path), workload_set="tests")
        assert sibling.wait(timeout=10) == -signal.SIGKILL
    finally:
        sibling.kill()
        sibling.wait()


def test_killing_the_parent_leaves_the_zygote_alive(jailed, toy):
    starts = jailed.sandbox.zygote_starts
    result = jailed.evaluate(toy, solution_from_file(CANDIDATES / "kill_parent.py", toy), workload_set="tests")
    # Inside, the parent is the namespace's init: immune, or out of the candidate's reach.
    assert result.status in {Status.PASSED, Status.RUNTIME_ERROR}, result.message
    assert jailed.sandbox.healthy() and jailed.sandbox.zygote_starts == starts


def _processes_with(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.mark.parametrize("name", ["setsid_child", "double_fork"])
@pytest.mark.parametrize("mode", ["jailed", "unjailed"])
def test_no_process_survives_the_evaluation(request, toy, tmp_path, name, mode):
    ev = request.getfixturevalue(mode)  # unconfined too: the worker's subreaper collects orphans
    marker = f"{86400 + secrets.randbelow(10**6)}.{secrets.randbelow(10**6)}"
    result = ev.evaluate(toy, hostile(toy, name, marker, tmp_path), workload_set="tests")
    assert result.status is Status.PASSED, (result.message, result.log)
    deadline = time.monotonic() + 5
    while _processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    survivors = _processes_with(marker)
    for pid in survivors:
        os.kill(pid, signal.SIGKILL)
    assert not survivors


_ON_A_HOST_WITHOUT_USERNS = """
import sys
from ksearch_ray.evaluation.evaluator import Evaluator, Limits
from ksearch_ray.evaluation.sandbox.handle import SandboxError
from ksearch_ray.evaluation.sandbox.isolation import Isolation
from ksearch_ray.taskspec.task import Task
try:
    with Evaluator("cpu", limits=Limits(idle=20), isolation=Isolation(sys.argv[2])) as ev:
        toy = Task.load(sys.argv[1])
        print(ev.sandbox.report.isolated, ev.evaluate(toy, toy.baseline(), workload_set="tests").status.value)
except SandboxError as exc:
    print("refused:", exc)
"""


def _without_user_namespaces(mode: str) -> subprocess.CompletedProcess[str]:
    """Run an evaluator where creating user namespaces is forbidden (a namespace of its own with
    max_user_namespaces 0, as in a container that allows none): the host such users have."""
    script = (f"echo 0 > /proc/sys/user/max_user_namespaces && exec {sys.executable} -c "
              f"'{_ON_A_HOST_WITHOUT_USERNS}' {DATA / 'toy'} {mode}")
    return subprocess.run(["unshare", "--user", "--map-root-user", "sh", "-c", script],
                          capture_output=True, text=True, timeout=300)


def test_require_refuses_a_host_without_namespaces():
    proc = _without_user_namespaces("require")
    assert "refused: isolation required (--isolation require) but unavailable on this host" in proc.stdout, proc.stderr


def test_best_effort_runs_but_says_loudly_what_is_lost():
    proc = _without_user_namespaces("best-effort")
    assert proc.stdout.split() == ["False", "PASSED"], proc.stderr[-2000:]
    assert "WARNING: sandbox isolation is unavailable on this host" in proc.stderr
    assert "no network (loopback included)" in proc.stderr


_AS_NOBODY = """
import json, sys
from pathlib import Path
from ksearch_ray.evaluation.evaluator import Evaluator, Limits
from ksearch_ray.evaluation.sandbox.isolation import Isolation
from ksearch_ray.taskspec.task import Task, solution_from_file
toy = Task.load(sys.argv[1])
out = {}
with Evaluator("cpu", limits=Limits(idle=20), isolation=Isolation.REQUIRE) as ev:
    out["isolated"] = ev.sandbox.report.isolated
    for path in sys.argv[2:]:
        out[Path(path).stem] = ev.evaluate(toy, solution_from_file(Path(path), toy), workload_set="tests").status.value
print(json.dumps(out))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping to an unprivileged uid needs root to start from")
def test_an_unprivileged_user_gets_the_same_isolation(toy):
    """The path real users take on a cluster: no root, only an unprivileged user namespace."""
    system_python = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"
    site = next((p for p in sys.path if p.endswith("site-packages") and os.access(p, os.R_OK)), None)
    if not os.path.exists(system_python) or site is None:
        pytest.skip("no system Python of this version to run as another user")
    base = Path(tempfile.mkdtemp(prefix="ksr-unprivileged-"))  # pytest's tmp_path is private to root
    try:
        base.chmod(0o755)
        home = base / "home"
        home.mkdir(mode=0o777)
        home.chmod(0o777)
        secret = home / "secret"
        secret.write_text("s3cr3t")
        secret.chmod(0o644)
        planted = home / "planted"
        sources = []
        for name, target in (("read_home", secret), ("write_home", planted)):
            path = base / f"{name}.py"
            path.write_text((CANDIDATES / f"{name}.py").read_text().replace("@TARGET@", str(target)))
            path.chmod(0o644)
            sources.append(str(path))
        repo = str(Path(__file__).resolve().parents[1])
        env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "PYTHONPATH": os.pathsep.join([repo, site])}
        proc = subprocess.run(
            [system_python, "-c", _AS_NOBODY, str(DATA / "toy"), *sources], env=env, cwd=str(home),
            capture_output=True, text=True, timeout=300, user=65534, group=65534, extra_groups=[],
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        assert out == {"isolated": True, "read_home": "PASSED", "write_home": "PASSED"}, proc.stderr[-2000:]
        assert not planted.exists()
    finally:
        shutil.rmtree(base, ignore_errors=True)
