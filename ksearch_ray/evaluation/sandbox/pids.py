"""A hard cap on a candidate's processes and threads: one pids cgroup per worker.

RLIMIT_NPROC (resources.py) caps a candidate that runs as any user but the host's root: the kernel
does not apply it to a process whose real uid is the initial user namespace's root. A candidate
runs as that root where its worker stays host root (isolation.py: a host-root sandbox whose GPU
nodes or task files are not open to `nobody`, or no namespaces at all). A pids cgroup binds every
process, root's included, so the zygote makes one per worker and moves A into it before A goes on:
B, C and everything C starts are in it from their first instruction, and a fork or a new thread
past `pids.max` fails with EAGAIN, as it does under RLIMIT_NPROC.

Where: the pids hierarchy of cgroup v1 where one is mounted; else cgroup v2 where the zygote's own
cgroup offers the pids controller and hands it down (the root cgroup, or a delegated subtree whose
`cgroup.subtree_control` takes "+pids"). Under the zygote's own cgroup:

    ksearch-ray/                  shared by the zygotes of that cgroup; never removed
      zygote-<pid>-<start>/       one zygote: its pid and start time (a reused pid is told apart)
        worker-<A's pid>/         one worker's tree; pids.max: the limit plus A and B

A worker's cgroup goes when the zygote reaps A (any process still in it is killed first); a
zygote's when its evaluator closes it, or after a SIGKILL, when the next sandbox sweeps the
folder (leftovers.sweep_cgroups).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import signal
import time
from pathlib import Path

PARENT = "ksearch-ray"
_OCTAL = re.compile(r"\\([0-7]{3})")


def _unescape(field: str) -> str:
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field)


def locate(mountinfo: str, cgroups: str) -> tuple[Path, int] | str:
    """Where this process's own pids cgroup is on the filesystem, and the cgroup version, from the
    texts of /proc/self/mountinfo and /proc/self/cgroup; or why there is none."""
    own: dict[int, str] = {}
    for line in cgroups.splitlines():
        hierarchy, controllers, where = line.split(":", 2)
        if hierarchy == "0" and not controllers:
            own[2] = where
        elif "pids" in controllers.split(","):
            own[1] = where
    mounts: list[tuple[str, set[str], str, str]] = []  # fstype, super options, root, mount point
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) >= 5 and len(tail) >= 3:
            mounts.append((tail[0], set(tail[2].split(",")), _unescape(fields[3]), _unescape(fields[4])))
    for version, fstype in ((1, "cgroup"), (2, "cgroup2")):
        path = own.get(version)
        if path is None:
            continue
        for kind, options, root, point in mounts:
            if kind != fstype or (version == 1 and "pids" not in options):
                continue
            if path == root or path.startswith(root.rstrip("/") + "/"):
                return Path(point) / path[len(root):].lstrip("/"), version
        if version == 1:
            return f"the cgroup v1 pids hierarchy of this process ({path}) is not mounted here"
    if 2 in own:
        return f"this process's cgroup v2 ({own[2]}) is not mounted here"
    return "this host has no pids cgroup controller"


def start_time(pid: int) -> int | None:
    """When `pid` started (clock ticks after boot), or None if no such process: with the pid, it names
    one process for the life of the host."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _enable(cgroup: Path) -> None:
    """cgroup v2: hand the pids controller down to `cgroup`'s children."""
    if "pids" not in (cgroup / "cgroup.subtree_control").read_text().split():
        (cgroup / "cgroup.subtree_control").write_text("+pids")


def members(cgroup: Path) -> list[int]:
    try:
        return [int(p) for p in (cgroup / "cgroup.procs").read_text().split()]
    except FileNotFoundError:
        return []


def _kill_member(pid: int, cgroup: Path) -> None:
    """SIGKILL `pid` if it is (still) in `cgroup`: through a pidfd, so a pid reused meanwhile is never hit."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return
    try:
        suffix = f"/{cgroup.parent.name}/{cgroup.name}"  # a zygote's folder and its worker: unique names
        with open(f"/proc/{pid}/cgroup") as f:
            inside = any(line.rstrip("\n").endswith(suffix) for line in f)
        if inside:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
    except OSError:
        pass
    finally:
        os.close(fd)


def remove(cgroup: Path, patience: float = 2.0) -> bool:
    """Remove `cgroup` (no children of its own), killing any process left in it; False if it stays."""
    deadline = time.monotonic() + patience
    while True:
        try:
            cgroup.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                return False
        for pid in members(cgroup):  # escaped the namespace's end or the subreaper's sweep; or still exiting
            _kill_member(pid, cgroup)
        time.sleep(0.01)


class PidsCgroups:
    """This zygote's pids cgroups: one per worker, under a folder of its own."""

    def __init__(self, parent: Path, version: int):
        self.parent = parent  # .../ksearch-ray
        self.version = version
        self.home = parent / f"zygote-{os.getpid()}-{start_time(os.getpid())}"

    @classmethod
    def open(cls) -> tuple[PidsCgroups | None, str | None]:
        """This process's folder of pids cgroups, made and tried (a process moved into a capped
        cgroup); or None and why not."""
        with open("/proc/self/mountinfo") as m, open("/proc/self/cgroup") as c:
            located = locate(m.read(), c.read())
        if isinstance(located, str):
            return None, located
        own, version = located
        try:
            if version == 2:
                if "pids" not in (own / "cgroup.controllers").read_text().split():
                    return None, f"the cgroup v2 {own} does not offer the pids controller"
                _enable(own)
            (own / PARENT).mkdir(exist_ok=True)
            if version == 2:
                _enable(own / PARENT)
            cgroups = cls(own / PARENT, version)
            cgroups.home.mkdir()
        except OSError as exc:
            return None, f"no pids cgroup under {own}: {exc.strerror} ({exc.filename}, cgroup v{version})"
        try:
            if version == 2:
                _enable(cgroups.home)
            cgroups._try()
        except OSError as exc:
            remove(cgroups.home)
            return None, f"no pids cgroup under {own}: {exc.strerror} ({exc.filename}, cgroup v{version})"
        return cgroups, None

    def _try(self) -> None:
        r, w = os.pipe()
        child = os.fork()
        if child == 0:
            os.close(w)
            os.read(r, 1)
            os._exit(0)
        os.close(r)
        try:
            self.enter(child, 1)
        finally:
            os.close(w)
            os.waitpid(child, 0)
            self.leave(child)

    def worker(self, pid: int) -> Path:
        return self.home / f"worker-{pid}"

    def enter(self, pid: int, limit: int) -> None:
        """Move process `pid` (A, before it starts anything) into a cgroup of its own, where it and its
        descendants may be `limit` processes and threads at most (0: no limit)."""
        cgroup = self.worker(pid)
        cgroup.mkdir()
        (cgroup / "pids.max").write_text(str(limit) if limit else "max")
        (cgroup / "cgroup.procs").write_text(str(pid))

    def leave(self, pid: int) -> bool:
        """Once A is reaped: remove its cgroup, killing whatever is left in it; False if it stays."""
        with contextlib.suppress(FileNotFoundError):
            return remove(self.worker(pid))
        return True
