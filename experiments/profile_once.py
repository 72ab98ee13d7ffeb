"""What profiling a kernel costs, and what the profile says: evaluate each solution, then profile it once
(`Evaluator.profile`, Nsight Compute inside the sandbox), as a search with --profile-bests does for a new best.

    python experiments/profile_once.py --task trimul --solutions triton_fused,baseline --workloads smoke \
        --out profile_once.json --logs logs/

Prints one line per solution (evaluation seconds, profile seconds, the slowest kernels) and writes them as
JSON; `--logs` keeps ncu's raw log of each profile (the fixture of tests/test_profile.py came from here).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from ksearch_ray.evaluation.evaluator import Evaluator
from ksearch_ray.evaluation.sandbox.isolation import Isolation
from ksearch_ray.evaluation.settings import ProfilerSettings
from ksearch_ray.taskspec.task import find_task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="trimul")
    parser.add_argument("--solutions", default="triton_fused")
    parser.add_argument("--workloads", default="smoke")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--isolation", default="require")
    parser.add_argument("--out", type=Path, default=Path("profile_once.json"))
    parser.add_argument("--logs", type=Path, default=None)
    args = parser.parse_args()
    task = find_task(args.task)
    rows = []
    with Evaluator(args.device, isolation=Isolation(args.isolation), profiler=ProfilerSettings()) as ev:
        print("profiler:", ev.profiler_status().model_dump(), flush=True)
        ev.evaluate(task, task.baseline(), workload_set=args.workloads)  # the evaluator learns the task's stage times
        for name in args.solutions.split(","):
            solution = task.solution(name)
            t0 = time.monotonic()
            result = ev.evaluate(task, solution, workload_set=args.workloads)
            t1 = time.monotonic()
            profile = ev.profile(task, solution, result, copy_logs_to=args.logs / name if args.logs else None)
            t2 = time.monotonic()
            rows.append({"solution": name, "status": result.status.value, "score": result.score,
                         "evaluation_s": round(t1 - t0, 2), "profile_s": round(t2 - t1, 2),
                         "profile": profile.model_dump(mode="json")})
            print(f"{name}: {result.status.value} score {result.score} (evaluation {t1 - t0:.1f} s); profile "
                  f"{profile.status} in {t2 - t1:.1f} s {profile.message}", flush=True)
            for line in profile.lines():
                print("   ", line, flush=True)
    args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
