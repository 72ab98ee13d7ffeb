"""A local Ray that dies with its driver, however the driver ends.

A driver that starts its own Ray (`ksearch run` without --ray-address) starts a watchdog beside it: a
small process of its own session that holds the read end of a pipe from the driver and, while the driver
lives, notes every process descending from it (Ray's GCS and raylet, the raylet's agents and workers, the
sandboxes those start) with its start time. The driver ends the watch when it shuts Ray down itself; if
instead the pipe closes unannounced, or the driver's pid is gone, the driver died (`kill -9`): the
watchdog kills, by pid, every noted process still alive and their descendants, then exits. Measured
before: after `kill -9` of the driver, Ray's dashboard and runtime-env agents lived 61-65 s. The
watchdog touches only processes that descended from the driver (a pid reused since is told apart by its
start time), never another run's or another user's Ray.

Run as `python -m ksearch_ray.distributed.watchdog DRIVER_PID`, stdin the pipe.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

PROC = Path("/proc")
POLL_S = 0.5
"""How often the watchdog notes the driver's descendants (a process younger than this when the driver
dies is still found, as a descendant of one noted)."""
STOP = b"stop\n"

Identity = tuple[int, int]
"""(pid, start time in clock ticks since boot): a process, not a pid that may be reused."""


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time) of a process, None once it is gone."""
    try:
        raw = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()  # after the command name, which may hold spaces
    try:
        return int(fields[1]), int(fields[19])
    except (IndexError, ValueError):
        return None


def _parents() -> dict[int, tuple[int, int]]:
    """Every process: pid -> (parent pid, start time)."""
    table = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit() and (info := _stat(int(entry.name))) is not None:
            table[int(entry.name)] = info
    return table


def descendants(roots: set[int], table: dict[int, tuple[int, int]]) -> set[Identity]:
    """The processes below these pids (not the roots themselves)."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _start) in table.items():
        children.setdefault(ppid, []).append(pid)
    found: set[Identity] = set()
    todo = list(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            identity = (child, table[child][1])
            if identity not in found:
                found.add(identity)
                todo.append(child)
    return found


def _kill_all(noted: set[Identity]) -> int:
    """Kill the noted processes still alive, and whatever descends from them; how many were killed."""
    killed = 0
    for _ in range(3):  # what a dying parent forked meanwhile
        table = _parents()
        alive = {(pid, start) for pid, start in noted if pid in table and table[pid][1] == start}
        targets = alive | descendants({pid for pid, _ in alive}, table)
        targets.discard((os.getpid(), table.get(os.getpid(), (0, 0))[1]))
        if not targets:
            break
        for pid, _start in sorted(targets):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
        noted |= targets
        time.sleep(0.2)
    return killed


def watch(driver: int) -> int:
    """The watchdog's loop (stdin: the pipe from the driver)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C meant for the driver
    started = _stat(driver)
    if started is None:
        return 0
    me = os.getpid()
    noted: set[Identity] = set()
    while True:
        ready, _, _ = select.select([sys.stdin.buffer], [], [], POLL_S)
        if ready:
            data = os.read(sys.stdin.fileno(), 64)
            if data.startswith(STOP):
                return 0
            if not data:
                break  # the pipe closed without a word: the driver is gone
        now = _stat(driver)
        if now is None or now[1] != started[1]:
            break
        noted |= {p for p in descendants({driver}, _parents()) if p[0] != me}
    _kill_all(noted)
    return 0


_watchdog: subprocess.Popen[bytes] | None = None


def guard() -> None:
    """Start the watchdog of this driver (once), in a session of its own: a signal to the driver's process
    group (a Ctrl-C) does not reach it first."""
    global _watchdog
    if _watchdog is not None and _watchdog.poll() is None:
        return
    package_parent = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (package_parent, os.environ.get("PYTHONPATH")) if p)}
    _watchdog = subprocess.Popen([sys.executable, "-m", "ksearch_ray.distributed.watchdog", str(os.getpid())],
                                 stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                 start_new_session=True, env=env)


def unguard() -> None:
    """End the watch: Ray was shut down in order."""
    global _watchdog
    proc, _watchdog = _watchdog, None
    if proc is None:
        return
    if proc.stdin is not None:
        with contextlib.suppress(OSError):
            proc.stdin.write(STOP)
            proc.stdin.close()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


if __name__ == "__main__":
    sys.exit(watch(int(sys.argv[1])))
