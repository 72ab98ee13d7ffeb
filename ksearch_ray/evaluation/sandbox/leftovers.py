"""Sandbox folders that outlive their run: claimed while in use, swept by the next sandbox.

A sandbox's private folder (`client.default_work_root`) is removed when its evaluator closes. A driver
killed with SIGKILL never closes it, so each folder holds a claim: an exclusive flock on its `.owner`
file, taken by the process that made it and released by the kernel when that process dies, however it
dies. Before a new folder is made, every folder under the same root whose claim can be taken is a
leftover of a dead process and is removed. A folder without a claim (made by an older version, or being
made right now) is left alone: on a machine shared by several users of one account, only a folder
provably abandoned is removed.

A zygote's pids cgroups (pids.py) outlive it the same way. Its folder is named by its pid and start
time; a folder whose process is gone is removed, the processes still in it killed first (a candidate
run without namespaces may outlive its zygote). A live zygote's folder is never touched.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
from pathlib import Path
from typing import IO

from ksearch_ray.evaluation.sandbox import pids

log = logging.getLogger(__name__)

OWNER = ".owner"
_claims: dict[Path, IO[str]] = {}


def claim(folder: Path) -> None:
    """Hold `folder` for this process's lifetime (or until `release`)."""
    fh = open(folder / OWNER, "w", encoding="utf-8")  # noqa: SIM115  (held while the folder is in use)
    fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    fh.write(f"{os.getpid()}\n")
    fh.flush()
    _claims[folder.resolve()] = fh


def release(folder: Path) -> None:
    fh = _claims.pop(folder.resolve(), None)
    if fh is not None:
        fh.close()


def sweep(root: Path, prefix: str = "sandbox-") -> list[Path]:
    """Remove the folders under `root` whose owner died; the ones removed."""
    removed = []
    for folder in sorted(root.glob(f"{prefix}*")):
        owner = folder / OWNER
        if folder.resolve() in _claims or not owner.is_file() or folder.is_symlink():
            continue
        try:
            fh = open(owner, encoding="utf-8")  # noqa: SIM115
        except OSError:
            continue
        with fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # its owner lives
            shutil.rmtree(folder, ignore_errors=True)
            with contextlib.suppress(OSError):
                fh.seek(0)
                log.info("removed the sandbox folder %s left by process %s", folder, fh.read().strip() or "?")
            removed.append(folder)
    return removed


def sweep_cgroups(parent: Path) -> list[Path]:
    """Remove the zygote folders of pids cgroups under `parent` (pids.PARENT) whose zygote is gone,
    with their workers' cgroups; the ones removed."""
    removed = []
    for home in sorted(parent.glob("zygote-*")):
        zygote = pids.zygote_of(home.name)
        if zygote is None or pids.start_time(zygote[0]) == zygote[1]:
            continue  # not ours, or its zygote lives
        workers = sorted(home.glob("worker-*"))
        if all([pids.remove(worker) for worker in workers]) and pids.remove(home):
            log.info("removed the pids cgroup %s of a zygote that is gone (%d workers)", home, len(workers))
            removed.append(home)
        else:
            # A member not yet reaped (a zombie whose parent has not waited for it) keeps the folder busy; the
            # next sweep takes it. An empty folder costs nothing, and a run's output is no place for it.
            log.info("the pids cgroup %s of a zygote that is gone still has members; left for the next sweep", home)
    return removed
