"""The search machinery at a width, without GPUs or a model: the real engine, world model and K-Search
method in this process, a planner and a coder that answer at once, and fake evaluators that sleep.

    python experiments/wm_soak.py --width 16 --rounds 2000
    python experiments/wm_soak.py --width 16 256 1024 --rounds 2000 --eval-ms 50

Each width is one run of the toy task (tests/data) in its own run directory under --out (a fresh
temporary folder unless given), in a process of its own (so max RSS is that run's). The planner puts
--ideas new actions under the node each of its calls is about; the coder answers every call with a
kernel no other call got; an evaluation sleeps --eval-ms and passes at a time drawn from the kernel's
id, with no limit on evaluations at once. Printed per width, as a Markdown row:

    rounds/s          rounds over the session's wall time (set-up and the baseline included)
    max RSS           the process's peak resident memory
    RSS at quarters   its resident memory when the run had taken a quarter, half, three quarters, all its rounds
    world-model time  the driver's time in world-model calls (the `run_end` event's wm_s)
    world-model files files under world_model/ and their size: one per version before the deltas
                      (issue 42); checkpoints and deltas.jsonl after
    run dir / round   the whole run directory's size over the rounds
    coder request     every 16th request to the coder, pickled as a Ray call would ship it: median and largest KB

It reads only what both layouts have, so the same script measures main and a branch:
`PYTHONPATH=<checkout> python experiments/wm_soak.py` measures that checkout's code.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pickle
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DATA = HERE.parent / "tests" / "data"


class InstantPlanner:
    """Puts `ideas` new actions under the node a call is about (the root for the first plan)."""

    def __init__(self, ideas: int):
        self.ideas = ideas
        self.calls = 0

    async def name(self) -> str:
        return "soak planner"

    async def plan(self, request: Any) -> Any:
        from ksearch_ray.policies.contract import PlanReply

        self.calls += 1
        parent = request.node_id or "root"
        return PlanReply(ops=[{"op": "insert", "parent": parent, "title": f"idea {self.calls}.{i}",
                               "description": "change the tiling of the inner loop " * 3, "difficulty": 1 + i % 3,
                               "score": 0.5, "expected_speedup": 1.1, "rationale": "fewer loads from memory " * 3}
                              for i in range(self.ideas)])

    async def code(self, request: Any) -> Any:
        raise AssertionError("the planner writes no code")

    def release(self) -> None:
        pass


class InstantCoder:
    """A kernel of its own for every call."""

    def __init__(self) -> None:
        self.calls = 0
        self.request_bytes: list[int] = []  # every 16th request, pickled (what a Ray call would ship)

    async def name(self) -> str:
        return "soak coder"

    async def plan(self, request: Any) -> Any:
        raise AssertionError("the coder makes no plans")

    async def code(self, request: Any) -> Any:
        from ksearch_ray.models import Solution
        from ksearch_ray.policies.contract import CodeReply

        self.calls += 1
        if self.calls % 16 == 0:
            self.request_bytes.append(len(pickle.dumps(request)))
        tag = f"k{self.calls}"
        return CodeReply(solution=Solution(
            name=tag, task="toy_axpy", language="python", entry_file="k.py", entry_point="run",
            sources={"k.py": f"# {tag}\ndef run(x, a, b):\n    return a * x + b\n"}))

    def release(self) -> None:
        pass


class SleepingEvaluators:
    """Every evaluation sleeps `seconds` and passes; any number at once."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.size = 1
        self.done = 0
        self.busy_s: dict[int, float] = {}
        self.in_flight: dict[int, tuple[str, float]] = {}

    async def describe_all(self) -> list[Any]:
        from ksearch_ray.evaluation.describe import EvaluatorInfo

        return [EvaluatorInfo(device="cpu", name="fake", hardware="a fake evaluator")]

    async def evaluate(self, solution: Any, workload_set: str, *, screen: bool = False) -> tuple[Any, int]:
        return await self.evaluate_on(0, solution, workload_set), 0

    async def evaluate_on(self, index: int, solution: Any, workload_set: str) -> Any:
        from ksearch_ray.models import EvalResult, Status, Timing, WorkloadResult

        await asyncio.sleep(self.seconds)
        self.done += 1
        self.busy_s[index] = self.busy_s.get(index, 0.0) + self.seconds
        ms = 1.0 if solution.name in ("good", "triton_seed") else 0.5 + (zlib.crc32(solution.id.encode()) % 1000) / 500
        timing = Timing(mean_ms=ms, median_ms=ms, min_ms=ms, std_ms=0.0, count=3, wall_median_ms=ms, clock="host_wall")
        return EvalResult(
            solution_id=solution.id, solution_name=solution.name, task=solution.task, status=Status.PASSED,
            workload_set="benchmarks", mode="fresh", device="cpu", device_name="fake", timed=True,
            workloads=[WorkloadResult(workload="w", status=Status.PASSED, timing=timing)], score=ms,
            score_kind="geomean of mean latency (ms)")

    async def retime_on(self, index: int, solution: Any, primary: Any) -> Any:
        from ksearch_ray.evaluation.retime import RetimeResult
        from ksearch_ray.models import Status

        return RetimeResult(agreed=True, status=Status.PASSED, message="")

    async def profile_on(self, index: int, solution: Any, measured: Any, timeout_s: float) -> Any:
        raise AssertionError("profiling is off")

    def release(self) -> None:
        pass


def one_run(run_dir: Path, width: int, rounds: int, eval_ms: float, ideas: int) -> dict[str, Any]:
    """One search in this process; its figures."""
    from ksearch_ray import session
    from ksearch_ray.config import validate_config
    from ksearch_ray.methods.registry import method_for
    from ksearch_ray.run.engine import Search
    from ksearch_ray.run.local import local_backends
    from ksearch_ray.run.progress import PlainLines
    from ksearch_ray.store import RunStore
    from ksearch_ray.taskspec.task import find_task

    # Screening off: every figure here is scripted, and the record's growth compares with the earlier soaks'.
    config = validate_config({"task": "toy_axpy", "task_dirs": [str(DATA)], "evaluation": {"device": "cpu", "screen": None},
                              "search": {"width": width, "noise_repeats": 1, "confirm_repeats": 0, "warmup": False},
                              "budget": {"rounds": rounds}})
    store = RunStore.create(run_dir, {"run_id": run_dir.name, "config": config.model_dump(mode="json")})
    task = find_task(config.task, config.task_dirs)
    coder = InstantCoder()
    backends = local_backends(config, task, store, planner=InstantPlanner(ideas), coder=coder,
                              evaluators=SleepingEvaluators(eval_ms / 1e3))
    search = Search(config, task, store, backends, method_for(config, store.load_solution))
    t0 = time.monotonic()
    rss_at: dict[int, float] = {}  # quarter of the rounds -> resident MB when the run reached it
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.2):
            for quarter in range(1, min(4, 4 * search.view.rounds_used // rounds) + 1):
                rss_at.setdefault(quarter, _rss_mb())

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    with open(os.devnull, "w") as devnull:
        try:
            session._run(search, PlainLines(devnull))
        finally:
            done.set()
            store.close()
    wall = time.monotonic() - t0
    watcher.join()
    rss_at.setdefault(4, _rss_mb())  # (the search, its view and world model are still alive here)
    with open(run_dir / "events.jsonl") as log:  # the last run_end, without holding the log (max RSS is the run's)
        end = [json.loads(line) for line in log if '"run_end"' in line][-1]
    wm_files = [p for p in (run_dir / "world_model").iterdir() if p.is_file()]
    all_bytes = sum(p.stat().st_size for p in run_dir.rglob("*") if p.is_file())
    return {
        "width": width, "rounds": end["rounds"], "wall_s": wall, "rounds_per_s": end["rounds"] / wall,
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "wm_s": end["wm_s"],
        "wm_files": len(wm_files), "wm_mb": sum(p.stat().st_size for p in wm_files) / 1e6,
        "events_mb": (run_dir / "events.jsonl").stat().st_size / 1e6, "run_dir_mb": all_bytes / 1e6,
        "run_dir_kb_per_round": all_bytes / 1e3 / max(end["rounds"], 1),
        "request_kb": (f"{statistics.median(coder.request_bytes) / 1e3:.0f} / {max(coder.request_bytes) / 1e3:.0f}"
                       if coder.request_bytes else "?"),
        "rss_quarters": " / ".join(f"{rss_at[q]:.0f}" if q in rss_at else "?" for q in range(1, 5)),
    }


def _rss_mb() -> float:
    """This process's resident memory now (Linux)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


ROW = ("| {width} | {rounds} | {rounds_per_s:.1f} | {max_rss_mb:.0f} MB | {rss_quarters} | {wm_s:.1f} s | {wm_files} | "
       "{wm_mb:.1f} | {events_mb:.1f} | {run_dir_mb:.1f} | {run_dir_kb_per_round:.1f} | {request_kb} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--width", type=int, nargs="+", default=[16])
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--eval-ms", type=float, default=50.0, help="how long each fake evaluation sleeps")
    parser.add_argument("--ideas", type=int, default=3, help="actions the planner adds per call")
    parser.add_argument("--out", type=Path, default=None, help="where the run directories go (default: a temporary folder)")
    parser.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)  # a child: one width, JSON out
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="wm_soak-"))
    if args.one is not None:
        print(json.dumps(one_run(out / f"w{args.one}", args.one, args.rounds, args.eval_ms, args.ideas)))
        return
    import ksearch_ray

    print(f"machine: {platform.node()} ({os.cpu_count()} CPUs), Python {platform.python_version()}, "
          f"ksearch_ray from {Path(ksearch_ray.__file__).parent}; run directories under {out}")
    print(f"{args.rounds} rounds, fake evaluations of {args.eval_ms:g} ms, {args.ideas} actions per plan")
    print("| width | rounds | rounds/s | max RSS | RSS MB at 1/4 / 1/2 / 3/4 / all rounds | world-model time | "
          "world-model files | world-model MB | events.jsonl MB | run dir MB | run dir KB / round | coder request KB median / max |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for width in args.width:
        child = subprocess.run([sys.executable, __file__, "--one", str(width), "--rounds", str(args.rounds),
                                "--eval-ms", str(args.eval_ms), "--ideas", str(args.ideas), "--out", str(out)],
                               capture_output=True, text=True, env={**os.environ, "RAY_AUTH_MODE": "disabled"})
        if child.returncode != 0:
            sys.exit(f"width {width} failed:\n{child.stderr[-3000:]}")
        print(ROW.format(**json.loads(child.stdout.strip().splitlines()[-1])), flush=True)


if __name__ == "__main__":
    main()
