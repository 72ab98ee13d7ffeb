"""What the judge spends on one workload's verdict: the reference (a cache miss) and the comparison,
the full one against its short path for all-finite outputs (evaluation/compare.py), side by side.

For each workload of the set, the reference is computed as the judge computes it (inputs regenerated
from a seed, TF32 off; `--repeats` times, the median kept), and a passing output is made from it (the
reference times 1 + 1e-6, which every tolerance accepts); each repeat then times the full comparison and
the short path, alternating, synchronized on the device. Prints a table of medians and, with --json, one JSON line.

    python experiments/judge_cost.py [--task trimul] [--device cuda] [--workloads benchmarks] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from ksearch_ray.evaluation import compare
from ksearch_ray.evaluation.judge import reference_precision
from ksearch_ray.taskspec.task import find_task


def _seconds(device: str, fn: Callable[[], Any]) -> tuple[float, Any]:
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    value = fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0, value


def _workload_row(task: Any, workload: Any, device: str, repeats: int) -> dict[str, Any]:
    tol, specs = task.definition.tolerance, task.definition.outputs

    def reference() -> dict[str, Any]:
        with torch.no_grad(), reference_precision():
            return task.reference(task.generate_inputs(workload, 12345, device, frozenset()))

    reference_times = []
    for _ in range(repeats):  # the first includes whatever is done once (kernels' first launches)
        seconds, expected = _seconds(device, reference)
        reference_times.append(seconds)
    reference_s = statistics.median(reference_times)
    got = {k: v * (1 + 1e-6) if isinstance(v, torch.Tensor) and v.is_floating_point() else v
           for k, v in expected.items()}
    full_s, short_s = [], []
    saved = compare._all_finite_pass
    for _ in range(repeats):
        compare._all_finite_pass = lambda *_a: None
        try:
            seconds, full = _seconds(device, lambda: compare.compare_outputs(got, expected, specs, tol))
        finally:
            compare._all_finite_pass = saved
        full_s.append(seconds)
        seconds, short = _seconds(device, lambda: compare.compare_outputs(got, expected, specs, tol))
        short_s.append(seconds)
        assert short == full, (workload.name, short, full)
    elements = sum(v.numel() for v in expected.values() if isinstance(v, torch.Tensor))
    return {"workload": workload.name, "elements": elements, "reference_ms": round(reference_s * 1e3, 2),
            "compare_full_ms": round(statistics.median(full_s) * 1e3, 2),
            "compare_short_ms": round(statistics.median(short_s) * 1e3, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="trimul")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--workloads", default="benchmarks")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    task = find_task(args.task)
    rows = [_workload_row(task, workload, args.device, args.repeats)
            for workload in task.workloads(args.workloads, args.device)]
    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(f"{task.name}, {args.workloads} set, {name}, medians of {args.repeats}")
    print(f"{'workload':<40} {'elements':>11} {'reference ms':>13} {'compare: full':>14} {'short ms':>9} {'full/short':>10}")
    for r in rows:
        ratio = r["compare_full_ms"] / r["compare_short_ms"] if r["compare_short_ms"] else float("nan")
        print(f"{r['workload']:<40} {r['elements']:>11,} {r['reference_ms']:>13.2f} {r['compare_full_ms']:>14.2f} "
              f"{r['compare_short_ms']:>9.2f} {ratio:>9.2f}x")
    total = {k: round(sum(r[k] for r in rows), 2) for k in ("reference_ms", "compare_full_ms", "compare_short_ms")}
    print(f"{'sum':<40} {'':>11} {total['reference_ms']:>13.2f} {total['compare_full_ms']:>14.2f} {total['compare_short_ms']:>9.2f}")
    if args.json:
        print(json.dumps({"task": task.name, "device": name, "workloads": args.workloads, "rows": rows, "sum": total}))


if __name__ == "__main__":
    from ksearch_ray.taskspec.spec import TaskError

    try:
        main()
    except TaskError as exc:  # a task or solution name that is not there: one line
        raise SystemExit(f"error: {exc}") from None
