"""Per-candidate cost of the sandbox: a fresh forked worker per candidate, measured end to end.

Evaluates the toy task's trivial kernel (correctness only, one tiny workload) N times through
one Evaluator and reports the wall time of each evaluation, which is almost all sandbox
overhead (fork, CUDA context, harness set-up, teardown). For comparison it also times a cold
interpreter start that imports torch and Triton and creates a CUDA context: what each
candidate would cost without the pre-imported zygote.

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
    with tempfile.TemporaryDirectory() as tmp, Evaluator(args.device, Path(tmp)) as ev:
        t0 = time.perf_counter()
        first = ev.evaluate(task, task.baseline(), workload_set="tests")
        first_s = time.perf_counter() - t0
        per = []
        for _ in range(args.n):
            r = ev.evaluate(task, task.baseline(), workload_set="tests")
            assert r.passed, r.message
            per.append(r.seconds)
    colds = [cold_start_seconds(args.device) for _ in range(3)]
    report = {
        "device": args.device,
        "first_evaluation_s (includes zygote start)": round(first_s, 3),
        "per_candidate_s_median": round(statistics.median(per), 4),
        "per_candidate_s_min": round(min(per), 4),
        "per_candidate_s_max": round(max(per), 4),
        "n": args.n,
        "cold_interpreter_start_s_median": round(statistics.median(colds), 3),
        "first_status": first.status.value,
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
