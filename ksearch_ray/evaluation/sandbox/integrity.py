"""In-process integrity guards for the sandboxed worker.

The harness captures its own references to every function it times or compares with before
any candidate code is imported, so a candidate that patches `torch.cuda.Event.elapsed_time` or
`time.perf_counter` changes nothing the harness uses; the patch is still reported (and undone)
as an integrity violation. Backend flags (TF32 and friends) are snapshotted the same way.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
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


@dataclass
class GlobalState:
    flags: dict[str, Any]
    functions: dict[str, Any]


class Guard:
    """Snapshot of global state; `check_and_restore` reports and undoes any change."""

    def __init__(self) -> None:
        self._accessors = _flag_accessors()
        self._patchable = _patchable()
        self.baseline = self._read()
        self.threads = {t.ident for t in threading.enumerate()}

    def _read(self) -> GlobalState:
        flags = {}
        for name, (get, _) in self._accessors.items():
            try:
                flags[name] = get()
            except RuntimeError as exc:  # torch >= 2.9 refuses to read legacy flags after mixed-API writes
                flags[name] = f"<unreadable: {exc}>"
        functions = {name: getattr(owner, attr) for name, (owner, attr) in self._patchable.items()}
        return GlobalState(flags, functions)

    def check_and_restore(self) -> list[str]:
        now = self._read()
        problems = []
        for name, value in now.flags.items():
            if value != self.baseline.flags[name]:
                problems.append(f"changed {name} from {self.baseline.flags[name]!r} to {value!r}")
                with contextlib.suppress(RuntimeError):
                    self._accessors[name][1](self.baseline.flags[name])
        for name, fn in now.functions.items():
            if fn is not self.baseline.functions[name]:
                problems.append(f"replaced {name}")
                owner, attr = self._patchable[name]
                setattr(owner, attr, self.baseline.functions[name])
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
