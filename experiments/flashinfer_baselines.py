"""Kernel against kernel: FlashInfer's library baselines and every seed of the attention tasks, side by
side in one sandboxed evaluator with isolation required (issue 19).

For each attention task, on `feedback` and on `all`: `flashinfer_kernel` (the library's kernel alone:
its plan() is the trusted untimed `prepare` step) and `flashinfer` (plan plus kernel in every timed
call); then every seed on `feedback`; then the destination-passing CUDA solution kept in
tests/data/flashinfer_bench (FlashInfer-Bench's format, imported through ksearch-ray's adapter) on
GQA; then the seeds on `all` while time is left. FlashInfer's JIT modules are built first, outside the sandbox
(experiments/flashinfer_warmup.py, the three tasks at once), while the CUDA seed is built ahead on
the CPU builder. Fresh mode throughout: new tensors, page table and length split for every call.

Every result is written as JSON under --out, and a summary with kernel-against-kernel ratios is
printed: a ratio is FlashInfer-Bench's score, the mean over workloads of other / candidate latency.

    FLASHINFER_WORKSPACE_BASE=/tmp/ficache python3 experiments/flashinfer_baselines.py --out /tmp/out/results
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

from ksearch_ray.evaluation.buildcache import BuildCache, BuildTarget
from ksearch_ray.evaluation.builder import Builder
from ksearch_ray.evaluation.evaluator import Evaluator
from ksearch_ray.evaluation.sandbox.build import arch_for
from ksearch_ray.evaluation.sandbox.isolation import Isolation
from ksearch_ray.evaluation.settings import TimingPolicy
from ksearch_ray.models import EvalResult, Solution
from ksearch_ray.taskspec.flashinfer_format import solution_from_json
from ksearch_ray.taskspec.task import Task, find_task

HERE = Path(__file__).resolve().parent
TASKS = {
    "gqa": "gqa_paged_decode_h32_kv4_d128_ps1",
    "mla_decode": "mla_paged_decode_h16_ckv512_kpe64_ps1",
    "mla_prefill": "mla_paged_prefill_causal_h16_ckv512_kpe64_ps1",
}
LIBRARY = ("flashinfer_kernel", "flashinfer")
DPS_FIXTURE = HERE.parent / "tests" / "data" / "flashinfer_bench" / "gqa_decode_cuda_dps.json"


def seeds(task: Task) -> list[str]:
    return [n for n in task.solution_names() if n not in (*LIBRARY, task.definition.baseline)]


def warm_up(out: Path) -> dict[str, int]:
    """Build the JIT modules of all three tasks at once (different modules take different locks)."""
    procs = {key: subprocess.Popen([sys.executable, str(HERE / "flashinfer_warmup.py"), key, "--shipped-only"],
                                   stdout=(out / f"warmup_{key}.log").open("w"), stderr=subprocess.STDOUT)
             for key in TASKS}
    return {key: p.wait() for key, p in procs.items()}


def ratio(candidate: EvalResult, other: EvalResult) -> tuple[float, float, float] | None:
    """(mean, min, max) over workloads of other / candidate mean latency: FlashInfer-Bench's score."""
    a = {w.workload: w.timing.mean_ms for w in candidate.workloads if w.timing}
    b = {w.workload: w.timing.mean_ms for w in other.workloads if w.timing}
    r = [b[k] / a[k] for k in a if k in b and a[k] > 0]
    return (sum(r) / len(r), min(r), max(r)) if r else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--deadline", type=float, default=math.inf, help="Epoch seconds: start nothing after it (minus a margin).")
    ap.add_argument("--feedback-calls", type=int, default=30, help="Cap on timed calls per workload on feedback.")
    ap.add_argument("--all-calls", type=int, default=10, help="Cap on timed calls per workload on all.")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    tasks = {key: find_task(name) for key, name in TASKS.items()}
    target = BuildTarget(archs=(arch_for(*torch.cuda.get_device_capability()),))
    prebuilt: dict[str, tuple[Any, bytes]] = {}

    def build_ahead() -> None:  # the CUDA seeds compile on the CPU builder while FlashInfer's JIT runs
        builder = Builder(args.out.parent / "builder", BuildCache(args.out.parent / "build_cache"), max_jobs=4)
        try:
            for task in tasks.values():
                for name in seeds(task):
                    solution = task.solution(name)
                    if solution.language == "cuda":
                        record, library = builder.build(solution, target)
                        print(f"built {task.name}/{name}: {record.status.value} in {record.seconds:.0f} s", flush=True)
                        if library is not None:
                            prebuilt[solution.id] = (record, library)
        finally:
            builder.close()

    builds = threading.Thread(target=build_ahead)
    builds.start()
    codes = warm_up(args.out)
    print(f"warm-up exit codes {codes} after {time.time() - t0:.0f} s", flush=True)
    for key in TASKS:
        print(f"  {key}: " + " | ".join((args.out / f"warmup_{key}.log").read_text().strip().splitlines()[-2:]), flush=True)

    # What must not be cut by the deadline comes first: both library solutions on both sets.
    plan: list[tuple[str, str, str | Path]] = []  # (task key, set, solution name or fixture path)
    plan += [(key, set_name, name) for set_name in ("feedback", "all") for key in TASKS for name in LIBRARY]
    plan += [(key, "feedback", name) for key, task in tasks.items() for name in seeds(task)]
    plan.append(("gqa", "feedback", DPS_FIXTURE))
    plan += [(key, "all", name) for key, task in tasks.items() for name in seeds(task)]

    results: dict[tuple[str, str, str], EvalResult] = {}
    evaluator = Evaluator("cuda", isolation=Isolation.REQUIRE, timing=TimingPolicy(max_calls=args.feedback_calls))
    try:
        for key, set_name, what in plan:
            if time.time() > args.deadline - 45:
                print(f"skipped {key} {what} on {set_name}: no time left", flush=True)
                continue
            task = tasks[key]
            solution: Solution = solution_from_json(what, task) if isinstance(what, Path) else task.solution(what)
            if solution.language == "cuda" and solution.id not in prebuilt:
                builds.join()  # its build ahead has not finished: wait for it rather than compile twice
            evaluator.timing.max_calls = args.feedback_calls if set_name == "feedback" else args.all_calls
            result = evaluator.evaluate(task, solution, workload_set=set_name, mode="fresh",
                                        prebuilt=prebuilt.get(solution.id))
            label = solution.name
            results[(key, set_name, label)] = result
            passed = sum(w.status.value == "PASSED" for w in result.workloads)
            print(f"{key:12s} {set_name:8s} {label:28s} {result.status.value:20s} {passed}/{len(result.workloads)} "
                  f"geomean {result.score if result.score is None else round(result.score, 4)} ms "
                  f"untimed-prepare {result.prepared_untimed} ({result.seconds:.0f} s) {result.message[:160]}", flush=True)
            (args.out / f"{key}_{set_name}_{label}.json").write_text(result.model_dump_json(indent=1))
    finally:
        evaluator.close()
        builds.join()

    print(f"\nratios (mean over workloads of other/candidate latency; min-max), total {time.time() - t0:.0f} s")
    for key in TASKS:
        for set_name in ("feedback", "all"):
            kernel = results.get((key, set_name, "flashinfer_kernel"))
            planned = results.get((key, set_name, "flashinfer"))
            for label, r in sorted((k[2], v) for k, v in results.items() if k[:2] == (key, set_name)):
                cells = []
                for other_name, other in (("kernel", kernel), ("plan+run", planned)):
                    if other is None or other is r or not (r.passed and other.passed):
                        continue
                    got = ratio(r, other)
                    if got:
                        cells.append(f"vs {other_name} {got[0]:.3f}x ({got[1]:.2f}-{got[2]:.2f})")
                print(f"  {key:12s} {set_name:8s} {label:28s} {r.status.value:8s} geomean "
                      f"{'-' if r.score is None else f'{r.score:.4f}'} ms  " + "  ".join(cells))


if __name__ == "__main__":
    main()
