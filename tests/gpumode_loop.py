"""An independent GPUMode-style timing loop (the reproduction check of issue 39), written plainly here
after the rules of GPUMode's reference-kernels problems/bioml/trimul/eval.py, leaderboard mode, and
sharing nothing with the evaluator but the task's own input generator and reference:

* the submission is imported once into a fresh process (eval.py runs it in a spawned pool process);
* warm-up: calls on the first benchmark's inputs, unchecked, until 10 ms of timed calls (at least 3);
* per benchmark: one untimed call on its inputs, checked; then up to 100 timed calls, each on new
  inputs (seed + 13 each time) generated while the last ones are still alive, with a clone kept for
  the check, and packed into eval.py's `data` tuple; torch.cuda.synchronize(), CUDA events around the
  one call, synchronize; the output checked against the reference on the clone before the next call;
  no L2 clearing;
* stop after at least 3 calls once the standard error is below 0.1 % of the mean, or the calls add
  up to 30 s, or 120 s of wall time passed; the figure is the mean.

    python tests/gpumode_loop.py --task trimul --solution triton_fused [--workload-set benchmarks]

prints one JSON object: workload name -> {"mean_ms", "count", "median_ms", "min_ms", "max_ms", "host_median_ms"}
(the host time of a call: from just before its start event's record to its return, as the evaluator's
`Timing.host_median_ms`).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch


def load_kernel(sources: dict[str, str], entry_file: str, entry_point: str, folder: Path) -> Any:
    for name, text in sources.items():
        (folder / name).write_text(text)
    sys.path.insert(0, str(folder))
    spec = importlib.util.spec_from_file_location("submission", folder / entry_file)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["submission"] = module
    spec.loader.exec_module(module)
    return getattr(module, entry_point)


def check(task: Any, inputs: dict[str, Any], output: Any) -> None:
    """The output against the reference on `inputs`, elementwise |y - ref| <= atol + rtol |ref|."""
    expected = task.reference(inputs)
    got = task.normalize_outputs(output)
    tol = task.definition.tolerance
    for name, ref in expected.items():
        out = got[name].to(ref.dtype)
        ok = ((out - ref).abs() <= tol.atol + tol.rtol * ref.abs()) | (out.isnan() & ref.isnan())
        if not bool(ok.all()):
            raise AssertionError(f"output {name} differs from the reference")


def stop(durations: list[float], started: float, max_total_ms: float) -> bool:
    n = len(durations)
    if n < 3:
        return False
    mean = statistics.fmean(durations)
    err = statistics.stdev(durations) / math.sqrt(n)
    return err / mean < 1e-3 or mean * n > max_total_ms or time.perf_counter() - started > 120


def benchmark(task: Any, kernel: Any, workload: Any, recheck: bool, max_total_ms: float,
              hosts: list[float] | None = None) -> list[float]:
    """The timed calls' durations (ms); their host times go into `hosts`."""
    hosts = [] if hosts is None else hosts
    seed = int(workload.params.get("seed", 0))
    data = task.generate_inputs(workload, seed, "cuda")
    copy = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in data.items()}
    output = task.call(kernel, data)
    check(task, copy, output)
    durations: list[float] = []
    started = time.perf_counter()
    for _ in range(100):
        if recheck:
            seed += 13
            data = task.generate_inputs(workload, seed, "cuda")
            copy = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in data.items()}
        args = task.arguments(data)  # eval.py's `data` tuple, made before its clock starts
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        start.record()
        output = kernel(*args)
        t1 = time.perf_counter()  # the call's host time (one clock read inside the window, tens of ns)
        end.record()
        torch.cuda.synchronize()
        durations.append(start.elapsed_time(end))
        hosts.append((t1 - t0) * 1e3)
        if recheck:
            check(task, copy, output)
        del output
        if stop(durations, started, max_total_ms):
            break
    return durations


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", default="trimul")
    ap.add_argument("--solution", required=True)
    ap.add_argument("--workload-set", default="benchmarks")
    args = ap.parse_args()
    from ksearch_ray.taskspec.task import find_task  # the task bundle's loader: its generator and reference

    task = find_task(args.task)
    solution = task.solution(args.solution)
    workloads = task.workloads(args.workload_set, "cuda")
    with tempfile.TemporaryDirectory() as folder:
        kernel = load_kernel(solution.sources, solution.entry_file, solution.entry_point, Path(folder))
        benchmark(task, kernel, workloads[0], recheck=False, max_total_ms=10.0)  # eval.py's warm-up
        out = {}
        for workload in workloads:
            hosts: list[float] = []
            d = benchmark(task, kernel, workload, recheck=True, max_total_ms=30e3, hosts=hosts)
            out[workload.name] = {"mean_ms": statistics.fmean(d), "count": len(d), "median_ms": statistics.median(d),
                                  "min_ms": min(d), "max_ms": max(d), "host_median_ms": statistics.median(hosts)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
