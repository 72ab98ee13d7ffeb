"""What a sandboxed reference worker costs (an untrusted task's references, evaluation/reference.py).

Starts the worker `--starts` times in one warm evaluator (its zygote running, as in a search) and asks
each for `--requests` references of distinct seeds, then computes the same kind of reference in this
process, as the judge does for a task shipped with the package. Prints the medians as one JSON line.

    python experiments/reference_worker_cost.py [--task tests/data/toy] [--device cpu] [--workloads tests]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from ksearch_ray.evaluation.evaluator import Evaluator
from ksearch_ray.evaluation.reference import SandboxedReference
from ksearch_ray.evaluation.sandbox.isolation import Isolation
from ksearch_ray.evaluation.settings import Limits
from ksearch_ray.taskspec.task import find_task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="tests/data/toy")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--workloads", default="tests")
    parser.add_argument("--starts", type=int, default=5)
    parser.add_argument("--requests", type=int, default=10)
    args = parser.parse_args()
    task = find_task(args.task)
    workload = task.workloads(args.workloads, args.device)[0]
    starts, requests = [], []
    with Evaluator(args.device, limits=Limits(idle=120), isolation=Isolation.REQUIRE) as ev:
        for i in range(args.starts):
            worker = SandboxedReference(ev.sandbox, task, ev.work_root, setup_s=300, idle_s=120)
            t0 = time.perf_counter()
            worker.ensure_started()
            starts.append(time.perf_counter() - t0)
            for j in range(args.requests):
                t0 = time.perf_counter()
                worker.compute(workload, 1000 * i + j, frozenset())
                requests.append(time.perf_counter() - t0)
            worker.close()
        in_process = []
        for j in range(args.requests * args.starts):
            t0 = time.perf_counter()
            task.reference(task.generate_inputs(workload, j, args.device))
            if args.device == "cuda":
                import torch

                torch.cuda.synchronize()
            in_process.append(time.perf_counter() - t0)
    print(json.dumps({
        "task": task.name, "workload": workload.name, "device": args.device,
        "start_ms_median": round(statistics.median(starts) * 1e3, 1),
        "start_ms_range": [round(min(starts) * 1e3, 1), round(max(starts) * 1e3, 1)],
        "request_ms_median": round(statistics.median(requests) * 1e3, 2),
        "in_process_ms_median": round(statistics.median(in_process) * 1e3, 3),
    }))


if __name__ == "__main__":
    main()
