"""Both figures of every default seed against its comparison (issue 39), on one GPU, isolation required.

One evaluation records both figures of every workload: `kernel` (the call replayed as a CUDA graph)
and `call` (the candidate's own call, host launch work included, as GPUMode's eval.py and
FlashInfer-Bench time it), so one evaluation per solution gives the comparison under both
objectives. Comparisons: TriMul's `triton_fused` against K-Search's published kernel (a file
outside the repository, --ksearch-best; skipped when absent) and the task's baseline; each attention
task's default seed against `flashinfer_kernel` (the library's kernel, its plan untimed) on the
task's default set; the MoE task's seed against its PyTorch reference (FlashInfer's fused MoE builds
about 249 compilation units at its first call). Last, the MLA prefill `all` command of the issue, through the CLI as a user
runs it, with the peak GPU memory of every process polled from nvidia-smi (the worker is a process
of its own).

    FLASHINFER_WORKSPACE_BASE=/tmp/ficache python3 experiments/two_timings.py --out /tmp/out/two_timings \\
        --ksearch-best .external/ksearch_best.py
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from ksearch_ray.evaluation.evaluator import Evaluator
from ksearch_ray.evaluation.sandbox.isolation import Isolation
from ksearch_ray.models import EvalResult, Solution
from ksearch_ray.taskspec.task import Task, find_task, solution_from_file

HERE = Path(__file__).resolve().parent
ATTENTION = {
    "gqa": "gqa_paged_decode_h32_kv4_d128_ps1",
    "mla_decode": "mla_paged_decode_h16_ckv512_kpe64_ps1",
}
PREFILL = "mla_paged_prefill_causal_h16_ckv512_kpe64_ps1"
MOE = "moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e32_h7168_i2048"
"""Against the task's PyTorch reference: FlashInfer's fused MoE builds about 249 compilation units at its first call."""


def figure(result: EvalResult, which: str) -> dict[str, float]:
    out = {}
    for w in result.workloads:
        ms = w.kernel_ms if which == "kernel" else w.call_ms
        if ms:
            out[w.workload] = ms
    return out


def speedups(candidate: EvalResult, other: EvalResult) -> dict[str, str]:
    """Per objective: the geomean and the mean (FlashInfer-Bench's score) over workloads of other / candidate."""
    text = {}
    for which in ("kernel", "call"):
        a, b = figure(candidate, which), figure(other, which)
        r = [b[k] / a[k] for k in a if k in b]
        if not r:
            text[which] = "-"
            continue
        geo = math.exp(sum(math.log(x) for x in r) / len(r))
        text[which] = f"{geo:.3f}x geomean, {sum(r) / len(r):.3f}x mean ({min(r):.2f}-{max(r):.2f}, {len(r)} workloads)"
    return text


def line(result: EvalResult) -> str:
    kernel, call = figure(result, "kernel"), figure(result, "call")
    geo = {k: math.exp(sum(math.log(x) for x in v.values()) / len(v)) if v else None for k, v in
           (("kernel", kernel), ("call", call))}
    shown = ", ".join(f"{k} {v:.4g} ms" if v else f"{k} -" for k, v in geo.items())
    return (f"{result.task[:34]:34s} {result.solution_name[:22]:22s} {result.status.value:10s} objective {result.objective}: "
            f"{shown} (geomeans over {len(result.workloads)} workloads, {result.seconds:.0f} s) {result.message[:160]}")


def compare(evaluator: Evaluator, task: Task, seed: Solution, other: Solution, out: Path) -> None:
    results = []
    for solution in (other, seed):
        result = evaluator.evaluate(task, solution, workload_set=task.definition.default_workloads, mode="fresh")
        (out / f"{task.name}_{solution.name}.json").write_text(result.model_dump_json(indent=1))
        print(line(result), flush=True)
        results.append(result)
    for which, text in speedups(results[1], results[0]).items():
        print(f"    {seed.name} over {other.name}, {which}: {text}", flush=True)


def prefill_all(out: Path) -> None:
    """The issue's command, as a user types it, with every process's GPU memory polled."""
    cmd = [sys.executable, "-m", "ksearch_ray", "eval", "--task", PREFILL, "triton_flash", "--against", "flashinfer_kernel",
           "--workloads", "all", "--isolation", "require", "--json"]
    peaks: dict[str, int] = {}
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            query = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                                   capture_output=True, text=True, check=False)
            for row in query.stdout.strip().splitlines():
                pid, _, mib = row.partition(",")
                if mib.strip().isdigit():
                    peaks[pid.strip()] = max(peaks.get(pid.strip(), 0), int(mib))
            time.sleep(0.25)

    watcher = threading.Thread(target=poll, daemon=True)
    watcher.start()
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    done.set()
    watcher.join()
    (out / "prefill_all.json").write_text(proc.stdout)
    (out / "prefill_all.stderr").write_text(proc.stderr)
    print(f"\n$ ksearch {' '.join(cmd[3:])}\nexit {proc.returncode} after {time.time() - t0:.0f} s; "
          f"traceback in stderr: {'Traceback' in proc.stderr}", flush=True)
    print(f"peak GPU memory per process (MiB, nvidia-smi every 0.25 s): {dict(sorted(peaks.items()))}", flush=True)
    try:
        payload = json.loads(proc.stdout)
    except json.JSONDecodeError:
        print("no JSON result; stderr tail:\n" + proc.stderr[-2000:], flush=True)
        return
    for key in ("baseline", "result"):
        print(line(EvalResult.model_validate(payload[key])), flush=True)
    cand, base = EvalResult.model_validate(payload["result"]), EvalResult.model_validate(payload["baseline"])
    for which, text in speedups(cand, base).items():
        print(f"    triton_flash over flashinfer_kernel on all, {which}: {text}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--ksearch-best", type=Path, default=Path(".external/ksearch_best.py"),
                    help="K-Search's published TriMul kernel (not in the repository); skipped when absent.")
    ap.add_argument("--skip-prefill-all", action="store_true")
    ap.add_argument("--skip-trimul", action="store_true", help="Only the FlashInfer tasks (and the prefill command).")
    ap.add_argument("--skip-moe", action="store_true", help="Not the MoE task (its seed against its PyTorch reference).")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    if os.environ.get("FLASHINFER_WORKSPACE_BASE"):  # the library's JIT modules, built once outside the sandbox
        warm = subprocess.run([sys.executable, str(HERE / "flashinfer_warmup.py"), "gqa", "mla_decode", "mla_prefill",
                               "--shipped-only"], capture_output=True, text=True, check=False)
        print(f"flashinfer warm-up exit {warm.returncode} after {time.time() - t0:.0f} s", flush=True)
    evaluator = Evaluator("cuda", isolation=Isolation.REQUIRE)
    try:
        trimul = find_task("trimul")
        seed = trimul.solution(trimul.definition.default_seed or "triton_fused")
        print(f"objectives: trimul {trimul.definition.objective.timed}, "
              + ", ".join(f"{k} {find_task(v).definition.objective.timed}" for k, v in ATTENTION.items()), flush=True)
        if args.skip_trimul:
            pass
        elif args.ksearch_best.is_file():
            compare(evaluator, trimul, seed, solution_from_file(args.ksearch_best, trimul, name="ksearch_best"), args.out)
        else:
            print(f"no {args.ksearch_best}: TriMul against K-Search's published kernel skipped", flush=True)
        if not args.skip_trimul:
            compare(evaluator, trimul, seed, trimul.baseline(), args.out)
        for name in ATTENTION.values():
            task = find_task(name)
            compare(evaluator, task, task.solution(task.definition.default_seed or ""), task.solution("flashinfer_kernel"),
                    args.out)
        if not args.skip_moe:
            moe = find_task(MOE)
            compare(evaluator, moe, moe.solution(moe.definition.default_seed or ""), moe.baseline(), args.out)
    finally:
        evaluator.close()
    if not args.skip_prefill_all:
        prefill_all(args.out)
    print(f"total {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
