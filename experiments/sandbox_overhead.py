"""Per-candidate cost of the sandbox: a fresh forked worker per candidate, measured end to end.

Evaluates the toy task's trivial kernel (correctness only, one tiny workload) N times through
one Evaluator and reports the wall time of each evaluation, which is almost all sandbox
overhead (fork, namespaces and filesystem view, CUDA context, harness set-up, teardown). It does
so side by side with isolation on (required) and off, interleaved, so the ratio is the added
cost of the isolation. For comparison it also times a cold interpreter start that imports torch
and Triton and creates a CUDA context: what each candidate would cost without the zygote.

    python experiments/sandbox_overhead.py [--device cuda|cpu] [--n 20]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ksearch_ray.evaluation.evaluator import Evaluator
from ksearch_ray.evaluation.sandbox.isolation import Isolation
from ksearch_ray.taskspec.task import Task

ROOT = Path(__file__).resolve().parents[1]


def cold_start_seconds(device: str) -> float:
    code = "import torch, triton\n" + ("torch.empty(1, device='cuda'); torch.cuda.synchronize()\n" if device == "cuda" else "")
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--n", type=int, default=20)
    args = ap.parse_args()
    task = Task.load(ROOT / "tests" / "data" / "toy")
    modes = (Isolation.REQUIRE, Isolation.OFF)
    with tempfile.TemporaryDirectory() as tmp:
        evaluators = {m: Evaluator(args.device, Path(tmp) / m.value, isolation=m) for m in modes}
        try:
            first = {}
            for m, ev in evaluators.items():
                t0 = time.perf_counter()
                r = ev.evaluate(task, task.baseline(), workload_set="tests")
                assert r.passed, r.message
                first[m] = time.perf_counter() - t0
            per: dict[Isolation, list[float]] = {m: [] for m in modes}
            for _ in range(args.n):  # interleaved: the machine's drift touches both alike
                for m, ev in evaluators.items():
                    r = ev.evaluate(task, task.baseline(), workload_set="tests")
                    assert r.passed, r.message
                    per[m].append(r.seconds)
        finally:
            for ev in evaluators.values():
                ev.close()
    colds = [cold_start_seconds(args.device) for _ in range(3)]
    on, off = statistics.median(per[Isolation.REQUIRE]), statistics.median(per[Isolation.OFF])
    report = {
        "device": args.device,
        "n": args.n,
        **{f"isolation_{m.value}": {
            "first_evaluation_s": round(first[m], 3),
            "per_candidate_s_median": round(statistics.median(per[m]), 4),
            "per_candidate_s_min": round(min(per[m]), 4),
            "per_candidate_s_max": round(max(per[m]), 4),
        } for m in modes},
        "added_by_isolation_s_median": round(on - off, 4),
        "ratio_on_over_off": round(on / off, 2),
        "cold_interpreter_start_s_median": round(statistics.median(colds), 3),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
