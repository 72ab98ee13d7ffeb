"""Compile a Triton solution's kernels for Hopper (sm_90) on a machine without a GPU, before device
time is spent on it. The solution is called once on a small CPU workload with every Triton launch
replaced by a compile: Triton's CUDA backend (its frontend, LLVM and the ptxas it ships) builds each
kernel for sm_90 and nothing is launched. Per kernel it prints registers, local memory (spills) and
shared memory, and it fails on what would fail on the GPU before a kernel runs: a compile error
(Triton's interpreter accepts code the compiler refuses, such as a name bound to two types in the two
branches of a runtime `if`) or more shared memory than an H100/H200 block can have.

    python experiments/compile_sm90.py --task trimul --solution triton_fused
    python experiments/compile_sm90.py --task trimul --solution triton_fused --set PROJ_TMA=False --set OUT_TMA=False
    python experiments/compile_sm90.py --task trimul --solution my_kernel.py --json
    python experiments/compile_sm90.py --task trimul --solution triton_fused --dump /tmp/ir  # IR and PTX per kernel

What it cannot see: the kernels' speed, and code paths the small workload does not take. A constexpr
named EMULATE or INTERPRET (the project's kernels switch the interpreter's arithmetic with it) is set
False, as on a GPU. Host code that needs a GPU (torch.cuda calls) fails here and is reported as such. It relies on
Triton's driver interface (a stand-in driver reports an sm_90 target), which can change between Triton
versions; the test (tests/test_compile_sm90.py) says so when it does."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

SHARED_LIMIT = 232448
"""Shared memory one block may have on an H100/H200 (227 KB): Triton refuses a launch above it."""


def _stand_in_driver() -> None:
    """Make Triton's active driver a CUDA driver for an sm_90 device that is not there (the build
    workers' own, ksearch_ray/evaluation/sandbox/triton_build.py); the inputs here are CPU tensors."""
    from ksearch_ray.evaluation.sandbox.triton_build import stand_in_driver

    stand_in_driver(90, torch_device="cpu")


def _usage(cubin: bytes) -> dict[str, int]:
    """REG, LOCAL (bytes of spills) and the like, from cuobjdump's resource usage of the cubin."""
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([str(tool), "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
    line = next((ln for ln in text.splitlines() if "REG:" in ln), "")
    out = {}
    for part in line.split():
        key, _, value = part.partition(":")
        if value.isdigit():
            out[key] = int(value)
    return out


def compile_solution(task_name: str, solution_arg: str, values: dict[str, Any], workload: str = "",
                     dump: Path | None = None) -> list[dict[str, Any]]:
    """Every kernel launch of one call of the solution, compiled for sm_90: a row per launch. With
    `dump`, each launch's Triton GPU IR and PTX are written there (`<n>-<kernel>.ttgir`, `.ptx`), to
    read what the compiler made of it (whether loads became cp.async or TMA, which MMA it chose)."""
    if os.environ.get("TRITON_INTERPRET"):
        raise SystemExit("TRITON_INTERPRET is set: unset it, the interpreter compiles nothing")
    _stand_in_driver()
    from triton.runtime.jit import JITFunction

    from ksearch_ray.taskspec.task import find_task, solution_from_file
    from ksearch_ray.taskspec.tunables import read_tunables

    task = find_task(task_name)
    solution = (solution_from_file(Path(solution_arg), task) if Path(solution_arg).exists()
                else task.solution(solution_arg))
    if solution.language == "cuda":
        raise SystemExit(f"{solution.name} is a CUDA solution; this compiles the Triton kernels of Python ones")
    declared = {name for text in solution.sources.values() for name in read_tunables(text)}
    unknown = sorted(set(values) - declared)
    if unknown:
        raise SystemExit(f"error: {', '.join(unknown)}: not a tunable of {solution.name} "
                         f"(its tunables: {', '.join(sorted(declared)) or 'none'})")
    launches: list[dict[str, Any]] = []
    run = JITFunction.run

    def compile_only(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        args, kwargs = as_on_a_gpu(self, args, kwargs)
        row: dict[str, Any] = {"kernel": self.__name__, "num_warps": kwargs.get("num_warps"),
                               "num_stages": kwargs.get("num_stages")}
        try:
            kernel = run(self, *args, grid=grid, warmup=True, **kwargs)
        except Exception as exc:  # a compile error: its last line says what went wrong
            row["error"] = str(exc).strip().splitlines()[-1][:300]
            launches.append(row)
            raise _Stop from exc
        row.update(shared=kernel.metadata.shared, **{k.lower(): v for k, v in _usage(kernel.asm["cubin"]).items()
                                                     if k in ("REG", "LOCAL", "STACK")})
        if row["shared"] > SHARED_LIMIT:
            row["error"] = f"needs {row['shared']} bytes of shared memory; a block may have {SHARED_LIMIT}"
        launches.append(row)
        if dump is not None:
            dump.mkdir(parents=True, exist_ok=True)
            for ext in ("ttgir", "ptx"):
                (dump / f"{len(launches)}-{self.__name__}.{ext}").write_text(kernel.asm[ext])
        return kernel

    JITFunction.run = compile_only  # type: ignore[method-assign]
    entry, inputs = entry_and_inputs(task, solution, values, workload)
    with contextlib.suppress(_Stop):  # the failed kernel's row says why
        task.call(entry, inputs)
    return launches


def entry_and_inputs(task: Any, solution: Any, values: dict[str, Any], workload: str = "") -> tuple[Any, Any]:
    """The solution, its tunables set to `values`, loaded from a folder of its own, and the inputs of the task's
    first small CPU workload (of `smoke`, else `feedback`), or of the one named `workload`."""
    from ksearch_ray.evaluation.sandbox.build import load_entry
    from ksearch_ray.taskspec.tunables import with_values

    src = Path(tempfile.mkdtemp(prefix="sm90-"))
    for name, text in with_values(solution, values).items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text(text)
    entry = load_entry(src, solution.language, solution.entry_file, solution.entry_point, "sm90_candidate")
    sets = task.definition.workload_sets
    workload_set = next((s for s in ("smoke", "feedback") if s in sets), next(iter(sets)))
    chosen = [w for w in task.workloads(workload_set, "cpu") if not workload or w.name == workload]
    if not chosen:
        raise SystemExit(f"no workload {workload!r} in the task's set {workload_set} (its CPU variant)")
    return entry, task.generate_inputs(chosen[0], 0, "cpu")


def as_on_a_gpu(fn: Any, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
    """A launch's arguments with the constexprs EMULATE and INTERPRET (the seeds' and the split-KV kernels'
    interpreter switch) set False, as on a GPU."""
    for flag in ("EMULATE", "INTERPRET"):
        if flag in fn.arg_names:
            at = fn.arg_names.index(flag)
            if at < len(args):  # bound by position (a launch that passes every parameter in order)
                args = (*args[:at], False, *args[at + 1:])
            else:
                kwargs = {**kwargs, flag: False}
    return args, kwargs


class _Stop(Exception):
    """A kernel did not compile: the call stops there (what follows would need its output)."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", default="trimul")
    ap.add_argument("--solution", required=True, help="A solution's name, or a solution file or directory.")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="A tunable's value (repeatable).")
    ap.add_argument("--workload", default="",
                    help="A workload of the task's smoke (else feedback) set, its CPU variant (default: the first).")
    ap.add_argument("--json", action="store_true", help="Print the rows as JSON.")
    ap.add_argument("--dump", type=Path, metavar="DIR", help="Write each kernel's Triton GPU IR and PTX there.")
    args = ap.parse_args()
    from ksearch_ray.taskspec.spec import TaskError
    from ksearch_ray.taskspec.tunables import TunableError, value_from_text

    values = {k: value_from_text(v) for k, _, v in (s.partition("=") for s in args.set)}
    try:
        rows = compile_solution(args.task, args.solution, values, args.workload, args.dump)
    except (TaskError, TunableError) as exc:
        raise SystemExit(f"error: {exc}") from None
    if args.json:
        print(json.dumps(rows))
    else:
        for r in rows:
            # ptxas puts spills in the stack frame (STACK) as often as in LOCAL: both are printed
            figures = (f"{r.get('reg')} registers, {r.get('local')} B local, {r.get('stack')} B stack, "
                       f"{r.get('shared')} B shared"
                       if "shared" in r else "")
            print(f"{r['kernel']} (warps {r['num_warps']}, stages {r['num_stages']}): "
                  f"{r.get('error') and 'FAILED: ' + r['error'] or figures}")
    if not rows:
        print("no Triton kernel was launched")
    if not rows or any("error" in r for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
