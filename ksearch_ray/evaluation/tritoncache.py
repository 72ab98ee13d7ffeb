"""A Triton candidate's compiled kernels, carried from the CPU worker that built them to the GPU
worker that evaluates it: the build key, and the packing and unpacking of its Triton cache.

Triton keeps one folder per compiled kernel in its cache directory, named by the hash of the
kernel's source, specialization, target and options, holding the cubin and its metadata:

    <cache>/<hash>/<kernel>.cubin, <kernel>.json, ... , __grp__<kernel>.json

and, in Triton 3.6, one folder per kernel signature's host launcher, a C module Triton compiles with
the system's compiler (gcc -O3), under the hash of its source:

    <cache>/<hash>/__triton_launcher.cpython-312-x86_64-linux-gnu.so

Triton finds a kernel through its group file, which names each of the kernel's files by absolute
path: the build's paths lead nowhere on the GPU's host, and there Triton would find no kernel and
compile it again (into the same folder). `unpack` writes each group file with the paths of the
cache it unpacks into (the paths a sandboxed worker sees too: its cache is bound at the same path).

A build job's cache was written by the candidate's process, so it is read as hostile: `pack` takes
only regular files two levels down with plain names, within a size limit, and `unpack` checks the
same again and never replaces a file that is already there. The build key covers everything that
changes what the build compiles (sources, the GPUs' compute capabilities, Triton, PyTorch, Python,
the task and its workloads), so one candidate's build can never serve another's code; Triton's own
keys inside decide which kernels a worker finds.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import io
import json
import os
import re
import stat
import tarfile
from pathlib import Path

from ksearch_ray.evaluation.buildcache import CACHE_FORMAT, BuildTarget, Toolchain
from ksearch_ray.evaluation.sandbox.protocol import GpuFacts
from ksearch_ray.models import Solution
from ksearch_ray.taskspec.spec import Workload

PACK_LIMIT = 256 << 20
"""Bytes of compiled kernels one build may carry (TriMul's seeds: about 2 MB); beyond it the build is
refused and the evaluation's worker compiles its kernels itself."""

_DIR = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
_FILE = re.compile(r"^[A-Za-z0-9_.-]{1,200}$")


class PackError(Exception):
    """The build's cache cannot be carried (over the limit, or malformed): one line."""

    def __init__(self, message: str, *, over_limit: bool = False):
        super().__init__(message)
        self.over_limit = over_limit


def triton_version() -> str:
    try:
        return importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        return "none"


def capability_of(arch: str) -> int:
    """Triton's compute capability number for a TORCH_CUDA_ARCH_LIST entry: '9.0a' -> 90."""
    major, _, minor = arch.partition(".")
    return int(major) * 10 + int(re.sub(r"\D", "", minor) or 0)


def triton_build_key(solution: Solution, target: BuildTarget, toolchain: Toolchain, task: str,
                     workloads: list[Workload], gpu: GpuFacts | None = None) -> str:
    """`gpu`: what the build tells host code of the GPU (its plans may follow an SM count)."""
    canonical = json.dumps(
        {
            "format": CACHE_FORMAT,
            "kind": "triton",
            "entry_file": solution.entry_file,
            "entry_point": solution.entry_point,
            "sources": dict(sorted(solution.sources.items())),
            "capabilities": sorted(capability_of(a) for a in target.archs),
            "triton": triton_version(),
            "torch": toolchain.torch,
            "python": toolchain.python,
            "task": task,
            "workloads": [w.model_dump(mode="json") for w in workloads],
            "gpu": gpu.model_dump(mode="json") if gpu else None,
        },
        sort_keys=True,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def _folders_holding(cache: Path, prefix: str) -> set[str]:
    """The cache's folders (plain names, no links) holding a file whose name starts with `prefix`."""
    found: set[str] = set()
    try:
        entries = list(os.scandir(cache))
    except OSError:
        return found
    for entry in entries:
        if entry.is_dir(follow_symlinks=False) and _DIR.match(entry.name):
            try:
                if any(name.startswith(prefix) for name in os.listdir(entry.path)):
                    found.add(entry.name)
            except OSError:
                continue
    return found


def kernel_dirs(cache: Path) -> set[str]:
    """The compiled kernels in a Triton cache: folders holding Triton's group file (`__grp__*.json`),
    which it writes last, once a kernel's files are all there."""
    return _folders_holding(cache, "__grp__")


def kernel_stamps(cache: Path) -> dict[str, tuple[int, ...]]:
    """Each compiled kernel's folder and the inodes of its group files. A kernel Triton compiled again (it
    writes into the same folder, replacing each file) shows as a changed stamp, a new one as a new folder."""
    stamps: dict[str, tuple[int, ...]] = {}
    for folder in kernel_dirs(cache):
        with contextlib.suppress(OSError):
            stamps[folder] = tuple(sorted(os.lstat(cache / folder / name).st_ino
                                          for name in os.listdir(cache / folder) if name.startswith("__grp__")))
    return stamps


def compiled_since(before: dict[str, tuple[int, ...]], cache: Path) -> int:
    """Kernels compiled in `cache` since `before` (its `kernel_stamps`): new ones and ones compiled again."""
    return sum(1 for folder, stamp in kernel_stamps(cache).items() if before.get(folder) != stamp)


def _group_here(data: bytes, cache: Path, folder: str) -> bytes:
    """A kernel's group file with each of its files named where it is now: `cache`/`folder`/name (only
    plain names: a pack's group file cannot point anywhere else)."""
    try:
        children = json.loads(data)["child_paths"]
        if not isinstance(children, dict):
            raise TypeError("child_paths is not a mapping")
        here = {}
        for name, _old in children.items():
            if not isinstance(name, str) or not _FILE.match(name):
                raise ValueError(f"a file named {name!r}")
            here[name] = os.path.join(os.path.abspath(cache), folder, name)
    except (ValueError, KeyError, TypeError) as exc:
        raise PackError(f"the pack's group file in {folder} is malformed: {exc}") from None
    return json.dumps({"child_paths": here}).encode()


LAUNCHER = "__triton_launcher"


def launcher_dirs(cache: Path) -> set[str]:
    """The kernels' host launchers in a Triton cache: folders holding Triton's `__triton_launcher` C
    module, which it builds per kernel signature with the system's compiler."""
    return _folders_holding(cache, LAUNCHER + ".")


def pack(cache: Path, limit: int = PACK_LIMIT, *, kernels_only: bool = True) -> tuple[bytes, int]:
    """The kernels of a build's Triton cache and their launchers as one gzipped tar, and how many
    kernels it holds. Links, devices, deeper folders and odd names are left out; PackError past `limit`
    bytes. `kernels_only=False`: every folder's files (Triton's compiled helper modules too), and the
    count is of folders."""
    if os.path.lexists(cache) and not stat.S_ISDIR(os.lstat(cache).st_mode):  # the candidate may have made it a link
        raise PackError("the build's Triton cache is not a folder")
    buffer = io.BytesIO()
    total = 0
    kernels = kernel_dirs(cache) if kernels_only else {
        e.name for e in (os.scandir(cache) if os.path.isdir(cache) else ())
        if e.is_dir(follow_symlinks=False) and _DIR.match(e.name)}
    folders = kernels | launcher_dirs(cache) if kernels_only else kernels
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=1) as tar:
        for name in sorted(folders):
            folder = cache / name
            for entry in sorted(os.scandir(folder), key=lambda e: e.name):
                info = os.lstat(entry.path)
                if not stat.S_ISREG(info.st_mode) or not _FILE.match(entry.name):
                    continue
                total += info.st_size
                if total > limit:
                    raise PackError(f"the compiled kernels exceed {limit >> 20} MiB", over_limit=True)
                member = tarfile.TarInfo(f"{name}/{entry.name}")
                member.size, member.mode = info.st_size, 0o644
                fd = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW)
                with os.fdopen(fd, "rb") as f:
                    data = f.read(info.st_size + 1)
                if len(data) != info.st_size:
                    raise PackError(f"{name}/{entry.name} changed while it was read")
                tar.addfile(member, io.BytesIO(data))
    return buffer.getvalue(), len(kernels)


def unpack(data: bytes, cache: Path, limit: int = PACK_LIMIT) -> int:
    """Write a packed build's kernels into `cache` (a worker's Triton cache, which that solution's
    earlier workers could write: every step is taken relative to a folder opened without following
    links, so a link planted there leads nowhere); files already there are kept. Returns how many
    kernels the pack holds; PackError for a malformed pack."""
    cache.mkdir(parents=True, exist_ok=True)
    total = 0
    kernels = set()
    nofollow = os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    root = os.open(cache, os.O_RDONLY | os.O_DIRECTORY | nofollow)
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            for member in tar:
                folder, _, name = member.name.partition("/")
                if not member.isreg() or not _DIR.match(folder) or not _FILE.match(name):
                    raise PackError(f"the pack holds {member.name!r}, not a kernel's file")
                total += member.size
                if total > limit:
                    raise PackError(f"the pack exceeds {limit >> 20} MiB", over_limit=True)
                source = tar.extractfile(member)
                assert source is not None  # a regular file
                content = source.read()
                if name.startswith("__grp__"):  # checked before anything of it is written
                    content = _group_here(content, cache, folder)
                with contextlib.suppress(FileExistsError):
                    os.mkdir(folder, 0o755, dir_fd=root)
                sub = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | nofollow, dir_fd=root)
                try:
                    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | nofollow, 0o644, dir_fd=sub)
                except FileExistsError:
                    pass
                else:
                    with os.fdopen(fd, "wb") as out:
                        out.write(content)
                finally:
                    os.close(sub)
                if name.startswith("__grp__"):
                    kernels.add(folder)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise PackError(f"the pack cannot be written: {type(exc).__name__}: {exc}") from None
    finally:
        os.close(root)
    return len(kernels)
