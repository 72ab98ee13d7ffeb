"""In-process integrity guards for the sandboxed worker.

The harness captures its own references to every function it times or compares with before
any candidate code is imported, so a candidate that patches `torch.cuda.Event.elapsed_time` or
`time.perf_counter` changes nothing the harness uses; the patch is still reported (and undone)
as an integrity violation.

Numeric settings (TF32, the float32 matmul precision, the default dtype) belong to the candidate:
its process is its own and references are computed in the evaluator's process with TF32 off, so
a candidate that switches them harms no one and is judged by the tolerance like any other. The
harness's own tensor work in the worker (input generation) runs under the settings captured here,
before any candidate existed (`harness_numerics`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

# Captured at import, i.e. in the zygote, before any candidate exists.
perf_counter = time.perf_counter
_torch_equal = torch.equal
_tensor_type = torch.Tensor


def _flag_accessors() -> dict[str, tuple[Callable[[], Any], Callable[[Any], None]]]:
    b = torch.backends
    return {
        "torch.backends.cuda.matmul.allow_tf32": (
            lambda: b.cuda.matmul.allow_tf32,
            lambda v: setattr(b.cuda.matmul, "allow_tf32", v),
        ),
        "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction": (
            lambda: b.cuda.matmul.allow_fp16_reduced_precision_reduction,
            lambda v: setattr(b.cuda.matmul, "allow_fp16_reduced_precision_reduction", v),
        ),
        "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction": (
            lambda: b.cuda.matmul.allow_bf16_reduced_precision_reduction,
            lambda v: setattr(b.cuda.matmul, "allow_bf16_reduced_precision_reduction", v),
        ),
        "torch.backends.cudnn.allow_tf32": (lambda: b.cudnn.allow_tf32, lambda v: setattr(b.cudnn, "allow_tf32", v)),
        "torch.backends.cudnn.benchmark": (lambda: b.cudnn.benchmark, lambda v: setattr(b.cudnn, "benchmark", v)),
        "torch.float32_matmul_precision": (torch.get_float32_matmul_precision, torch.set_float32_matmul_precision),
        "torch.default_dtype": (torch.get_default_dtype, torch.set_default_dtype),
    }


def _patchable() -> dict[str, tuple[Any, str]]:
    """Objects whose attributes the harness relies on: name -> (owner, attribute)."""
    out: dict[str, tuple[Any, str]] = {
        "time.perf_counter": (time, "perf_counter"),
        "time.time": (time, "time"),
        "time.monotonic": (time, "monotonic"),
        "torch.equal": (torch, "equal"),
        "torch.allclose": (torch, "allclose"),
        "torch.Tensor.clone": (torch.Tensor, "clone"),
        "torch.Tensor.cpu": (torch.Tensor, "cpu"),
        "torch.save": (torch, "save"),
        "torch.cuda.synchronize": (torch.cuda, "synchronize"),
        "torch.cuda.Event": (torch.cuda, "Event"),
        "torch.cuda.Stream": (torch.cuda, "Stream"),
        "torch.cuda.current_stream": (torch.cuda, "current_stream"),
    }
    event = torch.cuda.Event
    for attr in ("record", "elapsed_time", "synchronize", "query"):
        out[f"torch.cuda.Event.{attr}"] = (event, attr)
    return out


def _read_flags(accessors: dict[str, tuple[Callable[[], Any], Callable[[Any], None]]]) -> dict[str, Any]:
    flags = {}
    for name, (get, _) in accessors.items():
        try:
            flags[name] = get()
        except RuntimeError:  # torch >= 2.9 refuses to read legacy flags after mixed-API writes
            flags[name] = None
    return flags


def _write_flags(accessors: dict[str, tuple[Callable[[], Any], Callable[[Any], None]]], flags: dict[str, Any]) -> None:
    for name, value in flags.items():
        if value is not None:
            with contextlib.suppress(RuntimeError):
                accessors[name][1](value)


_ACCESSORS = _flag_accessors()
_HARNESS_FLAGS = _read_flags(_ACCESSORS)  # in the zygote: torch's defaults, no candidate yet


@contextlib.contextmanager
def harness_numerics() -> Iterator[None]:
    """The harness's numeric settings for the duration; the candidate's own come back after."""
    theirs = _read_flags(_ACCESSORS)
    _write_flags(_ACCESSORS, _HARNESS_FLAGS)
    try:
        yield
    finally:
        _write_flags(_ACCESSORS, theirs)


class Guard:
    """Snapshot of the functions the harness relies on; `check_and_restore` reports and undoes patches."""

    def __init__(self, extra: dict[str, tuple[Any, str]] | None = None) -> None:
        self._patchable = {**_patchable(), **(extra or {})}
        self.baseline = self._read()
        self.threads = {t.ident for t in threading.enumerate()}

    def _read(self) -> dict[str, Any]:
        return {name: getattr(owner, attr) for name, (owner, attr) in self._patchable.items()}

    def check_and_restore(self) -> list[str]:
        problems = []
        for name, fn in self._read().items():
            if fn is not self.baseline[name]:
                problems.append(f"replaced {name}")
                owner, attr = self._patchable[name]
                setattr(owner, attr, self.baseline[name])
        return problems

    def lingering_threads(self) -> list[str]:
        return [t.name for t in threading.enumerate() if t.ident not in self.threads and t.is_alive()]

    def accept_current_threads(self) -> None:
        """Threads started by trusted code (e.g. a compiler pool) become part of the baseline."""
        self.threads = {t.ident for t in threading.enumerate()}


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Exact equality that treats NaN payloads as data (torch.equal says NaN != NaN)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.element_size() in (1, 2, 4, 8) and a.is_floating_point():
        int_dtype = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        return bool(_torch_equal(a.contiguous().view(int_dtype), b.contiguous().view(int_dtype)))
    return bool(_torch_equal(a, b))


def storage_ranges(t: torch.Tensor) -> tuple[int, int]:
    start = t.untyped_storage().data_ptr()
    return start, start + t.untyped_storage().nbytes()


def aliases_any(out: torch.Tensor, inputs: dict[str, Any]) -> str | None:
    """Name of an input whose memory the output shares, if any."""
    if out.untyped_storage().nbytes() == 0:
        return None
    o0, o1 = storage_ranges(out)
    for name, value in inputs.items():
        if isinstance(value, _tensor_type) and value.untyped_storage().nbytes() > 0:
            i0, i1 = storage_ranges(value)
            if o0 < i1 and i0 < o1:
                return name
    return None


def is_plain_tensor(value: Any) -> bool:
    return type(value) is _tensor_type
