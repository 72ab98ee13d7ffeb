"""Compile a Triton solution's kernels for sm_90 on a machine without a GPU, for every tunable choice.

Triton's interpreter accepts code that its compiler refuses (a name bound to values of two types
in the two branches of a runtime `if`, say), and it says nothing about registers, spills or shared
memory. This runs the solution's `run` on CPU tensors of the named workloads with a stand-in CUDA
driver that reports an sm_90 device: every launch compiles the kernel with Triton's CUDA backend
(frontend, LLVM, ptxas) and launches nothing. Constexprs named INTERPRET or EMULATE are forced
False, so the GPU's code path is the one compiled. Printed per kernel: registers, spilled bytes
(LOCAL), shared memory. Variants: the defaults, then each choice of each tunable alone.

    python experiments/triton_sm90_check.py gqa_paged_decode_h32_kv4_d128_ps1 triton_splitkv \
        --workloads feedback --only 9c21179a,06b8480d

Needs Triton with its NVIDIA backend (ptxas ships with it); needs no CUDA driver or GPU. The CPU
figures are the compiler's, not a measurement.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.driver import CudaDriver
from triton.runtime.driver import driver
from triton.runtime.jit import JITFunction

from ksearch_ray.taskspec.task import find_task, load_module_file
from ksearch_ray.taskspec.tunables import read_tunables, rewrite_tunables

CUOBJDUMP = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
FORCED_OFF = ("INTERPRET", "EMULATE")


class Sm90Driver(CudaDriver):
    """Triton's CUDA driver with the device queries answered for one H100/H200 (sm_90)."""

    def __init__(self) -> None:  # no libcuda: the parent's constructor would load it
        self.backend = "cuda"

    def get_current_target(self) -> GPUTarget:
        return GPUTarget("cuda", 90, 128)

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_device_capability(self, device: int = 0) -> tuple[int, int]:
        return (9, 0)

    def get_active_torch_device(self) -> torch.device:
        return torch.device("cpu")


def _usage(cubin: bytes) -> dict[str, int]:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([str(CUOBJDUMP), "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
    return {k: int(v) for k, v in re.findall(r"\b(REG|STACK|SHARED|LOCAL):(\d+)", text)}


def install(records: list[dict[str, Any]], dump: Path | None = None) -> None:
    """Route every launch to a compile (warmup) and record what the compiler made of it (with `dump`,
    write its TTGIR and PTX there too)."""
    driver.set_active(Sm90Driver())
    original = JITFunction.run

    def compile_only(self: JITFunction, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        for name in FORCED_OFF:
            if name in kwargs:
                kwargs[name] = False
        kernel = original(self, *args, grid=grid, warmup=True, **kwargs)
        usage = _usage(kernel.asm["cubin"])
        if dump is not None:
            dump.mkdir(parents=True, exist_ok=True)
            for ext in ("ttgir", "ptx"):
                (dump / f"{self.__name__}.{ext}").write_text(kernel.asm[ext])
        records.append({"kernel": self.__name__, "warps": kwargs.get("num_warps"), "stages": kwargs.get("num_stages"),
                        "registers": usage.get("REG"), "spilled": usage.get("LOCAL"),
                        "shared": kernel.metadata.shared})
        return kernel

    JITFunction.run = compile_only  # type: ignore[method-assign]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("task")
    ap.add_argument("solution")
    ap.add_argument("--workloads", default="feedback", help="A workload set of the task (its GPU-sized one).")
    ap.add_argument("--only", default="", help="Comma-separated prefixes of workload names to use (default: all).")
    ap.add_argument("--defaults-only", action="store_true")
    ap.add_argument("--dump", type=Path, help="Write each kernel's TTGIR and PTX here (the last compiled wins).")
    args = ap.parse_args()
    task = find_task(args.task)
    entry = task.solution(args.solution).entry_file
    source = (task.root / "solutions" / args.solution / entry).read_text()
    prefixes = [p for p in args.only.split(",") if p]
    workloads = [w for w in task.workloads(args.workloads, "cuda") if not prefixes or w.name.startswith(tuple(prefixes))]
    inputs = [(w.name, task.generate_inputs(w, 1, "cpu")) for w in workloads]
    variants: list[dict[str, Any]] = [{}]
    if not args.defaults_only:
        variants += [{t.name: c} for t in read_tunables(source).values() for c in t.choices if c != t.value]
    records: list[dict[str, Any]] = []
    install(records, args.dump)
    tmp = Path(tempfile.mkdtemp())
    failed = 0
    for i, values in enumerate(variants):
        path = tmp / f"variant_{i}.py"  # Triton reads kernel source from the file
        path.write_text(rewrite_tunables(source, values))
        module = load_module_file(path, f"sm90_variant_{i}")
        label = ", ".join(f"{k}={v!r}" for k, v in values.items()) or "defaults"
        for name, data in inputs:
            del records[:]
            try:
                task.call(module.run, data)
            except Exception as exc:  # a compiler error: reported per variant, the others go on
                failed += 1
                last = str(exc).strip().splitlines()[-1] if str(exc).strip() else ""
                print(f"{label} | {name[:8]}: COMPILE FAILED: {type(exc).__name__}: {last[:300]}", flush=True)
                continue
            seen = {(r["kernel"], r["registers"], r["spilled"], r["shared"], r["warps"], r["stages"]) for r in records}
            cells = "; ".join(f"{k} regs {reg} spilled {sp} B shared {sh} B (warps {w}, stages {s})"
                              for k, reg, sp, sh, w, s in sorted(seen))
            print(f"{label} | {name[:8]}: {cells}", flush=True)
        sys.modules.pop(f"sm90_variant_{i}", None)
    print(f"{len(variants)} variants x {len(inputs)} workloads, {failed} failed")
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
