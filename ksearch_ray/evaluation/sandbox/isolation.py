"""Kernel isolation for candidate processes: user, mount, PID, network and IPC namespaces.

No root needed: an unprivileged user namespace gives the worker the right to build its own
filesystem view and to live in its own PID and network namespaces. What a candidate sees:

* a root of its own (tmpfs) holding, read-only, only what a build and a run need: system
  directories, the Python installation and its import paths, the ksearch_ray package, the
  task bundle, and the GPU device nodes; read-write only its job directory, its Triton cache
  directory and a private /tmp. The user's home, run directories and other users' files are
  not in it. A source checkout on the import path contributes its packages, not its other
  folders (run directories usually live there).
* a network namespace with nothing in it (its own loopback, down): no connection to the host's
  loopback services (the Ray head, an LLM server) or anywhere else.
* a PID namespace: no other process of the host can be named, signalled or traced; when the
  namespace's first process exits, the kernel kills every process left in it (setsid children,
  double-forked daemons).
* no capabilities (and, when the host user is root, the uid `nobody`), with no_new_privs.

The process tree per candidate: the zygote forks A (outside the namespaces, never runs
candidate code) which creates them; A forks B, PID 1 inside, which builds the filesystem view
and reaps; B forks C, the harness, which drops its privileges and runs the candidate.
Where a host refuses (no unprivileged user namespaces, as in some containers), the zygote
finds out once at start (`probe`) and the sandbox reports what is lost.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import platform
import signal
import stat
import struct
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path


class Isolation(StrEnum):
    """What an operator asks of the sandbox."""

    REQUIRE = "require"  # refuse to evaluate without every protection below
    BEST_EFFORT = "best-effort"  # use what the host offers; say loudly what is missing
    OFF = "off"  # no namespaces (debugging, overhead measurements); said loudly too


# What full isolation gives, named for the warning a host without it prints.
PROTECTIONS = (
    "private filesystem view (no writes outside the job directory; no reads of the home, the run "
    "directory or other users' files)",
    "no network (loopback included)",
    "no signals or ptrace to processes outside the candidate's own",
    "the kernel's guarantee that no process outlives the candidate (a subreaper still collects orphans)",
)

CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = (
    0x00020000, 0x08000000, 0x10000000, 0x20000000, 0x40000000)
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = (
    1, 2, 4, 8, 32, 4096, 16384, 1 << 18)
MS_NOATIME, MS_NODIRATIME, MS_RELATIME, MNT_DETACH = 1024, 2048, 1 << 21, 2
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_SECUREBITS = 1, 4, 24, 28
PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 36, 38, 47, 4
# noroot, no_setuid_fixup and keep_caps, each locked: no way back to capabilities through exec.
SECUREBITS_LOCKED_NOROOT = 0x2F
_SYSCALLS = {"x86_64": {"pivot_root": 155, "capset": 126}, "aarch64": {"pivot_root": 41, "capset": 91}}
NOBODY = 65534

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]


class IsolationError(Exception):
    """A step of the isolation set-up failed; the message names the step and the errno."""


def _ok(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise IsolationError(f"{what}: {os.strerror(err)} (errno {errno.errorcode.get(err, err)})")


def _syscall(name: str, *args: object) -> int:
    numbers = _SYSCALLS.get(platform.machine())
    if numbers is None:
        raise IsolationError(f"{name}: unsupported machine {platform.machine()}")
    return int(_libc.syscall(numbers[name], *args))


def prctl(option: int, arg: int = 0) -> None:
    _ok(_libc.prctl(option, arg, 0, 0, 0), f"prctl({option})")


def mount(src: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = [None if s is None else s.encode() for s in (src, target, fstype, data)]
    _ok(_libc.mount(enc[0], enc[1], enc[2], flags, enc[3]), f"mount {src or fstype} on {target}")


# --- the plan: what the candidate's filesystem holds -------------------------------------------


@dataclass
class MountPlan:
    """Paths bound into the candidate's root at their own location. Computed once in the zygote."""

    read_only: list[str] = field(default_factory=list)
    devices: list[str] = field(default_factory=list)
    symlinks: dict[str, str] = field(default_factory=dict)
    sandbox_uid: int | None = None  # host root only: the candidate runs as this uid where the job's files allow

    def with_job(self, read_only: Iterable[str], read_write: Iterable[str]) -> tuple[list[str], list[str]]:
        return _minimal([*self.read_only, *read_only]), [str(Path(p).resolve()) for p in read_write]


_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt")
_DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
_CHECKOUT_MARKERS = ("pyproject.toml", "setup.py", "setup.cfg", ".git")


def _minimal(paths: Iterable[str]) -> list[str]:
    """Existing real paths, with those inside another one dropped (a bind covers its subtree)."""
    real = sorted({os.path.realpath(p) for p in paths if p and os.path.exists(p)})
    out: list[str] = []
    for p in real:
        if not any(p == q or p.startswith(q.rstrip("/") + "/") for q in out):
            out.append(p)
    return out


def _overlaps(a: str, b: str) -> bool:
    return a == b or a.startswith(b.rstrip("/") + "/") or b.startswith(a.rstrip("/") + "/")


def _import_roots(entry: str, hidden: set[str]) -> list[str]:
    """What one sys.path entry contributes: the whole directory, or a checkout's packages only."""
    path = os.path.realpath(entry) if entry else ""
    if not path or path in hidden or not os.path.isdir(path) or path == "/":
        return [path] if path.endswith(".zip") and os.path.isfile(path) else []
    if not any(os.path.exists(os.path.join(path, m)) for m in _CHECKOUT_MARKERS):
        return [path]
    out = []
    for child in sorted(os.listdir(path)):
        full = os.path.join(path, child)
        if os.path.isfile(os.path.join(full, "__init__.py")) or child.endswith((".py", ".so", ".pth")):
            out.append(full)
    return out


def _loaded_library_dirs() -> list[str]:
    dirs = set()
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                parts = line.split(None, 5)
                if len(parts) == 6 and parts[5].startswith("/") and ".so" in parts[5]:
                    dirs.add(os.path.dirname(parts[5].strip()))
    except OSError:
        pass
    return sorted(dirs)


def build_plan(device: str, hidden: Iterable[str] = ()) -> MountPlan:
    """The read-only part of every candidate's view, from this (the zygote's) process."""
    import ksearch_ray

    hidden_set = {os.path.realpath(h) for h in hidden} | {os.path.realpath(os.getcwd())}
    ro: list[str] = [d for d in _SYSTEM_DIRS if os.path.isdir(d) and not os.path.islink(d)]
    ro += [sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))]
    ro.append(str(Path(ksearch_ray.__file__).resolve().parent))
    for entry in sys.path:
        ro += _import_roots(entry, hidden_set)
    ro += _loaded_library_dirs()
    # Caches a candidate reads but must not change: FlashInfer's JIT workspace (warm it first).
    for var in ("LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH", "FLASHINFER_WORKSPACE_BASE"):
        ro += [p for p in os.environ.get(var, "").split(os.pathsep) if p]
    symlinks = {d: os.readlink(d) for d in _SYSTEM_DIRS if os.path.islink(d)}
    devices = [f"/dev/{d}" for d in _DEVICES if os.path.exists(f"/dev/{d}")]
    if device == "cuda":
        devices += sorted(str(p) for p in Path("/dev").glob("nvidia*") if not p.is_dir())
        devices += sorted(str(p) for p in Path("/dev/nvidia-caps").glob("*")) if Path("/dev/nvidia-caps").is_dir() else []
    # Nothing at, under or above a hidden path (the sandbox root itself holds other jobs' files).
    ro = [p for p in _minimal(ro) if p != "/" and not any(_overlaps(p, h) for h in hidden_set)]
    uid = None
    if os.geteuid() == 0 and all(os.stat(d).st_mode & 0o006 == 0o006 for d in devices if "nvidia" in d):
        uid = NOBODY  # GPU nodes open to all (or no GPU): the candidate need not be root
    return MountPlan(read_only=ro, devices=devices, symlinks=symlinks, sandbox_uid=uid)


# --- the three processes ------------------------------------------------------------------------


def unshare_namespaces() -> None:
    """In A: new user, mount, PID, network and IPC namespaces (PID applies to A's children)."""
    _ok(_libc.unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC), "unshare")


def write_id_maps(pid: int, plan: MountPlan) -> None:
    """In the zygote, for A: who A's root is outside (the host user; nobody stays nobody)."""
    uid, gid = os.geteuid(), os.getegid()
    if plan.sandbox_uid is not None:  # host root: root for the set-up, nobody for the candidate
        maps = (f"0 {uid} 1\n{NOBODY} {NOBODY} 1\n", f"0 {gid} 1\n{NOBODY} {NOBODY} 1\n")
    else:
        maps = (f"0 {uid} 1\n", f"0 {gid} 1\n")
        with open(f"/proc/{pid}/setgroups", "w") as f:
            f.write("deny")
    with open(f"/proc/{pid}/uid_map", "w") as f:
        f.write(maps[0])
    with open(f"/proc/{pid}/gid_map", "w") as f:
        f.write(maps[1])


def _mountinfo_points(under: str) -> list[tuple[str, str]]:
    """(mount point, options) of every mount at or below `under`, outermost first."""
    out = []
    with open("/oldroot/proc/self/mountinfo") as f:  # during build_root the host's /proc is there
        for line in f:
            fields = line.split()
            point = fields[4].replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")
            if point == under or point.startswith(under.rstrip("/") + "/"):
                out.append((point, fields[5]))
    return out


_KEEP = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME,
         "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME}


def _bind(src: str, dst: str, *, read_only: bool, is_dir: bool) -> None:
    if is_dir:
        os.makedirs(dst, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        open(dst, "a").close()  # noqa: SIM115  (an empty file to bind onto)
    mount(src, dst, None, MS_BIND | MS_REC)
    if not read_only:
        return
    # Each mount of the bound subtree is remounted read-only, keeping the flags it had (a user
    # namespace may add restrictions to a mount, never drop them).
    for point, options in _mountinfo_points(dst):
        keep = sum(bit for name, bit in _KEEP.items() if name in options.split(","))
        mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | keep)


def build_root(plan: MountPlan, read_only: list[str], read_write: list[str], *, tmpfs_mb: int = 0) -> None:
    """In B (PID 1 of the new namespace, still privileged in it): the candidate's root, then pivot.
    `tmpfs_mb`: the size of the candidate's own /tmp and /dev/shm (memory the host gives them); 0: the
    kernel's default (half the host's memory)."""
    size = f",size={tmpfs_mb}m" if tmpfs_mb else ""
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    # The new root is a tmpfs on /tmp; sources stay reachable under /oldroot until the end.
    mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755")
    os.chdir("/tmp")
    os.mkdir("newroot")
    os.mkdir("oldroot")
    _ok(_syscall("pivot_root", b".", b"oldroot"), "pivot_root")
    os.chdir("/")
    new = "/newroot"
    mount("tmpfs", new, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755")
    # The skeleton first (binds under /tmp, e.g. the job directory, must land on top of it).
    os.makedirs(new + "/dev")
    mount("tmpfs", new + "/dev", "tmpfs", MS_NOSUID, "mode=0755")
    for dev in plan.devices:
        _bind("/oldroot" + dev, new + dev, read_only=False, is_dir=False)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"{new}/dev/{name}")
    os.makedirs(new + "/dev/shm")
    mount("tmpfs", new + "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777" + size)
    os.makedirs(new + "/tmp")
    mount("tmpfs", new + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777" + size)
    os.makedirs(new + "/proc")
    mount("proc", new + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)  # this PID namespace's only
    if os.path.isdir("/oldroot/sys"):
        _bind("/oldroot/sys", new + "/sys", read_only=True, is_dir=True)  # GPU topology for CUDA
    for link, target in plan.symlinks.items():
        if not os.path.lexists(new + link):
            os.symlink(target, new + link)
    for path in read_only:
        _bind("/oldroot" + path, new + path, read_only=True, is_dir=os.path.isdir("/oldroot" + path))
    for path in read_write:
        os.makedirs("/oldroot" + path, exist_ok=True)
        _bind("/oldroot" + path, new + path, read_only=False, is_dir=True)
    os.chdir(new)
    _ok(_syscall("pivot_root", b".", b"."), "pivot_root (final)")
    _ok(_libc.umount2(b".", MNT_DETACH), "umount old root")
    os.chdir("/")
    prctl(PR_SET_DUMPABLE, 0)  # nothing inside may trace or read the memory of this process


def chown_tree(paths: Iterable[str], uid: int) -> None:
    for top in paths:
        os.chown(top, uid, uid)
        for root, dirs, files in os.walk(top):
            for name in dirs + files:
                os.lchown(os.path.join(root, name), uid, uid)


def open_to_others(path: str) -> bool:
    """Whether a user other than the owner can read everything under `path` (its parent folders
    inside the sandbox are the sandbox's own, open to all)."""
    for root, _dirs, files in os.walk(path):
        if os.stat(root).st_mode & 0o005 != 0o005:
            return False
        if any(not os.stat(os.path.join(root, f)).st_mode & stat.S_IROTH for f in files):
            return False
    return True


def candidate_uid(plan: MountPlan, read_only: Iterable[str]) -> int | None:
    """`nobody` where the host user is root and the job's files are open to others; else None
    (the host user, without capabilities: where that is the host's root, RLIMIT_NPROC does not bind
    the candidate and only its worker's pids cgroup caps its processes, pids.py)."""
    if plan.sandbox_uid is None or not all(open_to_others(p) for p in read_only):
        return None
    return plan.sandbox_uid


def drop_privileges(uid: int | None) -> None:
    """In C, before any candidate code: no capabilities, ever again; `uid` (nobody) if given."""
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)  # capabilities go with uid 0
    else:
        cap = 0
        while _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == 0:
            cap += 1
        prctl(PR_SET_SECUREBITS, SECUREBITS_LOCKED_NOROOT)
        _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
        header = struct.pack("Ii", 0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
        data = bytes(24)  # effective, permitted, inheritable: empty (two 32-bit words each)
        _ok(_syscall("capset", header, data), "capset")
    prctl(PR_SET_NO_NEW_PRIVS, 1)


def die_with_parent() -> None:
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def become_subreaper() -> None:
    """Without a PID namespace: orphans of the candidate (setsid, double forks) come back to A."""
    prctl(PR_SET_CHILD_SUBREAPER, 1)


def kill_descendants(pid: int, spare: Iterable[int] = ()) -> int:
    """Kill every process whose parent is `pid` (a subreaper), but those in `spare` (workers still in
    use), until none is left; returns how many."""
    killed = 0
    keep = set(spare)
    for _ in range(50):
        children = [c for c in _children(pid) if c not in keep]
        if not children:
            return killed
        for child in children:
            try:
                os.kill(child, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
        for child in children:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(child, 0)
    return killed


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except OSError:
        return []
