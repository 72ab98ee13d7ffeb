"""Whether this process's torch can use the node's NVIDIA driver, decided once at start.

An image's torch is built for one CUDA runtime (torch.version.cuda); a node's driver supports CUDA
up to a version of its own (cuDriverGetVersion). A driver older than the runtime's major version
leaves torch.cuda.is_available() false, and without this check a run would either fall back to the
CPU without saying so or fail later with a traceback. `problem` turns the facts into one line naming
both versions; `facts` reads them. Within one major version CUDA promises minor-version
compatibility (a 12.8 runtime runs on a driver for 12.2), so a lower driver minor version alone is
not a problem while torch can use the GPU.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from dataclasses import dataclass

from ksearch_ray.evaluation.sandbox.handle import SandboxError


class GpuDriverError(SandboxError):
    """This node's GPU cannot be used by this process's torch; the message is one line naming both
    versions. A SandboxError: like a sandbox that cannot isolate, an evaluator that cannot start."""


@dataclass(frozen=True)
class DriverFacts:
    torch_version: str
    torch_cuda: str | None
    """torch.version.cuda: the CUDA runtime torch was built for; None for a CPU build."""
    cuda_available: bool
    """torch.cuda.is_available()."""
    driver_version: str | None
    """The NVIDIA driver's version (nvidia-smi), e.g. 535.104.05; None where nvidia-smi is missing."""
    driver_cuda: str | None
    """The newest CUDA the driver supports (cuDriverGetVersion), e.g. 12.2; None: no driver library."""

    @property
    def has_driver(self) -> bool:
        return self.driver_cuda is not None or self.driver_version is not None


def _major_minor(version: str) -> tuple[int, int]:
    parts = [int(p) for p in version.split(".")[:2] if p.isdigit()]
    return (parts + [0, 0])[0], (parts + [0, 0])[1]


def _driver(f: DriverFacts) -> str:
    named = f"NVIDIA driver {f.driver_version}" if f.driver_version else "NVIDIA driver"
    return f"{named} (CUDA {f.driver_cuda})" if f.driver_cuda else named


def problem(f: DriverFacts) -> str | None:
    """One line when this node has an NVIDIA driver that torch cannot use; None when torch can use
    the GPU, or when there is no driver at all (not a GPU node: nothing to compare)."""
    if not f.has_driver:
        return None
    if f.torch_cuda is None:
        return (f"torch {f.torch_version} is a CPU build, but this node has {_driver(f)}: "
                "install a CUDA build of torch, or pass --device cpu")
    runtime = _major_minor(f.torch_cuda)
    supported = _major_minor(f.driver_cuda) if f.driver_cuda else None
    if f.cuda_available and (supported is None or supported[0] >= runtime[0]):
        return None  # usable (a lower minor version is within CUDA's minor-version compatibility)
    if supported is not None and supported < runtime:
        return (f"torch {f.torch_version} is built for CUDA {f.torch_cuda}, but this node's {_driver(f)} "
                f"supports CUDA up to {f.driver_cuda}: use a torch built for CUDA {f.driver_cuda} or older "
                "(or an image with one), or a newer driver")
    return (f"torch {f.torch_version} (CUDA {f.torch_cuda}) cannot use this node's {_driver(f)}: "
            "torch.cuda.is_available() is false (is the GPU visible to this process: CUDA_VISIBLE_DEVICES, /dev/nvidia*?)")


def _driver_cuda() -> str | None:
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    version = ctypes.c_int(0)
    if libcuda.cuDriverGetVersion(ctypes.byref(version)) != 0 or version.value <= 0:
        return None
    return f"{version.value // 1000}.{version.value % 1000 // 10}"


def _driver_version() -> str | None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        done = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = done.stdout.split()
    return lines[0] if done.returncode == 0 and lines else None


def facts() -> DriverFacts:
    """This process's torch and this node's driver, as they are now."""
    import torch

    return DriverFacts(torch_version=torch.__version__, torch_cuda=torch.version.cuda,
                       cuda_available=torch.cuda.is_available(), driver_version=_driver_version(),
                       driver_cuda=_driver_cuda())


def check() -> None:
    """Raise GpuDriverError when this node has a driver that torch cannot use."""
    line = problem(facts())
    if line is not None:
        raise GpuDriverError(line)
