"""Build FlashInfer's JIT modules for the `flashinfer` baseline solutions, once, outside the sandbox.

FlashInfer compiles a kernel family the first time it is used (tens of seconds for attention;
for the Hopper fused MoE, hundreds of CUTLASS instantiations). Inside the sandbox that would
happen in every evaluation, because each worker gets its own HOME. Run this with
FLASHINFER_WORKSPACE_BASE pointing at a shared cache and pass the same variable to `ksearch`:
the sandbox keeps it, and every worker then loads the built modules.

Each build is followed by one call of the solution on the task's first `feedback` workload,
checked against the task's reference, so a wrong wrapper shows up here rather than as a
baseline that fails every evaluation.

    FLASHINFER_WORKSPACE_BASE=$PWD/.ficache python3 experiments/flashinfer_warmup.py gqa mla_decode mla_prefill moe
"""

from __future__ import annotations

import argparse
import time

import torch

from ksearch_ray.evaluation.compare import compare_outputs
from ksearch_ray.taskspec.task import find_task, load_module_file

TASKS = {
    "gqa": "gqa_paged_decode_h32_kv4_d128_ps1",
    "mla_decode": "mla_paged_decode_h16_ckv512_kpe64_ps1",
    "mla_prefill": "mla_paged_prefill_causal_h16_ckv512_kpe64_ps1",
    "moe": "moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e32_h7168_i2048",
}


def warm(key: str, seed: int, shipped_only: bool = False) -> bool:
    task = find_task(TASKS[key])
    path = task.root / "solutions" / "flashinfer" / "main.py"
    module = load_module_file(path, f"flashinfer_baseline_{key}")
    workload = task.workloads("feedback", "cuda")[0]
    inputs = task.generate_inputs(workload, seed, "cuda")
    expected = task.reference(inputs)
    # GQA: also build the CUDA-core decode path, for the side-by-side run that chose tensor cores.
    variants = [True, False] if hasattr(module, "USE_TENSOR_CORES") and not shipped_only else [None]
    passed = True
    for tensor_cores in variants:
        if tensor_cores is not None:
            module.USE_TENSOR_CORES = tensor_cores
            module._wrappers.clear()
        start = time.perf_counter()
        got = task.normalize_outputs(task.call(module.run, inputs))
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        verdict = compare_outputs(got, expected, task.definition.outputs, task.definition.tolerance)
        label = key if tensor_cores is None else f"{key} (tensor cores: {tensor_cores})"
        print(f"{label}: first call (build + run) {seconds:.1f} s on workload {workload.name}: "
              f"{verdict.status.value} {verdict.message}".rstrip(), flush=True)
        passed = passed and verdict.status.value == "PASSED"
    return passed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tasks", nargs="+", choices=sorted(TASKS))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--shipped-only", action="store_true", help="Build only the path the solution ships with "
                        "(GQA: not the tensor-core variant as well).")
    args = parser.parse_args()
    results = [warm(key, args.seed, args.shipped_only) for key in args.tasks]
    raise SystemExit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
