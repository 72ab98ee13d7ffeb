"""Built C++/CUDA extensions, content-addressed: the key, the record, and a node's cache directory.

A build is identified by everything that changes the bytes it produces: the solution's
sources and entry point, the compiler flags, the target architectures, and the toolchain of
the node that builds (C++ compiler, nvcc, torch, CUDA, Python, CUTLASS). Two nodes with the
same toolchain produce interchangeable libraries, so a library built anywhere in the cluster
can travel through Ray's object store as bytes and be used, and kept, on any other node.

A node keeps its builds in one directory (`BuildCache`), shared by all of its processes:

    <root>/<key[:2]>/<key>/record.json     the BuildRecord (status, module name, sha256, log)
    <root>/<key[:2]>/<key>/library.so      the extension, for builds that passed (for a Triton build,
                                           the pack of its compiled kernels: evaluation/tritoncache.py)

Only trusted code writes it (the builder after its sandboxed compiler process is gone, and
evaluator actors); the path never reaches a sandbox, and candidates load a private copy of the
library from their own work directory. An entry appears by one atomic rename, so readers see a
whole entry or none, and a library is used only when its bytes hash to the recorded sha256.
Compile errors are cached too (the same sources fail the same way); timeouts and crashes are not.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ksearch_ray.models import Solution, Status
from ksearch_ray.private_dir import cache_dir as private_cache_dir
from ksearch_ray.private_dir import private_dir

# Bump when the layout or the meaning of a key changes: old entries are then never read.
CACHE_FORMAT = 1


class Toolchain(BaseModel):
    """What a node builds with. Part of every build key."""

    model_config = ConfigDict(frozen=True)

    python: str = Field(description="Python's cache tag, e.g. cpython-312 (the extension's ABI).")
    torch: str = Field(description="torch.__version__, e.g. 2.11.0+cu130.")
    cuda: str | None = Field(description="torch.version.cuda; None for a CPU-only torch.")
    cxx: str = Field(description="First line of `c++ --version` (or $CXX).")
    nvcc: str | None = Field(description="Release line of `nvcc --version`; None when nvcc is absent.")
    cutlass: str | None = Field(description="Version of the nvidia-cutlass headers on the include path, if any.")


class BuildTarget(BaseModel):
    """The GPUs a library is built for (TORCH_CUDA_ARCH_LIST entries); none: CPU evaluators."""

    model_config = ConfigDict(frozen=True)

    archs: tuple[str, ...] = ()


class BuildRecord(BaseModel):
    """The outcome of building one solution for one target with one toolchain."""

    key: str = Field(description="Build key: sha256 over sources, flags, target and toolchain.")
    solution_id: str
    status: Status = Field(description="PASSED, COMPILE_ERROR, TIMEOUT, CRASHED or INTEGRITY_VIOLATION.")
    module_name: str = Field(description="Python module name the library was built under (its PyInit_ symbol).")
    message: str = Field(default="", description="One line when the build failed.")
    log: str = Field(default="", description="First compiler errors, trimmed, when the build failed.")
    sha256: str | None = Field(default=None, description="Hash of the library's bytes, for builds that passed.")
    size: int = Field(default=0, description="Library size in bytes.")
    seconds: float = Field(default=0.0, description="Wall time of the compile (sandbox included) when it was built.")
    toolchain: Toolchain
    target: BuildTarget
    built_on: str = Field(default="", description="Ray node id (or host name) that compiled it.")
    cached: bool = Field(default=False, description="True when this answer came from a cache, not a compile.")
    kind: Literal["cuda", "triton"] = Field(default="cuda", description=(
        "cuda: a C++/CUDA extension (the bytes: the library); triton: a Python candidate's Triton kernels "
        "compiled for the evaluators' GPU (the bytes: a pack of its Triton cache, evaluation/tritoncache.py)."))
    kernels: int = Field(default=0, description="Triton builds: the kernels compiled.")
    not_built: dict[str, str] = Field(default_factory=dict, description=(
        "Triton builds: workload -> why its call could not be compiled ahead (the evaluation compiles it)."))

    @property
    def passed(self) -> bool:
        return self.status is Status.PASSED


def module_name_for(key: str) -> str:
    return f"ks_{key[:24]}"


def build_key(solution: Solution, target: BuildTarget, toolchain: Toolchain, flags: dict[str, list[str]]) -> str:
    canonical = json.dumps(
        {
            "format": CACHE_FORMAT,
            "language": solution.language,
            "entry_file": solution.entry_file,
            "sources": dict(sorted(solution.sources.items())),
            "flags": flags,
            "archs": list(target.archs),
            "toolchain": toolchain.model_dump(),
        },
        sort_keys=True,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def _first_line(command: list[str], *, match: str = "") -> str | None:
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = [line.strip() for line in out.splitlines() if line.strip() and match in line]
    return lines[0] if lines else None


@functools.cache
def probe_toolchain() -> Toolchain:
    """This process's toolchain; probed once (a few compiler invocations, ~0.1 s)."""
    import torch
    from torch.utils import cpp_extension

    cuda_home = cpp_extension.CUDA_HOME
    nvcc = str(Path(cuda_home) / "bin" / "nvcc") if cuda_home else "nvcc"
    try:
        cutlass: str | None = importlib.metadata.version("nvidia-cutlass")
    except importlib.metadata.PackageNotFoundError:
        cutlass = None
    return Toolchain(
        python=sys.implementation.cache_tag or sys.version,
        torch=torch.__version__,
        cuda=torch.version.cuda,
        cxx=_first_line([os.environ.get("CXX", "c++"), "--version"]) or "unknown",
        nvcc=_first_line([nvcc, "--version"], match="release"),
        cutlass=cutlass,
    )


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class BuildCache:
    """One node's directory of builds. Safe for many processes at once: entries appear atomically."""

    def __init__(self, root: Path):
        self.root = private_dir(Path(root))  # libraries from here are loaded: nobody else may write it

    def _entry(self, key: str) -> Path:
        return self.root / key[:2] / key

    def get(self, key: str) -> tuple[BuildRecord, bytes | None] | None:
        """The cached record (and library, for a build that passed), or None on a miss."""
        entry = self._entry(key)
        try:
            record = BuildRecord.model_validate_json((entry / "record.json").read_text())
        except (OSError, ValueError):
            return None
        library = None
        if record.passed:
            try:
                library = (entry / "library.so").read_bytes()
            except OSError:
                return None
            if sha256_bytes(library) != record.sha256:
                # Damaged (or tampered with): treat as a miss and let the next put replace it.
                with contextlib.suppress(OSError):
                    shutil.rmtree(entry)
                return None
        return record.model_copy(update={"cached": True}), library

    def has(self, key: str) -> bool:
        return (self._entry(key) / "record.json").is_file()

    def put(self, record: BuildRecord, library: bytes | None) -> bool:
        """Store a build; False when it is not cacheable or another process stored it first."""
        if record.status not in (Status.PASSED, Status.COMPILE_ERROR):
            return False
        if record.passed and (library is None or sha256_bytes(library) != record.sha256):
            raise ValueError(f"build {record.key[:12]}: library bytes do not match the record's sha256")
        entry = self._entry(record.key)
        if entry.exists():
            return False
        entry.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{record.key[:12]}-", dir=entry.parent))
        try:
            if library is not None:
                (staging / "library.so").write_bytes(library)
            (staging / "record.json").write_text(record.model_copy(update={"cached": False}).model_dump_json())
            staging.chmod(0o755)
            try:
                staging.rename(entry)  # atomic; fails if another process got there first
            except OSError:
                return False
            return True
        finally:
            shutil.rmtree(staging, ignore_errors=True)


def default_scratch_dir() -> Path:
    """Node-local working space (build cache, builders' sandboxes) when the config names none: the
    user's private cache folder (private_dir.py), never a shared temporary directory."""
    return private_cache_dir("scratch")


def scratch_dir(configured: str | Path | None) -> Path:
    """The scratch folder to use: the configured one (made 0700 where missing, and checked: this user's
    alone), else the default. PrivateDirError, one line, when it is not private."""
    return private_dir(Path(configured)) if configured else default_scratch_dir()

