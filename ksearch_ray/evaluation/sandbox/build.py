"""Turning a solution directory into a callable entry point, inside the sandboxed worker.

Python and Triton solutions are imported from their files under a private module name; CUDA
solutions are compiled with torch's extension builder (CUTLASS/CuTe headers from the
nvidia-cutlass package on the include path, an sm_90a target on Hopper).
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


class BuildError(Exception):
    """The candidate did not build; the message is the trimmed compiler or import error."""


def cutlass_include_dir() -> Path | None:
    spec = importlib.util.find_spec("cutlass_library")
    if spec is None or spec.origin is None:
        return None
    include = Path(spec.origin).parent / "source" / "include"
    return include if (include / "cute" / "tensor.hpp").is_file() else None


def load_entry(sol_dir: Path, language: str, entry_file: str, entry_point: str, module_name: str) -> Callable[..., Any]:
    if language == "cuda":
        module = _build_cuda(sol_dir, module_name)
    else:
        module = _import_python(sol_dir / entry_file, module_name)
    entry = getattr(module, entry_point, None)
    if not callable(entry):
        raise BuildError(f"{entry_file} defines no callable `{entry_point}`")
    return entry


def _import_python(path: Path, module_name: str) -> Any:
    sys.path.insert(0, str(path.parent))  # lets a multi-file solution import its own helpers
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)  # exceptions propagate: the worker classifies them
    return module


def _arch_list() -> str:
    import torch

    major, minor = torch.cuda.get_device_capability()
    # Hopper's wgmma / TMA instructions exist only in the arch-specific sm_90a target.
    return f"{major}.{minor}a" if (major, minor) == (9, 0) else f"{major}.{minor}"


def _build_cuda(sol_dir: Path, module_name: str) -> Any:
    import torch
    from torch.utils import cpp_extension

    if not torch.cuda.is_available():
        raise BuildError("CUDA solutions need a CUDA GPU; this evaluator has none")
    sources = sorted(str(p) for p in sol_dir.iterdir() if p.suffix in {".cu", ".cpp", ".cc"})
    if not sources:
        raise BuildError("no .cu/.cpp source files")
    includes = [str(sol_dir)]
    cutlass = cutlass_include_dir()
    if cutlass is not None:
        includes.append(str(cutlass))
    os.environ["TORCH_CUDA_ARCH_LIST"] = _arch_list()
    build_dir = sol_dir.parent / "build"
    build_dir.mkdir(exist_ok=True)
    try:
        return cpp_extension.load(
            name=module_name,
            sources=sources,
            extra_include_paths=includes,
            extra_cflags=["-O3", "-std=c++17"],
            extra_cuda_cflags=["-O3", "-std=c++17", "--expt-relaxed-constexpr", "-lineinfo"],
            build_directory=str(build_dir),
            verbose=True,  # compiler output lands in the worker's log, where trim_compiler_log finds it
        )
    except (RuntimeError, OSError, ImportError) as exc:
        log = _read_tail(build_dir)
        raise BuildError(trim_compiler_log(log or str(exc), missing_cutlass=cutlass is None)) from None


def _read_tail(build_dir: Path) -> str:
    log = build_dir.parent / "stdout.log"
    return log.read_text(errors="replace")[-200_000:] if log.is_file() else ""


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
