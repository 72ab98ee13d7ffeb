"""The harness's stopwatch (ksclock.c): built once per zygote, records read by the evaluator.

The zygote compiles ksclock.c with the host's C compiler (the GPU path needs one anyway: Triton
builds its launchers with it) and loads it before any candidate exists. Workers time each call
through it; each call's record goes straight from C to a pipe the evaluator reads. Where no C
compiler exists the same records are written from Python (`PythonStopwatch`), and the sandbox
says that the timings then pass through objects a candidate's Python could reach.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

RECORD = "<IIddddII"  # magic, seq, time_ms, wall_ms, tail_ms, host_ms, flags, status (ksclock.c's struct record)
RECORD_SIZE = 48
MAGIC = 0x4B53544D
OUT_OF_ORDER = 1
_SOURCE = Path(__file__).with_name("ksclock.c")


@dataclass
class ClockRecord:
    seq: int
    time_ms: float
    wall_ms: float
    tail_ms: float
    host_ms: float  # from the start event's record to the call's return: its host (launch) time
    flags: int
    status: int


def parse_records(buf: bytearray) -> list[ClockRecord]:
    """Whole records off the front of `buf` (consumed); a partial one stays for the next read."""
    import struct

    out = []
    while len(buf) >= RECORD_SIZE:
        magic, seq, t, wall, tail, host, flags, status = struct.unpack_from(RECORD, buf)
        del buf[:RECORD_SIZE]
        if magic != MAGIC:
            raise ValueError("a stopwatch record with a bad magic number")
        out.append(ClockRecord(seq, t, wall, tail, host, flags, status))
    return out


def build_native(cache_dir: Path) -> tuple[Path | None, str | None]:
    """(shared library, None) or (None, why not). Cached by source hash."""
    source = _SOURCE.read_bytes()
    lib = cache_dir / f"ksclock-{hashlib.sha256(source).hexdigest()[:16]}.so"
    if lib.is_file():
        return lib, None
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None, "no C compiler (cc) on this host"
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = lib.with_suffix(f".{os.getpid()}.tmp")
    proc = subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(tmp), str(_SOURCE), "-ldl", "-lm"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        return None, f"building the native stopwatch failed: {proc.stderr.strip()[-300:]}"
    tmp.replace(lib)
    return lib, None


class Stopwatch(Protocol):
    @property
    def begin(self) -> Callable[[], object]: ...
    @property
    def end(self) -> Callable[[], int]: ...
    def start(self, fd: int, cuda: bool, stream: int) -> None: ...
    def reset(self) -> None: ...
    def should_stop(self, min_calls: int, target_rel_err: float, max_total_ms: float) -> bool: ...


class NativeStopwatch:
    def __init__(self, lib: Path):
        self.lib = ctypes.CDLL(str(lib))
        self.lib.ks_init.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_size_t]
        self.lib.ks_should_stop.argtypes = [ctypes.c_int, ctypes.c_double, ctypes.c_double]
        # The C functions themselves, no Python method around them: a timed call's window holds no frame
        # of the harness's (sandbox/timer.py). ks_begin and ks_end return an int (0, or a CUresult).
        self.begin: Callable[[], object] = self.lib.ks_begin
        self.end: Callable[[], int] = self.lib.ks_end

    def start(self, fd: int, cuda: bool, stream: int) -> None:
        rc = self.lib.ks_init(fd, int(cuda), stream)
        if rc != 0:
            raise RuntimeError(f"native stopwatch: CUDA driver set-up failed (code {rc})")

    def reset(self) -> None:
        self.lib.ks_reset()

    def should_stop(self, min_calls: int, target_rel_err: float, max_total_ms: float) -> bool:
        return bool(self.lib.ks_should_stop(min_calls, target_rel_err, max_total_ms))


class PythonStopwatch:
    """The same records, from Python: only for hosts without a C compiler (said loudly)."""

    def __init__(self) -> None:
        import torch

        self._perf = time.perf_counter
        self._event: type[torch.cuda.Event] = torch.cuda.Event
        self._elapsed = torch.cuda.Event.elapsed_time
        self._sync = torch.cuda.synchronize
        self.fd, self.cuda, self.seq, self.in_call, self.flags = -1, False, 0, False, 0
        self.times: list[float] = []

    def start(self, fd: int, cuda: bool, stream: int) -> None:
        self.fd, self.cuda = fd, cuda

    def reset(self) -> None:
        self.times = []

    def begin(self) -> None:
        self.flags |= OUT_OF_ORDER if self.in_call else 0
        self.in_call = True
        if self.cuda:
            self._start, self._end = self._event(enable_timing=True), self._event(enable_timing=True)
            self._start.record()
        self._t0 = self._perf()

    def end(self) -> int:
        import struct

        host = (self._perf() - self._t0) * 1e3
        self.flags |= 0 if self.in_call else OUT_OF_ORDER
        self.in_call = False
        tail = 0.0
        if self.cuda:
            self._end.record()
            self._end.synchronize()
            wall = (self._perf() - self._t0) * 1e3
            t1 = self._perf()
            self._sync()
            tail = (self._perf() - t1) * 1e3
            ms = self._elapsed(self._start, self._end)
        else:
            ms = wall = (self._perf() - self._t0) * 1e3
        self.times.append(ms)
        os.write(self.fd, struct.pack(RECORD, MAGIC, self.seq, ms, wall, tail, host, self.flags, 0))
        self.seq += 1
        return 0

    def should_stop(self, min_calls: int, target_rel_err: float, max_total_ms: float) -> bool:
        n = len(self.times)
        if n < max(min_calls, 2):
            return False
        mean = sum(self.times) / n
        std = (sum((t - mean) ** 2 for t in self.times) / (n - 1)) ** 0.5
        return mean <= 0 or std / n**0.5 / mean < target_rel_err or n * mean > max_total_ms


_stopwatch: Stopwatch | None = None
problem: str | None = None  # why the native stopwatch is not in use, if it is not


def load(cache_dir: Path) -> None:
    """In the zygote, before any candidate: build and load the stopwatch."""
    global _stopwatch, problem
    lib, problem = build_native(cache_dir)
    if lib is not None:
        with contextlib.suppress(OSError):
            _stopwatch = NativeStopwatch(lib)
            return
        problem = f"could not load {lib}"
    _stopwatch = PythonStopwatch()


def stopwatch() -> Stopwatch:
    if _stopwatch is None:
        load(Path(os.getcwd()) / "native")
    assert _stopwatch is not None
    return _stopwatch
