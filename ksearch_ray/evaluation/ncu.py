"""Nsight Compute (`ncu`): where it is, how it is asked, and a strict reader of what it writes.

Everything ncu writes is untrusted. It runs inside the candidate's sandbox as the wrapper of the
candidate's process (evaluation/sandbox/profiler.py), so the candidate can print, replace or
forge any of it. `parse_ncu_log` therefore keeps only what it can check: one table with the header
and the units row ncu writes, data rows of the header's width with unique kernel IDs, numbers
within the range their metric can take (percentages 0-100, durations up to ten minutes, at most
255 registers ...), stall reasons from a fixed list of names, and kernel names folded to a short
identifier. Whatever fails a check is left out and counted, never passed on as text: nothing the
candidate controls reaches a prompt except a number in range, a name from the fixed list, or an
identifier of at most `NAME_CHARS` characters.

The metric names below were checked against `ncu --query-metrics` and a real log on an H200
(tests/data/ncu/ holds that log).
"""

from __future__ import annotations

import csv
import glob
import math
import os
import re
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

# The stall reasons of ncu's WarpStateStats section (smsp__average_warps_issue_stalled_<reason>_per_issue_active), as
# `ncu --query-metrics --chip gh100` lists them (ncu 2025.3.1; `gmma`, the wait for Hopper's warpgroup MMA, is
# Hopper's own). `selected` (the warp issued) is no stall and is not kept.
StallReason = Literal[
    "barrier", "branch_resolving", "dispatch_stall", "drain", "gmma", "imc_miss", "lg_throttle", "long_scoreboard",
    "math_pipe_throttle", "membar", "mio_throttle", "misc", "no_instruction", "not_selected", "short_scoreboard",
    "sleeping", "tex_throttle", "wait",
]
STALL_REASONS: tuple[str, ...] = get_args(StallReason)
_STALL_COLUMN = re.compile(r"^smsp__average_warps_issue_stalled_([a-z_]+)_per_issue_active\.ratio$")

SECTIONS = ("SpeedOfLight", "Occupancy", "LaunchStats", "WarpStateStats")
EXTRA_METRICS = ("dram__bytes.sum.per_second",)
"""Achieved DRAM bandwidth, in bytes a second: the one figure the sections above do not carry."""

NAME_CHARS = 64
"""A kernel name is cut to this many characters of [A-Za-z0-9_:<>.~]."""
LIBRARY_NAMESPACES = frozenset({
    "at", "c10", "cub", "cudnn", "cublas", "cublasLt", "cutlass", "cute", "flash", "flashinfer", "std", "thrust",
    "torch", "triton", "transformer_engine", "nvte", "pytorch_flash",
})
"""First segments of the namespaced kernels of libraries a candidate may call (PyTorch, CUTLASS, FlashInfer ...)."""
_LIBRARY_PREFIX = re.compile(
    r"^(sm\d{2,3}_|nvjet_|ampere_|volta_|turing_|hopper_|xmma_|cutlass|cublas|cudnn|gemm|gemv|splitKreduce_|"
    r"triton_(poi|red|per|tem)_|"
    # PyTorch's own CUDA kernels, which ncu names without their namespaces (seen on an H200, ncu 2025.3.1):
    r"(vectorized_|unrolled_)?elementwise_kernel|index_elementwise_kernel|reduce_kernel|CatArrayBatchedCopy|"
    r"vectorized_layer_norm_kernel|layer_norm_|RowwiseMomentsCUDAKernel|LayerNorm|GammaBeta|softmax_warp_|cunn_|"
    r"distribution_elementwise|indexSelect|fill_kernel|max_pool|avg_pool|upsample_|im2col|col2im)"
)
"""Kernels of cuBLAS, cuDNN, CUTLASS, PyTorch and torch.compile's generated Triton code, by their names' start."""
STALLS_KEPT = 3
MAX_LOG_BYTES = 4 << 20
"""More than this of a profiler log is not read: a real one for a few dozen kernels is a few tens of kB."""

# Columns: (raw metric names, in order of preference) -> field of KernelProfile.
_DURATION = ("gpu__time_duration.sum",)
_PERCENTS = {
    "dram_pct": ("gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed", "dram__throughput.avg.pct_of_peak_sustained_elapsed"),
    "sm_pct": ("sm__throughput.avg.pct_of_peak_sustained_elapsed",),
    "memory_pct": ("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",),
    "occupancy_pct": ("sm__warps_active.avg.pct_of_peak_sustained_active",),
    "theoretical_occupancy_pct": ("sm__maximum_warps_per_active_cycle_pct",),
}
_REGISTERS = ("launch__registers_per_thread",)
_DRAM_BYTES_S = ("dram__bytes.sum.per_second",)

_TIME_UNITS = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0, "second": 1e3, "s": 1e3}
_RATE_UNITS = {"byte/second": 1e-9, "Kbyte/second": 1e-6, "Mbyte/second": 1e-3, "Gbyte/second": 1.0,
               "Tbyte/second": 1e3, "byte/s": 1e-9, "B/s": 1e-9, "KB/s": 1e-6, "MB/s": 1e-3, "GB/s": 1.0, "TB/s": 1e3}
_NUMBER = re.compile(r"^[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?$")
_THOUSANDS = re.compile(r"^\d{1,3}(,\d{3})+(\.\d+)?$")
_DIM3 = re.compile(r"^\(\s*(\d{1,10})\s*,\s*(\d{1,10})\s*,\s*(\d{1,10})\s*\)$")
_NAME_KEEP = re.compile(r"[^A-Za-z0-9_:<>.~]")
_KNOWN_ERRORS = (
    ("ERR_NVGPUCTRPERM", "the GPU driver lets only administrators read performance counters "
                         "(NVreg_RestrictProfilingToAdminUsers=1), and the sandbox runs candidates unprivileged"),
    ("No kernels were profiled", "no kernel was profiled"),
    ("Failed to find metric", "this ncu does not know a metric it was asked for"),
    ("Failed to connect", "ncu could not reach its target process"),
)


class ProfileError(ValueError):
    """A profiler log with nothing usable in it; the message is one line of our own words."""


class Stall(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    reason: StallReason
    cycles: float = Field(ge=0, description="Warp cycles stalled for this reason, per issued instruction.")


class KernelProfile(BaseModel):
    """One kernel of the profiled call, as far as the profiler's log survived the checks."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(max_length=NAME_CHARS + 3, description="Folded identifier (templates and arguments left out).")
    duration_ms: float = Field(gt=0)
    dram_pct: float | None = Field(default=None, ge=0, le=100, description="DRAM throughput, % of peak.")
    dram_gb_s: float | None = Field(default=None, ge=0, description="Achieved DRAM bandwidth, GB/s.")
    sm_pct: float | None = Field(default=None, ge=0, le=100, description="Compute (SM) throughput, % of peak.")
    memory_pct: float | None = Field(default=None, ge=0, le=100, description="Busiest memory unit, % of peak.")
    occupancy_pct: float | None = Field(default=None, ge=0, le=100, description="Achieved occupancy.")
    theoretical_occupancy_pct: float | None = Field(default=None, ge=0, le=100)
    registers: int | None = Field(default=None, ge=1, le=255, description="Registers per thread.")
    block: tuple[int, int, int] | None = None
    grid: tuple[int, int, int] | None = None
    stalls: list[Stall] = Field(default_factory=list, max_length=STALLS_KEPT, description="Top stall reasons.")


class NcuTable(BaseModel):
    """What a profiler log held, after the checks."""

    model_config = ConfigDict(extra="forbid")

    kernels: list[KernelProfile] = Field(description="The slowest kernels, slowest first.")
    kernel_count: int = Field(ge=0, description="Kernels profiled in the call (all of them, not only those kept).")
    kernels_ms: float = Field(ge=0, description="Their durations added up.")
    rejected: int = Field(default=0, ge=0, description="Rows and values left out because they failed a check.")


# ------------------------------------------------------------------------------------------ the tool


def find_ncu(explicit: str | None = None) -> Path | None:
    """The ncu executable: `explicit` if given (and executable), else PATH, CUDA_HOME/bin,
    /usr/local/cuda/bin, the newest /opt/nvidia/nsight-compute/<version>/ncu."""
    if explicit:
        path = Path(explicit)
        return path if path.is_file() and os.access(path, os.X_OK) else None
    candidates = [shutil.which("ncu")]
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidates.append(os.path.join(os.environ[var], "bin", "ncu"))
    candidates.append("/usr/local/cuda/bin/ncu")
    candidates += sorted(glob.glob("/opt/nvidia/nsight-compute/*/ncu"), reverse=True)
    for found in candidates:
        if found and os.path.isfile(found) and os.access(found, os.X_OK):
            return Path(found).resolve()
    return None


def ncu_version(path: Path) -> str | None:
    """`ncu --version`'s version (e.g. '2025.3.1.0'), or None if it does not answer in 30 s."""
    try:
        out = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"Version\s+([0-9][0-9.]*)", out)
    return match.group(1) if match else None


def ncu_arguments(launch_count: int) -> list[str]:
    """ncu's options for one profiled call: CSV of the raw metrics in base units, kernels by their full
    demangled names (namespaces included: the library ones are recognised by them), from the call's
    cudaProfilerStart to its stop, this process only, clocks left alone, caches flushed per pass."""
    args = ["--csv", "--page", "raw", "--print-units", "base", "--print-kernel-base", "demangled", "--profile-from-start", "off",
            "--target-processes", "application-only", "--launch-count", str(launch_count),
            "--clock-control", "none", "--cache-control", "all"]
    for section in SECTIONS:
        args += ["--section", section]
    return [*args, "--metrics", ",".join(EXTRA_METRICS)]


def known_failure(log: str) -> str | None:
    """Our words for a failure ncu's log names (its own text is never passed on)."""
    return next((said for marker, said in _KNOWN_ERRORS if marker in log), None)


# ------------------------------------------------------------------------------------------ the reader


def kernel_name(raw: str, identifiers: frozenset[str] | None = None, ident: int = 0) -> str:
    """A short identifier for a kernel: a demangled C++ name without its return type, parameters and
    template arguments; only [A-Za-z0-9_:<>.~] kept; at most NAME_CHARS characters. With
    `identifiers` (the words of the candidate's own sources), a name is shown only if its segments are
    all among them (a kernel the candidate wrote) or it is a known library's; otherwise it is
    `unknown_kernel_<ident>`: so a name says nothing the planner could not read in the code already."""
    text = raw.strip().replace("(anonymous namespace)", "anon")
    if text.startswith("void "):
        text = text[5:]
    depth, cut = 0, []
    for ch in text:
        if ch == "(" and depth == 0:
            break
        if ch == "<":
            depth += 1
            if depth == 1:
                cut.append("<...>")
            continue
        if ch == ">":
            depth = max(depth - 1, 0)
            continue
        if depth == 0:
            cut.append(ch)
    name = _NAME_KEEP.sub("", "".join(cut))
    if identifiers is not None and not _allowed(name, identifiers):
        return f"unknown_kernel_{ident}"
    if len(name) > NAME_CHARS:
        name = name[:NAME_CHARS] + "..."
    return name or f"unknown_kernel_{ident}"


def _allowed(name: str, identifiers: frozenset[str]) -> bool:
    segments = [part for part in name.replace("<...>", "").split("::") if part]
    if not segments:
        return False
    if all(part in identifiers for part in segments):
        return True
    return segments[0] in LIBRARY_NAMESPACES or bool(_LIBRARY_PREFIX.match(name))


def source_identifiers(sources: dict[str, str]) -> frozenset[str]:
    """Every word of a solution's files: the names a kernel it wrote can have."""
    return frozenset(word for text in sources.values() for word in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text))


def _number(text: str) -> float | None:
    text = text.strip()
    if _THOUSANDS.match(text):
        text = text.replace(",", "")
    if not _NUMBER.match(text):
        return None
    value = float(text)
    return value if math.isfinite(value) else None


class _Row:
    """One data row, read against the header and units: each read either yields a checked value or counts a rejection."""

    def __init__(self, header: list[str], units: list[str], cells: list[str]):
        self.cells = dict(zip(header, cells, strict=True))
        self.units = dict(zip(header, units, strict=True))
        self.rejected = 0

    def _raw(self, names: tuple[str, ...]) -> tuple[str, str] | None:
        for name in names:
            value = self.cells.get(name, "").strip()
            if value and value.lower() != "n/a":
                return value, self.units.get(name, "").strip()
        return None

    def number(self, names: tuple[str, ...], low: float, high: float, scale: dict[str, float] | None = None,
               clamp: float = 0.0) -> float | None:
        found = self._raw(names)
        if found is None:
            return None
        value = _number(found[0])
        factor = 1.0 if scale is None else scale.get(found[1])
        if value is None or factor is None:
            self.rejected += 1
            return None
        value *= factor
        if high < value <= high + clamp:  # a percentage a hair above 100 from rounding
            value = high
        if not low <= value <= high:
            self.rejected += 1
            return None
        return value

    def dim3(self, column: str) -> tuple[int, int, int] | None:
        text = self.cells.get(column, "").strip()
        if not text:
            return None
        match = _DIM3.match(text)
        dims = tuple(int(g) for g in match.groups()) if match else None
        if dims is None or not all(1 <= d < 2**31 for d in dims):
            self.rejected += 1
            return None
        return dims  # type: ignore[return-value]

    def stalls(self) -> list[Stall]:
        found = []
        for column in self.cells:
            match = _STALL_COLUMN.match(column)
            if not match or match.group(1) == "selected":
                continue
            if match.group(1) not in STALL_REASONS:
                self.rejected += 1
                continue
            cycles = self.number((column,), 0.0, 1e5)
            if cycles is not None and cycles > 0:
                found.append(Stall(reason=match.group(1), cycles=cycles))  # type: ignore[arg-type]
        found.sort(key=lambda s: -s.cycles)
        return found[:STALLS_KEPT]


def parse_ncu_log(text: str, keep: int = 5, identifiers: frozenset[str] | None = None) -> NcuTable:
    """The `keep` slowest kernels of an ncu `--csv --page raw --print-units base` log, checked.

    Lines ncu writes about itself (`==PROF==`, `==WARNING==`, `==ERROR==`) are skipped. The log must
    hold exactly one table: a header naming `ID` and `Kernel Name`, a units row, data rows. A row
    of the wrong width, a repeated or non-numeric ID, a second header, a value out of its range or
    in a unit not known here is left out and counted in `rejected`; kernel names are folded (and, with
    `identifiers`, withheld unless the candidate's code or a known library has them: `kernel_name`).
    ProfileError when no kernel with a duration is left."""
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("==")]
    rows = list(csv.reader(lines))
    if not rows:
        raise ProfileError("the profiler wrote no table")
    header = [cell.strip() for cell in rows[0]]
    if "ID" not in header or "Kernel Name" not in header:
        raise ProfileError("the profiler's table has no ID and Kernel Name columns")
    if len(rows) < 2 or len(rows[1]) != len(header) or rows[1][header.index("ID")].strip():
        raise ProfileError("the profiler's table has no units row")
    units = rows[1]
    kernels: list[KernelProfile] = []
    seen: set[int] = set()
    rejected = 0
    for cells in rows[2:]:
        if len(cells) != len(header) or "Kernel Name" in (c.strip() for c in cells):
            rejected += 1
            continue
        row = _Row(header, units, cells)
        ident = row.cells["ID"].strip()
        if not ident.isdigit() or int(ident) in seen or int(ident) > 1_000_000:
            rejected += 1
            continue
        seen.add(int(ident))
        duration = row.number(_DURATION, 1e-6, 600_000.0, _TIME_UNITS)
        if duration is None or duration <= 0:
            rejected += 1 + row.rejected
            continue
        fields = {key: row.number(names, 0.0, 100.0, {"%": 1.0, "": 1.0}, clamp=5.0) for key, names in _PERCENTS.items()}
        registers = row.number(_REGISTERS, 1, 255, {"register/thread": 1.0, "": 1.0})
        kernel = KernelProfile(
            name=kernel_name(row.cells["Kernel Name"], identifiers, int(ident)), duration_ms=duration, **fields,
            dram_gb_s=row.number(_DRAM_BYTES_S, 0.0, 100_000.0, _RATE_UNITS),
            registers=int(registers) if registers is not None and registers == int(registers) else None,
            block=row.dim3("Block Size"), grid=row.dim3("Grid Size"), stalls=row.stalls(),
        )
        if kernel.block is not None and math.prod(kernel.block) > 1024:
            kernel = kernel.model_copy(update={"block": None})
            row.rejected += 1
        rejected += row.rejected
        kernels.append(kernel)
    if not kernels:
        raise ProfileError("no kernel in the profiler's table passed the checks")
    total = sum(k.duration_ms for k in kernels)
    kernels.sort(key=lambda k: -k.duration_ms)
    return NcuTable(kernels=kernels[:keep], kernel_count=len(kernels), kernels_ms=total, rejected=rejected)


def read_log(path: Path) -> str:
    """A profiler log written in the sandbox: a plain file (no link, no pipe), at most MAX_LOG_BYTES.
    OSError if it is missing or not a plain file."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"{path.name} is not a plain file")
        data = os.read(fd, MAX_LOG_BYTES)
    finally:
        os.close(fd)
    return data.decode("utf-8", errors="replace")
