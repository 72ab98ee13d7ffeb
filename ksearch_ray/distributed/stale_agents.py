"""Ray's per-node agents that outlive their cluster, swept when the next local cluster starts.

When a driver that started an embedded cluster is killed with SIGKILL, Ray's raylet and GCS go at once,
but its dashboard and runtime-env agents notice the raylet's death and then spend about a minute trying
to report it to a GCS that is gone (measured: 61-65 s on a 2-core machine). An agent whose parent is no
longer a raylet belongs to no cluster: the next local cluster kills it by pid. An agent of a live
cluster (another user's, another run's) has its raylet as parent and is never touched.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from pathlib import Path

log = logging.getLogger(__name__)

AGENTS = ("ray::DashboardAgent", "ray::RuntimeEnvAgent")
PROC = Path("/proc")


def _argv0(pid: int) -> str:
    with contextlib.suppress(OSError):
        raw = (PROC / str(pid) / "cmdline").read_bytes()
        return raw.split(b"\0")[0].decode(errors="replace")
    return ""


def _ppid_uid(pid: int) -> tuple[int, int] | None:
    try:
        status = (PROC / str(pid) / "status").read_text()
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    try:
        return int(fields["PPid"]), int(fields["Uid"].split()[0])
    except (KeyError, ValueError, IndexError):
        return None


def orphaned_agents() -> list[int]:
    """This user's Ray agents whose parent is not a raylet (their cluster is gone)."""
    if not PROC.is_dir():
        return []
    found = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        if not _argv0(pid).startswith(AGENTS):
            continue
        info = _ppid_uid(pid)
        if info is None or info[1] != os.getuid():
            continue
        parent = os.path.basename(_argv0(info[0]).split()[0]) if info[0] > 1 and _argv0(info[0]) else ""
        if parent != "raylet":
            found.append(pid)
    return sorted(found)


def sweep_agents() -> list[int]:
    """Kill (by pid) the agents of clusters that are gone; the pids killed."""
    killed = []
    for pid in orphaned_agents():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
            log.info("killed Ray agent %d (%s), left by a cluster that is gone", pid, _argv0(pid) or "?")
    return killed
