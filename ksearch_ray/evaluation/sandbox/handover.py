"""Handing a candidate's outputs to the evaluator: no files, no hashes, no host copy on a GPU.

The worker copies the outputs it checked into one buffer and passes the buffer's file descriptor
with the frame that describes it (channel.Channel, SCM_RIGHTS). Two kinds of buffer:

* `cuda_vmm` (GPU): device memory from the CUDA driver's virtual memory API (cuMemCreate),
  exported as a POSIX file descriptor, which unlike legacy CUDA IPC handles crosses the sandbox's
  PID and user namespaces. The evaluator maps it and copies the bytes into memory of its own
  (device to device) before it answers `Taken`; the worker waits for that answer before any
  candidate code runs again. The worker's buffer is reused (grown when an output is larger).
* `memfd` (the CPU path, and a GPU whose driver refuses the above): an anonymous memory file that
  the worker writes and then seals against every write, shrink and growth (F_SEAL_WRITE,
  F_SEAL_SHRINK, F_SEAL_GROW, F_SEAL_SEAL). The evaluator refuses a descriptor that is not such a
  sealed file, and then reads the pages in place: once sealed, nobody can change them, the
  candidate included, so no copy and no acknowledgement are needed.

The evaluator validates what the frame claims against what the descriptor is (every tensor's
bytes inside the buffer, dtype and shape consistent with its size) before it reads anything.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import math
import mmap
import os
import sys
from dataclasses import dataclass
from typing import Any

import torch

from ksearch_ray.evaluation.sandbox.protocol import Handover, TensorMeta, Transport

_ALIGN = 256
_SEALS = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64,
    "int32": torch.int32, "int64": torch.int64, "int16": torch.int16, "int8": torch.int8, "uint8": torch.uint8,
    "bool": torch.bool, "float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2,
    "complex64": torch.complex64,
}
_NAMES = {v: k for k, v in DTYPES.items()}


class HandoverError(Exception):
    """A hand-over that does not hold what its frame claims (or a buffer that cannot be made)."""


def _layout(outputs: dict[str, torch.Tensor]) -> tuple[list[TensorMeta], int]:
    metas, offset = [], 0
    for name, t in outputs.items():
        if t.dtype not in _NAMES:
            raise HandoverError(f"output `{name}` has dtype {t.dtype}, which the harness cannot hand over")
        nbytes = t.numel() * t.element_size()
        metas.append(TensorMeta(name=name, dtype=_NAMES[t.dtype], shape=list(t.shape), offset=offset, nbytes=nbytes))
        offset += -(-nbytes // _ALIGN) * _ALIGN
    return metas, offset


def _bytes_of(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def check_layout(h: Handover, size: int) -> None:
    """Every tensor's bytes inside the buffer, and dtype x shape = bytes."""
    for m in h.tensors:
        if m.dtype not in DTYPES:
            raise HandoverError(f"output `{m.name}`: unknown dtype {m.dtype!r}")
        if any(d < 0 for d in m.shape):
            raise HandoverError(f"output `{m.name}`: negative size in shape {m.shape}")
        itemsize = torch.empty((), dtype=DTYPES[m.dtype]).element_size()
        if math.prod(m.shape) * itemsize != m.nbytes:
            raise HandoverError(f"output `{m.name}`: {m.nbytes} bytes do not hold {m.dtype}{m.shape}")
        if m.offset + m.nbytes > size:
            raise HandoverError(f"output `{m.name}` lies outside the handed-over buffer")


# --- the CUDA driver's virtual memory API, through ctypes ---------------------------------------

_POSIX_FD = 1  # CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
_PINNED = 1  # CU_MEM_ALLOCATION_TYPE_PINNED
_ON_DEVICE = 1  # CU_MEM_LOCATION_TYPE_DEVICE
_READ_WRITE = 3  # CU_MEM_ACCESS_FLAGS_PROT_READWRITE


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class _AllocProp(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", _Location),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", _AllocFlags)]


class _AccessDesc(ctypes.Structure):
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


class _Driver:
    """The few driver calls a hand-over needs; the CUDA context is torch's (current on this thread)."""

    def __init__(self, device_index: int):
        self.lib = ctypes.CDLL("libcuda.so.1")
        u64, size_t = ctypes.c_ulonglong, ctypes.c_size_t
        sig = {
            "cuMemGetAllocationGranularity": [ctypes.POINTER(size_t), ctypes.POINTER(_AllocProp), ctypes.c_int],
            "cuMemCreate": [ctypes.POINTER(u64), size_t, ctypes.POINTER(_AllocProp), u64],
            "cuMemExportToShareableHandle": [ctypes.c_void_p, u64, ctypes.c_int, u64],
            "cuMemImportFromShareableHandle": [ctypes.POINTER(u64), ctypes.c_void_p, ctypes.c_int],
            "cuMemAddressReserve": [ctypes.POINTER(u64), size_t, size_t, u64, u64],
            "cuMemMap": [u64, size_t, size_t, u64, u64],
            "cuMemSetAccess": [u64, size_t, ctypes.POINTER(_AccessDesc), size_t],
            "cuMemUnmap": [u64, size_t],
            "cuMemAddressFree": [u64, size_t],
            "cuMemRelease": [u64],
            "cuMemcpyDtoD_v2": [u64, u64, size_t],
            "cuStreamSynchronize": [ctypes.c_void_p],
        }
        for name, args in sig.items():
            fn = getattr(self.lib, name)
            fn.argtypes, fn.restype = args, ctypes.c_int
        self.device = device_index
        self.prop = _AllocProp(type=_PINNED, requestedHandleTypes=_POSIX_FD, location=_Location(_ON_DEVICE, device_index))
        gran = size_t(0)
        self.check(self.lib.cuMemGetAllocationGranularity(ctypes.byref(gran), ctypes.byref(self.prop), 0), "granularity")
        self.granularity = int(gran.value)

    @staticmethod
    def check(rc: int, what: str) -> None:
        if rc != 0:
            raise HandoverError(f"CUDA driver error {rc} in {what}")

    def map(self, handle: int, size: int) -> int:
        ptr = ctypes.c_ulonglong(0)
        self.check(self.lib.cuMemAddressReserve(ctypes.byref(ptr), size, 0, 0, 0), "address reserve")
        try:
            self.check(self.lib.cuMemMap(ptr.value, size, 0, handle, 0), "map")
            desc = _AccessDesc(_Location(_ON_DEVICE, self.device), _READ_WRITE)
            self.check(self.lib.cuMemSetAccess(ptr.value, size, ctypes.byref(desc), 1), "set access")
        except HandoverError:
            self.lib.cuMemUnmap(ptr.value, size)
            self.lib.cuMemAddressFree(ptr.value, size)
            raise
        return int(ptr.value)

    def unmap(self, ptr: int, size: int, handle: int) -> None:
        self.lib.cuMemUnmap(ptr, size)
        self.lib.cuMemAddressFree(ptr, size)
        self.lib.cuMemRelease(handle)

    def copy(self, dst: int, src: int, nbytes: int) -> None:
        if nbytes:
            self.check(self.lib.cuMemcpyDtoD_v2(dst, src, nbytes), "copy")

    def sync(self) -> None:
        self.check(self.lib.cuStreamSynchronize(None), "synchronize")  # the legacy stream: this process's copies


@dataclass
class _DeviceBuffer:
    number: int
    handle: int
    ptr: int
    size: int


# --- the worker's end ---------------------------------------------------------------------------


class Exporter:
    """In the worker: puts checked outputs into a buffer and names them (`export`)."""

    def __init__(self, device: str, *, device_handover: bool = True, expect_bytes: int | None = None):
        self.device = device
        self.expect_bytes = expect_bytes or 0
        self.driver: _Driver | None = None
        self.problem: str | None = None  # why device memory is not used, when it is not
        self.buffer: _DeviceBuffer | None = None
        self.count = 0
        if device == "cuda" and device_handover:
            try:
                self.driver = _Driver(torch.cuda.current_device())
            except (OSError, AttributeError, HandoverError) as exc:
                self.problem = str(exc)

    def export(self, outputs: dict[str, torch.Tensor]) -> tuple[Handover, list[int]]:
        """(the frame's description, descriptors to send with it; the caller closes them after sending)."""
        metas, total = _layout(outputs)
        if self.driver is not None and all(t.is_cuda for t in outputs.values()):
            try:
                return self._export_device(outputs, metas, total)
            except HandoverError as exc:  # e.g. a driver that refuses shareable allocations
                self.problem, self.driver = str(exc), None
                print(f"sandbox: device hand-over unavailable ({exc}); outputs go through host memory",
                      file=sys.stderr, flush=True)
        return self._export_memfd(outputs, metas, total)

    def _export_device(self, outputs: dict[str, torch.Tensor], metas: list[TensorMeta],
                       total: int) -> tuple[Handover, list[int]]:
        assert self.driver is not None
        drv = self.driver
        fds: list[int] = []
        if self.buffer is None or self.buffer.size < total:
            # Once at the size the evaluator expects; if outputs outgrow it, doubling keeps regrowth rare.
            size = max(drv.granularity, total if self.buffer is None else 2 * self.buffer.size,
                       self.expect_bytes if self.buffer is None else 0, total)
            size = -(-size // drv.granularity) * drv.granularity
            handle = ctypes.c_ulonglong(0)
            drv.check(drv.lib.cuMemCreate(ctypes.byref(handle), size, ctypes.byref(drv.prop), 0), "create")
            fd = ctypes.c_int(-1)
            try:
                drv.check(drv.lib.cuMemExportToShareableHandle(ctypes.byref(fd), handle.value, _POSIX_FD, 0), "export")
                ptr = drv.map(handle.value, size)
            except HandoverError:
                drv.lib.cuMemRelease(handle.value)
                if fd.value >= 0:
                    os.close(fd.value)
                raise
            if self.buffer is not None:
                drv.unmap(self.buffer.ptr, self.buffer.size, self.buffer.handle)
            self.count += 1
            self.buffer = _DeviceBuffer(self.count, handle.value, ptr, size)
            fds = [fd.value]
        keep = []
        for m, t in zip(metas, outputs.values(), strict=True):
            src = _bytes_of(t)
            keep.append(src)
            drv.copy(self.buffer.ptr + m.offset, src.data_ptr(), m.nbytes)
        torch.cuda.synchronize()
        del keep
        return Handover(transport="cuda_vmm", buffer=self.buffer.number, size=self.buffer.size, fds=len(fds),
                        tensors=metas), fds

    def _export_memfd(self, outputs: dict[str, torch.Tensor], metas: list[TensorMeta],
                      total: int) -> tuple[Handover, list[int]]:
        fd = os.memfd_create("ksearch-outputs", os.MFD_ALLOW_SEALING | os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, total)
            if total:
                with mmap.mmap(fd, total, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE) as mm:
                    view = torch.frombuffer(mm, dtype=torch.uint8)
                    for m, t in zip(metas, outputs.values(), strict=True):
                        view[m.offset:m.offset + m.nbytes].copy_(_bytes_of(t))
                    del view  # no export of the mapping may outlive it, or it cannot close
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
        except BaseException:
            os.close(fd)
            raise
        self.count += 1
        return Handover(transport="memfd", buffer=self.count, size=total, fds=1, tensors=metas), [fd]

    def close(self) -> None:
        if self.buffer is not None and self.driver is not None:
            self.driver.unmap(self.buffer.ptr, self.buffer.size, self.buffer.handle)
        self.buffer = None


# --- the evaluator's end ------------------------------------------------------------------------


class Importer:
    """In the evaluator: turns a hand-over into tensors of its own on `device` (`take`)."""

    def __init__(self, device: str):
        self.device = device
        self._driver: _Driver | None = None
        self._mapped: _DeviceBuffer | None = None
        self.transports: set[Transport] = set()

    def take(self, h: Handover, fds: list[int]) -> dict[str, torch.Tensor]:
        """The outputs as tensors only this process can change. Closes `fds`."""
        try:
            self.transports.add(h.transport)
            if h.transport == "memfd":
                if len(fds) != 1:
                    raise HandoverError("a host hand-over comes with exactly one descriptor")
                return self._take_memfd(h, fds[0])
            return self._take_device(h, fds)
        finally:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _take_memfd(self, h: Handover, fd: int) -> dict[str, torch.Tensor]:
        try:
            seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        except OSError:
            raise HandoverError("the descriptor handed over is not a memory file") from None
        if seals & _SEALS != _SEALS:
            raise HandoverError("the memory file handed over is not sealed against writes")
        size = os.fstat(fd).st_size
        if size != h.size:
            raise HandoverError(f"the memory file holds {size} bytes, the frame says {h.size}")
        check_layout(h, size)
        if size == 0:
            return {m.name: torch.empty(m.shape, dtype=DTYPES[m.dtype], device=self.device) for m in h.tensors}
        # A private mapping of a sealed file: its pages are final, and writes here would stay here.
        mm = mmap.mmap(fd, size, mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE)
        data = torch.frombuffer(mm, dtype=torch.uint8)  # keeps `mm` alive as long as any view
        out = {}
        for m in h.tensors:
            t = data[m.offset:m.offset + m.nbytes].view(DTYPES[m.dtype]).reshape(m.shape)
            out[m.name] = t.to(self.device) if self.device != "cpu" else t
        return out

    def _take_device(self, h: Handover, fds: list[int]) -> dict[str, torch.Tensor]:
        if self.device != "cuda":
            raise HandoverError("a device hand-over to an evaluator without a GPU")
        if self._driver is None:
            torch.zeros(1, device="cuda")  # torch's context, current on this thread, is the one the driver calls use
            self._driver = _Driver(torch.cuda.current_device())
        drv = self._driver
        if fds:
            if len(fds) != 1:
                raise HandoverError("a device hand-over comes with at most one descriptor")
            if h.size % drv.granularity or h.size > torch.cuda.get_device_properties(drv.device).total_memory:
                raise HandoverError(f"a device buffer of {h.size} bytes cannot be what the worker exported")
            handle = ctypes.c_ulonglong(0)
            drv.check(drv.lib.cuMemImportFromShareableHandle(ctypes.byref(handle), ctypes.c_void_p(fds[0]), _POSIX_FD),
                      "import")
            try:
                ptr = drv.map(handle.value, h.size)  # fails unless the allocation holds h.size bytes
            except HandoverError:
                drv.lib.cuMemRelease(handle.value)
                raise
            self.release()
            self._mapped = _DeviceBuffer(h.buffer, handle.value, ptr, h.size)
        mapped = self._mapped
        if mapped is None or mapped.number != h.buffer or mapped.size != h.size:
            raise HandoverError("a device hand-over names a buffer that was never handed over")
        check_layout(h, mapped.size)
        out = {}
        for m in h.tensors:
            dst = torch.empty(m.nbytes, dtype=torch.uint8, device="cuda")
            drv.copy(dst.data_ptr(), mapped.ptr + m.offset, m.nbytes)
            out[m.name] = dst.view(DTYPES[m.dtype]).reshape(m.shape)
        drv.sync()  # the copies are done: the worker's buffer may change from here on
        return out

    def release(self) -> None:
        if self._mapped is not None and self._driver is not None:
            self._driver.unmap(self._mapped.ptr, self._mapped.size, self._mapped.handle)
        self._mapped = None


def describe(transports: set[Any]) -> str:
    return "+".join(sorted(transports))
