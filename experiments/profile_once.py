"""What profiling a kernel costs, and what the profile says: evaluate each solution, then profile it once
(`Evaluator.profile`, Nsight Compute inside the sandbox), as a search with --profile-bests does for a new best.

    python experiments/profile_once.py --task trimul --solutions triton_fused,baseline --workloads smoke \
        --out profile_once.json --logs logs/

Prints one line per solution (evaluation seconds, profile seconds, the slowest kernels) and writes them as
JSON; `--logs` keeps ncu's raw log of each profile (the fixture of tests/test_profile.py came from here).

`--beside S` (issue 40: a profile should stall the next evaluation by at most one evaluation): the evaluator
overlaps (evaluation.overlap), and while each profile runs, solution S is evaluated `--beside-count` times in a
row, as a search's next candidates would be; each one's wait for its turn on the device (`queued`) is the
stall, printed beside S evaluated alone first.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path
from typing import Any

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
    parser.add_argument("--beside", default="", help="Evaluate this solution while each profile runs (overlap).")
    parser.add_argument("--beside-count", type=int, default=3)
    args = parser.parse_args()
    task = find_task(args.task)
    solutions = [task.solution(name) for name in args.solutions.split(",")]  # a bad name: one line, before any work
    beside = task.solution(args.beside) if args.beside else None
    rows = []
    with Evaluator(args.device, isolation=Isolation(args.isolation), profiler=ProfilerSettings(),
                   overlap=bool(args.beside)) as ev:
        print("profiler:", ev.profiler_status().model_dump(), flush=True)
        ev.evaluate(task, task.baseline(), workload_set=args.workloads)  # the evaluator learns the task's stage times
        alone = None
        if beside is not None:
            alone = ev.evaluate(task, beside, workload_set=args.workloads)
            print(f"{args.beside} alone: {alone.seconds:.2f} s", flush=True)
        for solution in solutions:
            name = solution.name
            t0 = time.monotonic()
            result = ev.evaluate(task, solution, workload_set=args.workloads)
            t1 = time.monotonic()
            done: dict[str, Any] = {}
            profiling = threading.Thread(target=lambda s=solution, r=result, n=name, d=done: d.update(profile=ev.profile(
                task, s, r, copy_logs_to=args.logs / n if args.logs else None), end=time.monotonic()))
            profiling.start()
            beside_results = [] if beside is None else [ev.evaluate(task, beside, workload_set=args.workloads)
                                                         for _ in range(args.beside_count)]
            profiling.join()
            profile, t2 = done["profile"], done["end"]
            rows.append({"solution": name, "status": result.status.value, "score": result.score,
                         "evaluation_s": round(t1 - t0, 2), "profile_s": round(t2 - t1, 2),
                         "profile": profile.model_dump(mode="json"),
                         "beside": [{"seconds": round(b.seconds, 3), "queued": b.stages.get("queued", 0.0),
                                     "status": b.status.value} for b in beside_results],
                         "alone_s": round(alone.seconds, 3) if alone else None})
            print(f"{name}: {result.status.value} score {result.score} (evaluation {t1 - t0:.1f} s); profile "
                  f"{profile.status} in {t2 - t1:.1f} s {profile.message}", flush=True)
            if beside_results and alone:
                print(f"    beside it, {args.beside}: " + ", ".join(f"{b.seconds:.2f} s (queued {b.stages.get('queued', 0):.2f})"
                                                               for b in beside_results)
                      + f"; alone {alone.seconds:.2f} s; the longest stall {max(b.stages.get('queued', 0) for b in beside_results):.2f} s",
                      flush=True)
            for line in profile.lines():
                print("   ", line, flush=True)
    args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    from ksearch_ray.taskspec.spec import TaskError

    try:
        main()
    except TaskError as exc:  # a task or solution name that is not there: one line
        raise SystemExit(f"error: {exc}") from None
