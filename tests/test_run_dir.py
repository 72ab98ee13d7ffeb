"""A run directory that can always be opened again: a torn last line is repaired (moved aside and said,
by the writer; left out in memory, by readers), a corrupt line elsewhere is refused in one line naming it
and the way out, and a directory that cannot be written (read-only, full) is one line and exit 2."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from cli_runner import ksearch
from local_backends import FakeEvaluators, idea_planner, local_search, toy_kernel

from ksearch_ray.models import Status
from ksearch_ray.policies.contract import CodeReply
from ksearch_ray.store import RunDirError, RunStore

ROOT = Path(__file__).resolve().parents[1]


def finished_run(tmp_path: Path) -> Path:
    from local_backends import ScriptedPolicy

    tags = iter(range(1, 1000))
    coder = ScriptedPolicy(code=lambda _r: CodeReply(solution=toy_kernel(f"k{next(tags)}")))
    search = local_search(tmp_path, idea_planner(), coder, FakeEvaluators(lambda s: (1.0, Status.PASSED, "")), rounds=2)
    asyncio.run(search.run())
    search.store.close()
    return search.store.root


def lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


@pytest.mark.parametrize("newline", [True, False], ids=["ending-in-newline", "without-newline"])
def test_a_torn_last_line_is_read_without_by_readers_and_moved_aside_by_the_writer(tmp_path, newline):
    root = finished_run(tmp_path)
    log = root / "events.jsonl"
    whole = log.read_bytes()
    torn = b'{"kind": "candidate", "round": 3, "cyc' + (b"\n" if newline else b"")
    log.write_bytes(whole + torn)
    number = len(lines(log))
    # Readers: the run is shown and reported, the tail named in one line, and nothing written.
    for command in (["show", str(root)], ["report", str(root)]):
        done = ksearch(tmp_path, *command)
        assert done.returncode == 0, done.stderr
        said = [line for line in done.stderr.splitlines() if "events.jsonl" in line]
        assert len(said) == 1 and f"line {number} (the last" in said[0] and "ksearch resume" in said[0]
    assert log.read_bytes() == whole + torn
    # The writer (resume opens the store this way): the tail goes aside, said in one line, never silently.
    store = RunStore.open(root)
    store.close()
    assert store.repaired is not None and f"line {number}" in store.repaired and "\n" not in store.repaired
    assert log.read_bytes() == whole
    assert (root / f"events.torn-{number}.jsonl").read_bytes() == torn
    assert ksearch(tmp_path, "show", str(root)).returncode == 0


def test_a_last_event_that_lost_only_its_newline_is_kept(tmp_path):
    root = finished_run(tmp_path)
    log = root / "events.jsonl"
    whole = log.read_bytes()
    log.write_bytes(whole[:-1])
    count = len(RunStore(root).read_events())
    store = RunStore.open(root)
    store.close()
    assert store.repaired is None and log.read_bytes() == whole and len(store.read_events()) == count


def test_a_corrupt_line_before_the_last_is_refused_naming_the_line_and_the_way_out(tmp_path):
    root = finished_run(tmp_path)
    log = root / "events.jsonl"
    rows = lines(log)
    rows[2] = b'{"kind": "no such event"}\n'
    log.write_bytes(b"".join(rows))
    for command in (["show", str(root)], ["report", str(root)], ["resume", str(root), "--no-progress"]):
        done = ksearch(tmp_path, *command)
        assert done.returncode == 2, (command, done.stdout, done.stderr)
        err = done.stderr.strip()
        assert len(err.splitlines()) == 1 and "line 3 of" in err and "head -n 2" in err, err
    with pytest.raises(RunDirError):
        RunStore.open(root)


def _unshare_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    done = subprocess.run(["unshare", "-rm", "true"], capture_output=True)
    return done.returncode == 0


needs_namespaces = pytest.mark.skipif(not _unshare_works(), reason="needs unprivileged mount namespaces (unshare -rm)")


@needs_namespaces
def test_resuming_a_read_only_run_directory_is_one_line_and_exit_2(tmp_path):
    root = finished_run(tmp_path)
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    script = (f"mount --bind {root} {root} && mount -o remount,bind,ro {root} && "
              f"exec {sys.executable} -m ksearch_ray resume {root} --no-progress")
    done = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=120)
    assert done.returncode == 2, done.stderr
    err = done.stderr.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "read-only" in err[0] and "cp -r" in err[0]


@needs_namespaces
def test_a_full_disk_while_writing_the_log_is_one_line_and_the_run_reopens(tmp_path):
    """The log's write fails with the kernel's own ENOSPC on a tiny tmpfs: one line, and the part that was
    written is a torn tail that the next open moves aside."""
    disk = tmp_path / "disk"
    disk.mkdir()
    code = textwrap.dedent(f"""
        from pathlib import Path
        from ksearch_ray.events import Resume
        from ksearch_ray.store import RunDirError, RunStore
        store = RunStore.create(Path({str(disk)!r}) / "run", {{"run_id": "run"}})
        try:
            with open({str(disk)!r} + "/filler", "wb") as f:
                while True:
                    f.write(b"x" * 4096)
                    f.flush()
        except OSError:
            pass
        try:
            for _ in range(10_000):
                store.append(Resume(budget={{"note": "y" * 300}}))
        except RunDirError as exc:
            print("REFUSED", exc)
        store.close()
        Path({str(disk)!r} + "/filler").unlink()
        again = RunStore.open(Path({str(disk)!r}) / "run")
        print("REOPENED", len(again.read_events()), again.repaired)
    """)
    (tmp_path / "fill.py").write_text(code)
    script = f"mount -t tmpfs -o size=256k tmpfs {disk} && exec {sys.executable} {tmp_path / 'fill.py'}"
    done = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    refused = next(line for line in done.stdout.splitlines() if line.startswith("REFUSED"))
    assert "No space left on device" in refused and "the disk is full" in refused
    assert "REOPENED" in done.stdout
