"""What one candidate may use of the host: memory, processes, file size, disk and output.

Set in the zygote's processes (never by candidate code), from `Limits` (evaluation/settings.py):

* memory: RLIMIT_DATA on C, the process that runs the candidate. Not RLIMIT_AS: CUDA reserves
  address ranges far larger than any host memory (the unified address space; tens of TiB of
  PROT_NONE mappings) and fails to initialise under an address-space limit. RLIMIT_DATA counts
  private writable mappings only (heap, anonymous mmap, malloc arenas: what a hog grows), not those
  reservations, not the GPU's memory, and not the shared mappings of the GPU driver.
* processes: a pids cgroup per worker where the host has one (pids.py: `pids.max` is the limit plus
  the sandbox's own A and B; the zygote moves A into it before A starts anything), and RLIMIT_NPROC
  in C as well. A fork or a new thread past either fails with EAGAIN. RLIMIT_NPROC alone does not
  cap a process of the host's root (real uid 0 of the initial user namespace: the kernel exempts
  it), which C is where the sandbox stays host root: a host-root sandbox whose GPU nodes or task
  files are not open to `nobody` (isolation.py), or one without namespaces. There only the cgroup
  holds; a host-root zygote without one says so at start (client.IsolationReport), and
  `isolation: require` refuses to evaluate. The kernel counts RLIMIT_NPROC per user and, since
  Linux 5.14, per user namespace: in the isolated sandbox each candidate has a user namespace of
  its own, so the count is the candidate's own processes and threads, and the host user's other
  processes neither count nor suffer. Without namespaces the count is the host user's: the limit
  is set that many above what the user already runs (never lower than the user's own).
* file size: RLIMIT_FSIZE (a write past it fails and raises SIGXFSZ).
* disk: the trusted parent of C (B, the namespace's init; or A without namespaces) adds up the
  job directory and the Triton cache every second and stops the candidate past the limit; the
  sandbox's own /tmp and /dev/shm are tmpfs mounts of that size.
* output: C's stdout and stderr are pipes that the same parent drains into stdout.log and
  stderr.log, up to the limit: past it, the candidate is stopped (nothing more is written).

A candidate stopped by the parent exits with a code of its own (OUTPUT_LIMIT, DISK_LIMIT), which
the evaluator turns into Status.RESOURCE_LIMIT with a one-line message (session.limit_hit); so does
a refused allocation, fork or thread, from what the candidate's process said (EAGAIN for a fork).
"""

from __future__ import annotations

import contextlib
import os
import resource
import select
import signal
import stat
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import BinaryIO

OUTPUT_LIMIT = 92  # exit code of a worker stopped for printing past the output limit
DISK_LIMIT = 93  # ... for filling its job directory past the disk limit
LOG_TAIL_BYTES = 1 << 16  # what the evaluator reads of a worker's log, from its end
_MB = 1 << 20
_CHUNK = 1 << 16


@dataclass(frozen=True)
class Resources:
    """The limits of one candidate, in MiB and processes; 0: none."""

    memory_mb: int = 0
    processes: int = 0
    file_mb: int = 0
    disk_mb: int = 0
    output_mb: int = 0

    @classmethod
    def of(cls, values: dict[str, int] | None) -> Resources:
        return cls(**(values or {}))


def _user_tasks(uid: int) -> int:
    """Processes and threads of `uid` on this host (what RLIMIT_NPROC counts without namespaces)."""
    count = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(f"/proc/{entry}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
            if int(fields["Uid"].split()[0]) == uid:
                count += int(fields["Threads"])
    return count


def host_root() -> bool:
    """Whether this process's real uid is the host's root (uid 0 of the initial user namespace): the
    one user RLIMIT_NPROC does not bind."""
    if os.getuid() != 0:
        return False
    try:
        with open("/proc/self/uid_map") as f:
            lines = f.read().splitlines()
    except OSError:
        return True
    for line in lines:
        inside, outside, count = (int(n) for n in line.split())
        if inside <= 0 < inside + count:
            return outside == 0
    return False


def apply_limits(limits: Resources, *, own_namespace: bool) -> None:
    """In C, after privileges are dropped and before any candidate code."""
    def cap(kind: int, value: int) -> None:
        _soft, hard = resource.getrlimit(kind)
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(kind, (value, value))

    cap(resource.RLIMIT_CORE, 0)  # a core dump of a 30 GiB process is disk nobody asked for
    if limits.memory_mb:
        cap(resource.RLIMIT_DATA, limits.memory_mb * _MB)
    if limits.file_mb:
        cap(resource.RLIMIT_FSIZE, limits.file_mb * _MB)
    if limits.processes:
        cap(resource.RLIMIT_NPROC, limits.processes if own_namespace else _user_tasks(os.getuid()) + limits.processes)


def disk_usage(paths: list[str]) -> int:
    """Bytes of disk the files under `paths` take (links not followed)."""
    total = 0
    for top in paths:
        for root, dirs, files in os.walk(top):
            for name in dirs + files:
                with contextlib.suppress(OSError):
                    total += os.lstat(os.path.join(root, name)).st_blocks * 512
    return total


def watch(child: int, logs: Mapping[int, BinaryIO], limits: Resources, disk_paths: list[str],
          stop: Callable[[int], None]) -> int:
    """In C's parent: drain C's output pipes (read end -> its log file, opened before C existed) up to
    the output limit, check the disk every second, reap every child (orphans included) until C ends.
    Returns C's wait status, or a made-up exit status (OUTPUT_LIMIT, DISK_LIMIT) when C had to be
    stopped; `stop(c)` kills C and everything it started. It sleeps in select() between C's writes,
    its children's ends (SIGCHLD, through a wake-up pipe) and the disk checks: no polling beside a
    timed kernel."""
    live = set(logs)  # pipes not at their end yet
    for fd in logs:
        os.set_blocking(fd, False)
    cap = limits.output_mb * _MB
    written = 0

    def drain(fd: int, chunks: int) -> bool:
        """Up to `chunks` reads of what is in `fd` now, into its log; False once past the cap."""
        nonlocal written
        for _ in range(chunks):
            try:
                data = os.read(fd, _CHUNK)
            except BlockingIOError:
                return True
            if not data:
                live.discard(fd)
                return True
            logs[fd].write(data if not cap else data[: max(cap - written, 0)])
            written += len(data)
            if cap and written > cap:
                return False
        return True

    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    previous_handler = signal.signal(signal.SIGCHLD, lambda _sig, _frame: None)
    previous_fd = signal.set_wakeup_fd(wake_w)
    status: int | None = None
    verdict: int | None = None
    next_disk = time.monotonic() + 1.0
    try:
        while status is None and verdict is None:
            while True:  # reap: C, and orphans (this process is the namespace's init or a subreaper)
                try:
                    pid, wstatus = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    pid, wstatus = child, 1 << 8
                if pid == 0:
                    break
                if pid == child:
                    status = wstatus
                    break
            if status is not None:
                break
            timeout = max(next_disk - time.monotonic(), 0.0) if limits.disk_mb else None
            ready = select.select([*sorted(live), wake_r], [], [], timeout)[0]
            for fd in ready:
                if fd == wake_r:
                    with contextlib.suppress(BlockingIOError):
                        os.read(wake_r, 4096)
                elif not drain(fd, 1):
                    verdict = OUTPUT_LIMIT
                    break
            if verdict is None and limits.disk_mb and time.monotonic() >= next_disk:
                next_disk = time.monotonic() + 1.0
                if disk_usage(disk_paths) > limits.disk_mb * _MB:
                    verdict = DISK_LIMIT
        if verdict is None:
            # C is gone: what its pipes hold now (never wait on a pipe a grandchild keeps open).
            for fd in sorted(live):
                if not drain(fd, 64):
                    verdict = OUTPUT_LIMIT
        elif status is None:
            stop(child)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(child, 0)
    finally:
        signal.set_wakeup_fd(previous_fd)
        signal.signal(signal.SIGCHLD, previous_handler)
        os.close(wake_r)
        os.close(wake_w)
        for fd, f in logs.items():
            f.close()
            with contextlib.suppress(OSError):
                os.close(fd)
    if verdict is not None:
        return verdict << 8
    assert status is not None
    return status


def stop_namespace(_child: int) -> None:
    """As PID 1 of the candidate's PID namespace: kill every other process in it."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(-1, signal.SIGKILL)


def read_tail(path: str | os.PathLike[str], limit: int) -> str:
    """The last `limit` bytes of a plain file at most, as text ('' if it cannot be read): never the
    whole of a log a candidate may have made huge, and never a link or a FIFO it put in its place."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return ""
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return ""
        return os.pread(fd, limit, max(info.st_size - limit, 0)).decode(errors="replace")
    except OSError:
        return ""
    finally:
        os.close(fd)
