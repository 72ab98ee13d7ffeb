"""Nothing left behind: a sandbox folder whose process was killed with SIGKILL is removed by the next
sandbox made under the same root; a folder whose process lives is never touched."""

from __future__ import annotations

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
