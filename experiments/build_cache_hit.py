"""What a build costs cold, and what a build-cache hit costs: directly, and as the Ray build task.

    python experiments/build_cache_hit.py --task toy_axpy_cpp --task-dir tests/data --solution cpp_seed
    python experiments/build_cache_hit.py --task gqa_paged_decode_h32_kv4_d128_ps1 --solution cuda_cute   # on a GPU

The first build is a compile (timed) unless `--scratch` names a cache that has it. Then `--hits` times:
  * a hit through `Builder.build` (key, read, sha256 check): what any process on the node pays;
  * a hit through the `build_extension` Ray task (scheduling, the hit, the record and library
    through the object store), as the evaluator pool sees it.
The target is the local GPU's architecture, or none on the CPU. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--task", required=True)
    ap.add_argument("--task-dir", action="append", default=[])
    ap.add_argument("--solution", required=True)
    ap.add_argument("--hits", type=int, default=20)
    ap.add_argument("--scratch", default=None, help="Scratch directory (default: a new temporary one).")
    args = ap.parse_args()

    import ray
    import torch
    from ksearch_ray.actors.build_task import build_extension, node_cache

    from ksearch_ray.evaluation.buildcache import BuildTarget
    from ksearch_ray.evaluation.builder import Builder
    from ksearch_ray.evaluation.sandbox.build import arch_for
    from ksearch_ray.taskspec.task import find_task

    task = find_task(args.task, args.task_dir)
    solution = task.solution(args.solution)
    scratch = Path(args.scratch or tempfile.mkdtemp(prefix="ksearch-hit-"))
    target = BuildTarget(archs=(arch_for(*torch.cuda.get_device_capability()),)) if torch.cuda.is_available() else BuildTarget()

    builder = Builder(scratch / "builders" / "direct", node_cache(str(scratch)))
    t0 = time.perf_counter()
    record, library = builder.build(solution, target)
    cold = time.perf_counter() - t0
    direct = []
    for _ in range(args.hits):
        t0 = time.perf_counter()
        hit, _ = builder.build(solution, target)
        direct.append(time.perf_counter() - t0)
        assert hit.cached
    builder.close()

    ray.init(include_dashboard=False, logging_level="WARNING")
    via_ray = []
    for _ in range(args.hits):
        t0 = time.perf_counter()
        rec_ref, lib_ref = build_extension.options(num_cpus=1).remote(solution, target, str(scratch), 900.0, 1)
        hit, lib = ray.get([rec_ref, lib_ref])
        via_ray.append(time.perf_counter() - t0)
        assert hit.cached and lib == library
    ray.shutdown()
    print(json.dumps({
        "task": task.name, "solution": args.solution, "target": list(target.archs), "status": record.status.value,
        "library_bytes": record.size, "first_build_s": round(cold, 3), "first_build_was_a_hit": record.cached,
        "compile_s": round(record.seconds, 3),
        "hit_direct_ms": {"median": round(1e3 * statistics.median(direct), 2), "max": round(1e3 * max(direct), 2)},
        "hit_ray_task_ms": {"median": round(1e3 * statistics.median(via_ray), 1), "max": round(1e3 * max(via_ray), 1),
                            "first": round(1e3 * via_ray[0], 1)},
        "toolchain": record.toolchain.model_dump(),
    }, indent=2))


if __name__ == "__main__":
    main()
