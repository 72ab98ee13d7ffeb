"""Check on a machine without a GPU that the TriMul seed's direct launches (issue 44) hand Triton's
compiled launcher exactly what Triton's own launch path would, for every kernel of a call.

The seed's kernels are compiled for sm_90 (as experiments/compile_sm90.py does: Triton's CUDA backend
and a stand-in driver); each compiled kernel then gets Triton's own launcher object (its CudaLauncher
and descriptor wrapper, Triton's code) around a recorder in place of the C launcher, and the one
driver call in that path (encoding a TMA descriptor) returns its inputs. The solution is called
on a CPU workload `--calls` times, then twice on another shape, twice with x 4 bytes off a 16-byte
boundary (another specialization) and once on the first again: a new shape or specialization goes
through Triton's JIT entry point, the later calls through the seed's direct path. For every direct
launch, Triton's own path is run on the same call's arguments, and the two recorded argument lists
must be equal (a tensor counts as its data pointer, which is what the launcher reads of it); and the
compiled kernel launched must be the one Triton's JIT picks for those arguments. It needs Triton 3.6's launcher layout, the one the seed launches directly;
with another Triton it says so and exits 2.

    python experiments/trimul_launch_check.py [--set NAME=VALUE ...]

What it cannot see: the GPU. Whether the launcher's C code accepts the arguments (their count is
checked against Triton's own path, their types are not), and anything about the kernels' results.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _plain(call: tuple) -> tuple:
    import torch

    return tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in call)


def check(values: dict[str, Any], calls: int = 3) -> dict[str, Any]:
    import triton
    import triton.backends.nvidia.driver as nv
    from compile_sm90 import _stand_in_driver
    from triton.runtime.jit import JITFunction

    from ksearch_ray.taskspec.task import find_task, load_module_file
    from ksearch_ray.taskspec.tunables import with_values

    if getattr(nv, "_BASE_ARGS_FORMAT", None) != "iiiKKppOOOOOO" or not hasattr(nv, "wrap_handle_tensordesc"):
        raise SystemExit(2)
    _stand_in_driver()
    encoded: list[tuple] = []

    def fill(*args: Any) -> tuple:
        encoded.append(args)
        return ("tensormap", *[tuple(a) if isinstance(a, list) else a for a in args])

    triton.runtime.driver.active.utils = SimpleNamespace(fill_tma_descriptor=fill)
    recorded: list[tuple] = []

    def launcher_of(kernel: Any) -> Any:
        run = object.__new__(nv.CudaLauncher)  # Triton's own, less the C module its __init__ builds
        signature = dict(kernel.src.signature)
        run.launch = nv.wrap_handle_tensordesc(lambda *a: recorded.append(_plain(a)), signature,
                                               getattr(kernel.metadata, "tensordesc_meta", None))
        run.num_ctas = 1
        run.global_scratch_size, run.global_scratch_align = kernel.metadata.global_scratch_size, 1
        run.profile_scratch_size, run.profile_scratch_align = kernel.metadata.profile_scratch_size, 1
        run.launch_cooperative_grid, run.launch_pdl = False, False
        return run

    jit_run = JITFunction.run
    first_launches: list[str] = []

    def compile_only(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        kernel = jit_run(self, *args, grid=grid, warmup=True, **kwargs)
        kernel._run = launcher_of(kernel)
        kernel.function = 7  # a CUfunction handle, as the launcher passes it on
        first_launches.append(self.__name__)
        return kernel

    JITFunction.run = compile_only  # type: ignore[method-assign]
    task = find_task("trimul")
    solution = task.solution("triton_fused")
    src = Path(tempfile.mkdtemp(prefix="launch-check-"))
    path = src / "submission.py"
    path.write_text(with_values(solution, values)[solution.entry_file])
    seed = load_module_file(path, "launch_check_seed")
    direct = seed._Compiled.launch
    checked: list[dict[str, Any]] = []

    def compared(self: Any, grid: Any, stream: Any, args: Any) -> None:
        before, encodes = len(recorded), len(encoded)
        direct(self, grid, stream, args)
        ours_encoded = len(encoded) - encodes
        ours = recorded[before:]
        kernel = self.kernel
        g = (*grid, 1, 1)
        kernel.run(g[0], g[1], g[2], stream, kernel.function, kernel.packed_metadata, None, None, None,
                   *seed._jit_args(args))
        theirs = recorded[before + len(ours):]
        # The compiled kernel Triton's JIT picks for these arguments, by its hash (the options named here
        # make another in-memory cache entry than the launch's defaults, of the same compiled kernel).
        # Not for pointers passed as integers (RAW_POINTERS), which Triton would take for integers:
        # run with --set RAW_POINTERS=False for that check.
        pointers = [a for a, ty in zip(args, kernel.src.signature.values(), strict=True) if str(ty).startswith("*")]
        raw = any(isinstance(a, int) for a in pointers)
        picked = None if raw else jit_run(kernel.src.fn, *seed._jit_args(args), grid=grid, warmup=True,
                                          num_warps=kernel.metadata.num_warps, num_stages=kernel.metadata.num_stages)
        checked.append({"kernel": kernel.name, "args": len(theirs[0]) if theirs else 0, "call": call_no[0],
                        "same_kernel": None if raw else picked.hash == kernel.hash,
                        "direct": self.direct is not None, "encoded": ours_encoded,
                        "equal": len(ours) == len(theirs) == 1 and ours[0] == theirs[0]})

    seed._Compiled.launch = compared
    import torch

    smoke = task.generate_inputs(task.workloads("smoke", "cpu")[0], 0, "cpu")
    other = task.generate_inputs(next(w for w in task.workloads("tests-cpu", "cpu") if w.name.startswith("N32_B1_D128")),
                                 0, "cpu")
    shifted = dict(smoke)  # x one element past a 16-byte boundary: another specialization of its pointer
    shifted["x"] = torch.empty(smoke["x"].numel() + 1)[1:].view_as(smoke["x"]).copy_(smoke["x"])
    call_no = [0]
    for inputs in [smoke] * calls + [other] * 2 + [shifted] * 2 + [smoke]:
        call_no[0] += 1
        task.call(seed.custom_kernel, inputs)
    return {"first_call": first_launches, "launches": checked}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="A tunable's value (repeatable).")
    ap.add_argument("--calls", type=int, default=3)
    args = ap.parse_args()
    from ksearch_ray.taskspec.tunables import value_from_text

    values = {k: value_from_text(v) for k, _, v in (s.partition("=") for s in args.set)}
    try:
        out = check(values, args.calls)
    except SystemExit as exc:
        if exc.code == 2:
            import triton

            print(f"Triton {triton.__version__}: not Triton 3.6's launcher layout; nothing to check")
        raise
    for row in out["launches"]:
        print(f"call {row['call']} {row['kernel']}: {'direct' if row['direct'] else 'through kernel.run'}, {row['args']} arguments, "
              f"{'equal to' if row['equal'] else 'DIFFERENT FROM'} Triton's own path; "
              f"descriptors encoded {row['encoded']}; "
              + {True: "the kernel Triton's JIT picks", False: "NOT the kernel Triton's JIT picks",
                 None: "raw pointers"}[row["same_kernel"]])
    print(f"first call (Triton's entry point): {', '.join(out['first_call'])}")
    bad = not out["launches"] or not all(r["equal"] and r["direct"] and r["same_kernel"] is not False
                                         for r in out["launches"])
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
