"""Turning a solution directory into a callable entry point, inside the sandboxed worker.

Python and Triton solutions are imported from their files under a private module name; CUDA
solutions are compiled with torch's extension builder (CUTLASS/CuTe headers from the
nvidia-cutlass package on the include path, an sm_90a target on Hopper). A solution of C++
sources only (no .cu file) builds without CUDA, so it also runs on the CPU path.

A build can also run on its own, ahead of the evaluation: `serve_build` is the sandboxed side
of a build job (ksearch_ray.evaluation.builder), which compiles for the evaluators' GPUs on a
CPU worker; the evaluation then gets the library as `prebuilt` and only loads it.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from ksearch_ray.evaluation.sandbox.resources import read_tail
from ksearch_ray.text import clip

# Part of every build key (ksearch_ray.evaluation.buildcache): a change here rebuilds everything.
CXX_FLAGS = ["-O3", "-std=c++17"]
CUDA_FLAGS = ["-O3", "-std=c++17", "--expt-relaxed-constexpr", "-lineinfo"]
SOURCE_SUFFIXES = {".cu", ".cpp", ".cc"}


def build_flags() -> dict[str, list[str]]:
    return {"cxx": CXX_FLAGS, "cuda": CUDA_FLAGS}


class BuildError(Exception):
    """The candidate did not build; the message is the trimmed compiler or import error."""


def cutlass_include_dir() -> Path | None:
    spec = importlib.util.find_spec("cutlass_library")
    if spec is None or spec.origin is None:
        return None
    include = Path(spec.origin).parent / "source" / "include"
    return include if (include / "cute" / "tensor.hpp").is_file() else None


def load_entry(sol_dir: Path, language: str, entry_file: str, entry_point: str, module_name: str,
               prebuilt: dict[str, str] | None = None) -> Callable[..., Any]:
    """`prebuilt` ({"path", "module"}): a library built ahead of time for this solution; load it, build nothing."""
    if prebuilt is not None:
        module = _load_library(Path(prebuilt["path"]), prebuilt["module"])
    elif language == "cuda":
        module = _build_cuda(sol_dir, module_name)
    else:
        module = _import_python(sol_dir / entry_file, module_name)
    entry = getattr(module, entry_point, None)
    if not callable(entry):
        raise BuildError(f"{entry_file} defines no callable `{entry_point}`")
    return cast(Callable[..., Any], entry)


def _import_python(path: Path, module_name: str) -> Any:
    sys.path.insert(0, str(path.parent))  # lets a multi-file solution import its own helpers
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)  # exceptions propagate: the worker classifies them
    return module


def arch_for(major: int, minor: int) -> str:
    """The TORCH_CUDA_ARCH_LIST entry for a GPU of this compute capability."""
    # Hopper's wgmma / TMA instructions exist only in the arch-specific sm_90a target.
    return f"{major}.{minor}a" if (major, minor) == (9, 0) else f"{major}.{minor}"


def _build_cuda(sol_dir: Path, module_name: str) -> Any:
    import torch

    archs = [arch_for(*torch.cuda.get_device_capability())] if torch.cuda.is_available() else []
    return compile_extension(sol_dir, sol_dir.parent / "build", module_name, archs)


def compile_extension(sol_dir: Path, build_dir: Path, module_name: str, archs: list[str]) -> Any:
    """Build the sources of `sol_dir` into build_dir/<module_name>.so for `archs`, and import it."""
    import torch
    from torch.utils import cpp_extension

    sources = sorted(str(p) for p in sol_dir.iterdir() if p.suffix in SOURCE_SUFFIXES)
    if not sources:
        raise BuildError("no .cu/.cpp source files")
    if any(s.endswith(".cu") for s in sources):
        if not archs:
            raise BuildError("CUDA sources (.cu) need a CUDA GPU to build for; the evaluators have none")
        if torch.version.cuda is None:
            raise BuildError(f"this node's torch {torch.__version__} has no CUDA support: it cannot build .cu sources")
    includes = [str(sol_dir)]
    cutlass = cutlass_include_dir()
    if cutlass is not None:
        includes.append(str(cutlass))
    if archs:
        os.environ["TORCH_CUDA_ARCH_LIST"] = ";".join(archs)
    build_dir.mkdir(exist_ok=True)
    try:
        return cpp_extension.load(
            name=module_name,
            sources=sources,
            extra_include_paths=includes,
            extra_cflags=CXX_FLAGS,
            extra_cuda_cflags=CUDA_FLAGS,
            build_directory=str(build_dir),
            verbose=True,  # compiler output lands in the worker's log, where trim_compiler_log finds it
        )
    except (RuntimeError, OSError, ImportError) as exc:
        log = _read_tail(build_dir)
        raise BuildError(trim_compiler_log(log or str(exc), missing_cutlass=cutlass is None)) from None


def _load_library(path: Path, module_name: str) -> Any:
    """Import an extension library built ahead of time (torch is already imported: its symbols resolve)."""
    loader = importlib.machinery.ExtensionFileLoader(module_name, str(path))
    spec = importlib.util.spec_from_file_location(module_name, path, loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)  # an ImportError (undefined symbol, wrong ABI) propagates: the worker classifies it
    sys.modules[module_name] = module
    return module


def serve_build(chan: Any, job: dict[str, Any]) -> int:
    """The sandboxed side of a build job: compile workdir/src into workdir/build/<module>.so, report, exit.

    The library is also imported here once, so link errors (undefined symbols) surface on the
    build worker, before any GPU is involved. The trusted builder reads the file after this
    process is gone.
    """
    from ksearch_ray.evaluation.sandbox.protocol import BuildJob, Built, Fail
    from ksearch_ray.models import Status

    spec = BuildJob.model_validate(job)
    workdir = Path(spec.workdir)
    tmp = workdir / "tmp"
    tmp.mkdir(exist_ok=True)
    os.environ["TMPDIR"] = str(tmp)  # nvcc's intermediate files stay in the job's directory
    os.environ["MAX_JOBS"] = str(spec.max_jobs)
    t0 = time.perf_counter()
    try:
        compile_extension(workdir / "src", workdir / "build", spec.module_name, list(spec.archs))
    except BuildError as exc:
        chan.send(Fail(status=Status.COMPILE_ERROR, message="build failed", log=str(exc)))
    except Exception as exc:  # the candidate's static initialisers ran at import: its failure, as a status
        chan.send(Fail(status=Status.COMPILE_ERROR, message=clip(f"import failed: {type(exc).__name__}: {exc}", 500)))
    else:
        chan.send(Built(seconds=time.perf_counter() - t0))
    sys.stdout.flush()
    sys.stderr.flush()
    return 0


def _read_tail(build_dir: Path, limit: int = 200_000) -> str:
    """The end of this worker's stdout.log. The output reaches the file through a pipe that the
    sandbox's parent process drains (sandbox/resources.py): wait until it is quiet (at most 2 s)."""
    log = build_dir.parent / "stdout.log"
    sys.stdout.flush()
    size, deadline = -1, time.monotonic() + 2.0
    while log.is_file() and time.monotonic() < deadline:
        now = log.stat().st_size
        if now == size:
            break
        size = now
        time.sleep(0.1)
    return read_tail(log, limit)


_ERROR_LINE = re.compile(r"(error|Error|ERROR)[: ]")


def trim_compiler_log(log: str, *, missing_cutlass: bool = False, max_lines: int = 25) -> str:
    """The first compiler errors with a line of context each: what an LLM needs to fix the code."""
    lines = log.splitlines()
    picked: list[str] = []
    for i, line in enumerate(lines):
        if _ERROR_LINE.search(line) and "ninja: build stopped" not in line:
            picked.extend(lines[i : i + 2])
        if len(picked) >= max_lines:
            break
    text = "\n".join(dict.fromkeys(picked)) if picked else "\n".join(lines[-max_lines:])
    if missing_cutlass and ("cute/" in log or "cutlass/" in log):
        text += "\n(CUTLASS/CuTe headers not found: install the nvidia-cutlass package)"
    return text
