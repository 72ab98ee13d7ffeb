"""The ports of the private Ray that a `ksearch run` without --ray-address starts (distributed/cluster.py).

A user's `ray start --head` on the same machine needs its default ports: 6379 (GCS), 8265
(dashboard), 10001 (Ray client) and 52365 (the dashboard agent, which `ray job submit` needs). The
private Ray listens on none of the first three (it asks for no dashboard port and Ray picks free
ports for the rest). The agent's port it cannot avoid: Ray 2.60's `ray.init` has no parameter for
it and starts every local node's agent on 52365 (only `ray start --dashboard-agent-listen-port`
sets another), so docs/cluster.md gives the user's head the flag instead. The second test pins that
fact: when a Ray lets `ray.init` choose, it fails, and the private Ray and the docs should change.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import ray

from ksearch_ray.config import RunConfig
from ksearch_ray.distributed.cluster import init_ray

HEAD_DEFAULT_PORTS = {6379: "GCS", 8265: "dashboard", 10001: "Ray client"}
AGENT_DEFAULT_PORT = 52365


def _children(pids: set[int]) -> set[int]:
    """pids and all their descendants, from /proc."""
    parent_of: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parent_of[int(entry)] = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = set(pids), set(pids)
    while frontier:
        frontier = {pid for pid, parent in parent_of.items() if parent in frontier} - found
        found |= frontier
    return found


def _listening(pids: set[int]) -> dict[int, set[int]]:
    """TCP port -> the given processes listening on it (from /proc/net/tcp{,6} and the processes' fds)."""
    inodes: dict[str, int] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A":  # LISTEN
                inodes[fields[9]] = int(fields[1].rsplit(":", 1)[1], 16)
    out: dict[int, set[int]] = {}
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes:
                out.setdefault(inodes[target[8:-1]], set()).add(pid)
    return out


@pytest.fixture(scope="module")
def private_ray():
    if ray.is_initialized():
        ray.shutdown()
    os.environ.pop("RAY_ADDRESS", None)
    init_ray(RunConfig.model_validate({"task": "trimul"}))
    try:
        yield ray._private.worker._global_node
    finally:
        ray.shutdown()


def test_the_private_ray_listens_on_no_default_port_of_a_users_head_but_the_agents(private_ray) -> None:
    pids = _children({info.process.pid for infos in private_ray.all_processes.values() for info in infos})
    ports = _listening(pids)
    assert ports, "found none of the private Ray's sockets"
    taken = {f"{port} ({name})" for port, name in HEAD_DEFAULT_PORTS.items() if port in ports}
    assert not taken, f"the private Ray listens on a user's head's default ports: {sorted(taken)}"


def test_ray_init_cannot_move_the_agent_off_its_default_port_so_the_docs_move_the_users_head() -> None:
    """Read from Ray itself, not from a running node: on a shared machine another Ray may hold 52365
    already, and then the private Ray's agent is the one that loses it."""
    import inspect

    from ray._private.parameter import RayParams

    assert RayParams().dashboard_agent_listen_port == AGENT_DEFAULT_PORT
    assert not any("agent" in name for name in inspect.signature(ray.init).parameters)
    calls = inspect.getsource(ray._private.worker.init).split("RayParams(")[1:]  # the arguments ray.init gives
    assert calls and not any("agent" in call.split(")")[0] for call in calls)
    docs = (Path(__file__).resolve().parent.parent / "docs" / "cluster.md").read_text()
    assert "ray start --head --dashboard-agent-listen-port=" in docs and str(AGENT_DEFAULT_PORT) in docs
