"""What compiling Triton candidates on CPU build workers saves the GPU (issue 40), measured two ways.

`evals`: each solution's evaluation, side by side in one warm evaluator on the GPU, with its Triton
kernels compiled by the evaluation's own worker (`jit`: the solution's Triton cache emptied first, as
for a new candidate), loaded from a build made beforehand on this machine's CPUs (`built`), and built
with Triton's driver helper also compiled ahead by the evaluator (`helper`), in alternation,
`--repeats` times each. Per evaluation: seconds, seconds per stage, the timed share, the kernels
the GPU worker compiled, the C modules it compiled (each kernel signature's launcher and the driver
helper, built with gcc on the GPU's host inside the evaluation where they were not given, or given
but not loadable), and the judge's seconds on references and on comparisons (what the `judging`
stage waits for). The build's own seconds (CPU, off the GPU) are printed apart.

    python experiments/triton_builds.py evals --task trimul --solutions triton_seed,triton_fused --repeats 3 --out e.json

`builds`: seconds per new candidate's Triton build on this machine's CPUs, in one warm builder.

    python experiments/triton_builds.py builds --task trimul --solutions triton_seed,triton_fused --arch 9.0a

`search`: the figures of issue 40's goal from a run directory's own evaluation records: new
candidates, median GPU-busy seconds per new candidate (its evaluation's device seconds), candidates per
GPU-hour at that busy time, the share of the evaluator's busy time spent in timed kernels, the
kernels built ahead and compiled on the GPU worker, and a new candidate's median seconds per stage. Then
what a GPU-hour of the search's wall buys: from the first new candidate's start to the last one's end,
the evaluator's busy share (every measurement on it: baselines, the seed, re-measurements, re-timings)
and new candidates per hour; the idle gaps between measurements; and the time from the coder's answer to
its evaluation's start (its build, then its wait for the evaluator).

    python experiments/triton_builds.py search RUN_DIR [RUN_DIR ...]

`threads`: whether the compiles of different kernels overlap in threads (whether Triton lets go of the GIL while
it lowers and assembles): the kernels one call of a solution launches on its first small workload, compiled for
sm_90 on this machine's CPUs (as `compile_sm90.py` does) from a fresh Triton cache, one after another and in N
threads, alternating. A build compiles its kernels one after another (compiling them in threads ahead of the calls
was tried and removed: it did not pay on a GPU host's CPUs).

    python experiments/triton_builds.py threads --task trimul --solution triton_fused --threads 2 --repeats 2
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("jit", "built", "helper", "again")
"""jit: the worker compiles every kernel; built: they come from a build made beforehand on the CPUs; helper:
built, and Triton's driver helper compiled once by the evaluator too (evaluation.triton_helper_ahead); again:
the solution evaluated once more with its Triton cache as the evaluation before left it (what a repeated
candidate gets; it follows another variant, as in the default order)."""
sys.path.insert(0, str(ROOT))


def _row(variant: str, solution: str, result: Any) -> dict[str, Any]:
    return {"variant": variant, "solution": solution, "status": result.status.value, "seconds": round(result.seconds, 3),
            "stages": {k: round(v, 3) for k, v in result.stages.items()},
            "timed_share": round(result.timed_seconds / result.seconds, 4) if result.seconds else 0.0,
            "triton_prebuilt": result.triton_prebuilt, "triton_compiled": result.triton_compiled,
            "not_built": result.triton_not_built, "score": result.score}


def _files(cache: Path) -> dict[str, tuple[int, int]]:
    """Every file in a Triton cache: (inode, size) by relative path."""
    return {str(p.relative_to(cache)): (p.stat().st_ino, p.stat().st_size) for p in cache.rglob("*") if p.is_file()}


def _c_modules(files: dict[str, tuple[int, int]]) -> dict[str, int]:
    """Triton's C modules among a cache's `_files` (the kernels' launchers and the driver helper, `cuda_utils`),
    each with its inode: a module Triton could not load it builds again and puts in place of the old file."""
    return {path: inode for path, (inode, _) in files.items()
            if Path(path).name.startswith(("__triton_launcher.", "cuda_utils."))}


def evals(args: argparse.Namespace) -> None:
    import torch

    from ksearch_ray.evaluation.buildcache import BuildCache, BuildTarget
    from ksearch_ray.evaluation.builder import Builder
    from ksearch_ray.evaluation.evaluator import Evaluator
    from ksearch_ray.evaluation.sandbox.build import arch_for
    from ksearch_ray.evaluation.sandbox.isolation import Isolation
    from ksearch_ray.evaluation.tritoncache import unpack
    from ksearch_ray.taskspec.task import find_task

    device = args.device or ("cuda" if torch.cuda.is_available() else "")
    if not device:
        raise SystemExit("error: `evals` measures a GPU worker: no GPU is visible (--device cpu runs the plumbing alone)")
    task = find_task(args.task, args.task_dir)
    workload_set = args.workloads or ("benchmarks" if "benchmarks" in task.definition.workload_sets else "feedback")
    root = Path(tempfile.mkdtemp(prefix="triton-builds-"))
    isolation = Isolation(args.isolation)
    builder = Builder(root / "builder", BuildCache(root / "build-cache"), isolation=isolation)
    evaluator = Evaluator(device, root / "evaluator", isolation=isolation)
    target = BuildTarget(archs=(arch_for(*torch.cuda.get_device_capability()) if device == "cuda" else args.arch,))
    rows: list[dict[str, Any]] = []
    builds: dict[str, dict[str, Any]] = {}
    variants = args.variants.split(",")
    if unknown := set(variants) - set(VARIANTS):
        raise SystemExit(f"error: unknown variant(s) {', '.join(sorted(unknown))} (known: {', '.join(VARIANTS)})")
    if variants[0] == "again":
        raise SystemExit("error: `again` repeats the evaluation before it: it cannot come first")
    try:
        if device == "cuda":  # compiled once, as an evaluator with evaluation.triton_helper_ahead does at its start
            evaluator.triton_helper_ahead = True
            helper = evaluator.triton_helper()
            print(f"Triton's driver helper compiled ahead: {len(helper) if helper else 'failed'} bytes", flush=True)
        trace: list[tuple[float, str]] = []
        t0 = time.monotonic()
        baseline = evaluator.evaluate(task, task.baseline(), workload_set=workload_set,  # as a search starts
                                      progress=lambda m: trace.append((round(time.monotonic() - t0, 3), m)))
        print(f"baseline {baseline.status.value} {baseline.seconds:.2f} s, stages {dict((k, round(v, 3)) for k, v in baseline.stages.items())}, trace {trace}", flush=True)
        for name in args.solutions.split(","):
            solution = task.solution(name)
            t0 = time.monotonic()
            record, pack = builder.build_triton(solution, target, task, workload_set)
            builds[name] = {"status": record.status.value, "seconds": round(time.monotonic() - t0, 2),
                            "kernels": record.kernels, "not_built": record.not_built, "bytes": record.size,
                            "message": record.message}
            print(f"{name}: build {builds[name]}", flush=True)
            if not record.passed or pack is None:
                continue
            for _ in range(args.repeats):
                for variant in variants:
                    if variant != "again":
                        shutil.rmtree(evaluator.work_root / "cache" / solution.id, ignore_errors=True)  # a new candidate's
                    evaluator.triton_helper_ahead = device == "cuda" and variant in ("helper", "again")
                    judged = evaluator.judge.reference_s, evaluator.judge.compare_s, evaluator.judge.misses
                    cache = evaluator._triton_cache_dir(solution)
                    # What the evaluation unpacks, unpacked here first (it keeps files already there), so that
                    # a C module the worker builds again shows as a new file in place of the one given.
                    for given in ((pack if variant not in ("jit", "again") else None), evaluator.triton_helper()):
                        if given:
                            unpack(given, cache)
                    files_before = _files(cache)
                    before = _c_modules(files_before)
                    trace: list[tuple[float, str]] = []
                    t0 = time.monotonic()
                    result = evaluator.evaluate(task, solution, workload_set=workload_set,
                                                prebuilt=(record, pack) if variant in ("built", "helper") else None,
                                                progress=lambda m, t=trace, s=t0: t.append((round(time.monotonic() - s, 3), m)))
                    rows.append(_row(variant, name, result))
                    files_after = _files(cache)
                    after = _c_modules(files_after)
                    rows[-1]["c_modules_given"] = len(before)
                    rows[-1]["c_modules_compiled"] = sum(1 for path, inode in after.items() if before.get(path) != inode)
                    rows[-1]["trace"] = trace  # seconds from the call to evaluate(), per progress line
                    rows[-1]["cache_files_given"] = len(files_before)
                    rows[-1]["cache_files_added"] = sorted(set(files_after) - set(files_before))
                    rows[-1]["cache_files_changed"] = sorted(f for f in files_before
                                                             if f in files_after and files_after[f] != files_before[f])
                    rows[-1]["judge_reference_s"] = round(evaluator.judge.reference_s - judged[0], 3)
                    rows[-1]["judge_compare_s"] = round(evaluator.judge.compare_s - judged[1], 3)
                    rows[-1]["judge_references_computed"] = evaluator.judge.misses - judged[2]
                    print(json.dumps(rows[-1]), flush=True)
    finally:
        evaluator.close()
        builder.close()
        shutil.rmtree(root, ignore_errors=True)
    print(f"\n{'solution':<14} {'variant':<6} {'seconds':>8} {'start':>6} {'correct':>8} {'judging':>8} "
          f"{'timing':>7} {'judged':>7} {'timed%':>7} {'compiled':>8} {'C mods':>6} {'ref s':>6} {'refs':>4} {'cmp s':>6}")
    for name in builds:
        for variant in variants:
            mine = [r for r in rows if r["solution"] == name and r["variant"] == variant]
            if not mine:
                continue

            def med(key: str, rows: list[dict[str, Any]] = mine) -> float:
                return statistics.median(r["stages"].get(key, 0.0) for r in rows)

            print(f"{name:<14} {variant:<6} {statistics.median(r['seconds'] for r in mine):>8.2f} {med('start'):>6.2f} "
                  f"{med('correctness'):>8.2f} {med('judging'):>8.2f} {med('timing'):>7.2f} {med('judging_timed'):>7.2f} "
                  f"{100 * statistics.median(r['timed_share'] for r in mine):>6.1f}% "
                  f"{statistics.median(r['triton_compiled'] or 0 for r in mine):>8.0f} "
                  f"{statistics.median(r['c_modules_compiled'] for r in mine):>6.0f} "
                  f"{statistics.median(r['judge_reference_s'] for r in mine):>6.3f} "
                  f"{statistics.median(r['judge_references_computed'] for r in mine):>4.0f} "
                  f"{statistics.median(r['judge_compare_s'] for r in mine):>6.3f}")
    if args.out:
        Path(args.out).write_text(json.dumps({"task": task.name, "workload_set": workload_set, "builds": builds,
                                              "rows": rows, "device": torch.cuda.get_device_name() if device == "cuda" else "cpu"},
                                             indent=1))


def builds(args: argparse.Namespace) -> None:
    """Each solution's Triton build for `--arch` on this machine's CPUs, one after another in one warm Builder
    (its zygote started by a first, throwaway build), as a build task sees them: seconds per new candidate."""
    from ksearch_ray.evaluation.buildcache import BuildCache, BuildTarget
    from ksearch_ray.evaluation.builder import Builder
    from ksearch_ray.evaluation.sandbox.protocol import GpuFacts
    from ksearch_ray.models import Solution
    from ksearch_ray.taskspec.task import find_task

    task = find_task(args.task, args.task_dir)
    workload_set = args.workloads or ("benchmarks" if "benchmarks" in task.definition.workload_sets else "feedback")
    root = Path(tempfile.mkdtemp(prefix="triton-builds-"))
    builder = Builder(root / "builder", BuildCache(root / "build-cache"))
    name, _, sms = args.gpu.rpartition(":")
    major, _, minor = args.arch.rstrip("a").partition(".")
    gpu = GpuFacts(name=name, major=int(major), minor=int(minor or 0), multi_processor_count=int(sms),
                   total_memory=0) if args.gpu else None
    target = BuildTarget(archs=(args.arch,))
    try:
        names = args.solutions.split(",")
        first = task.solution(names[0])
        throwaway = Solution(**{**first.model_dump(), "sources": {
            **first.sources, first.entry_file: first.sources[first.entry_file] + "\n# warm-up build\n"}})
        t0 = time.monotonic()
        builder.build_triton(throwaway, target, task, workload_set, gpu)
        print(f"zygote start and a first build: {time.monotonic() - t0:.2f} s")
        for name in names:
            for _ in range(args.repeats):
                solution = task.solution(name)
                fresh = Solution(**{**solution.model_dump(), "sources": {  # a new candidate each time: no cache hit
                    **solution.sources, solution.entry_file: solution.sources[solution.entry_file] + f"\n# {time.time_ns()}\n"}})
                t0 = time.monotonic()
                record, _ = builder.build_triton(fresh, target, task, workload_set, gpu)
                print(f"{name}: {record.status.value} in {time.monotonic() - t0:.2f} s, {record.kernels} kernels for "
                      f"{len(task.workloads(workload_set, 'cuda'))} workloads, {record.size} bytes, not built: "
                      f"{record.not_built or 'none'}", flush=True)
    finally:
        builder.close()
        shutil.rmtree(root, ignore_errors=True)


def threads(args: argparse.Namespace) -> None:
    import os
    from concurrent.futures import ThreadPoolExecutor

    sys.path.insert(0, str(ROOT / "experiments"))
    from compile_sm90 import _stand_in_driver, as_on_a_gpu, entry_and_inputs
    from triton.runtime.jit import JITFunction

    from ksearch_ray.taskspec.task import find_task

    if os.environ.get("TRITON_INTERPRET"):
        raise SystemExit("error: TRITON_INTERPRET is set: unset it, the interpreter compiles nothing")
    task = find_task(args.task, args.task_dir)
    solution = task.solution(args.solution)
    _stand_in_driver()
    launches: list[tuple[Any, tuple, Any, dict[str, Any]]] = []
    run = JITFunction.run

    def record(fn: Any, *a: Any, grid: Any, warmup: bool, **kw: Any) -> Any:
        a, kw = as_on_a_gpu(fn, a, kw)
        launches.append((fn, a, grid, kw))
        return run(fn, *a, grid=grid, warmup=True, **kw)

    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton-threads-cache-")
    JITFunction.run = record  # type: ignore[method-assign]
    try:
        task.call(*entry_and_inputs(task, solution, {}))
    finally:
        JITFunction.run = run  # type: ignore[method-assign]
    print(f"{solution.name}: {len(launches)} launches of {len({id(fn) for fn, *_ in launches})} kernels in one call")

    def compile_all(workers: int) -> float:
        os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton-threads-cache-")
        for fn, *_ in launches:  # and nothing compiled kept in memory
            for cache in getattr(fn, "device_caches", {}).values():
                cache[0].clear()
        t0 = time.perf_counter()
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(lambda launch: run(launch[0], *launch[1], grid=launch[2], warmup=True, **launch[3]), launches))
        return time.perf_counter() - t0

    for _ in range(args.repeats):
        for workers in (1, args.threads):
            print(f"  {workers} thread(s): {compile_all(workers):.2f} s", flush=True)


def _device_seconds(result: Any) -> float:
    """An evaluation's seconds on the device: overlapping ones (evaluation.overlap) count once; older records have
    seconds only."""
    return result.device_seconds if result.device_seconds is not None else result.seconds


def _held_evaluator(event: Any) -> tuple[float, float, float] | None:
    """(start, end, device seconds) of the time `event` held an evaluator: any measurement (a new candidate's, a
    baseline's, the seed's, a re-measurement) or a new best's re-timing; None for anything else, and for a builder's
    verdict (evaluator -1)."""
    from ksearch_ray.events import Retime
    from ksearch_ray.models import EvalResult

    evaluator = getattr(event, "evaluator", None)
    if isinstance(evaluator, int) and evaluator < 0:
        return None
    if isinstance(event, Retime):
        return None if event.seconds is None else (event.t - event.seconds, event.t, event.seconds)
    result = getattr(event, "result", None)
    if not isinstance(result, EvalResult):
        return None
    return event.t - result.seconds, event.t, _device_seconds(result)


def _covered(start: float, end: float, intervals: list[tuple[float, float]]) -> float:
    """Seconds of [start, end) inside the union of `intervals`."""
    total, reach = 0.0, start
    for a, b in sorted((max(start, a), min(end, b)) for a, b in intervals if a < end and b > start):
        a = max(a, reach)
        if b > a:
            total, reach = total + b - a, b
    return total


def search(args: argparse.Namespace) -> None:
    from ksearch_ray.events import Baseline, Candidate, Evaluation, Seed, Tune
    from ksearch_ray.store import RunStore

    missing = [d for d in args.run_dirs if not (Path(d) / "events.jsonl").is_file()]
    if missing:
        raise SystemExit(f"error: {', '.join(missing)}: not a run directory (no events.jsonl)")
    empty = 0
    for run_dir in args.run_dirs:
        events = RunStore(run_dir).read_events()
        seen: set[str] = set()
        busy: list[float] = []
        stages: dict[str, list[float]] = {}
        total = timed = 0.0
        prebuilt = compiled = 0
        spans: list[tuple[float, float, float]] = []  # each measurement on the evaluator: (start, end, device seconds)
        first = last = None  # the first new candidate's start, the last one's end
        written: dict[str, float] = {}  # when the coder's answer came, per solution
        lags: list[float] = []  # from then to its evaluation's start: its build, then its wait for the evaluator
        pending: list[tuple[float, float]] = []  # (answer, evaluation start) of each new candidate
        tuned = 0  # variants measured by an evaluator that would have idled (search.tune_when_idle)
        baselined: float | None = None  # when the session's last baseline measurement ended
        seeded: tuple[float, float] | None = None  # the seed's evaluation: (start, end)
        for event in events:
            if isinstance(event, Baseline) and seeded is None:
                baselined = event.t
            if isinstance(event, Seed) and event.result is not None and seeded is None:
                seeded = (event.t - event.result.seconds, event.t)
            if isinstance(event, Candidate) and event.solution_id:
                written.setdefault(event.solution_id, event.t)
            tuned += isinstance(event, Tune) and event.idle
            span = _held_evaluator(event)
            if span is not None:
                spans.append(span)
            if not isinstance(event, Evaluation):
                continue
            result = event.result
            held = _device_seconds(result)
            total += held
            timed += result.timed_seconds
            if event.solution_id in seen or event.evaluator < 0:  # a re-measurement, or a builder's verdict
                continue
            seen.add(event.solution_id)
            if event.solution_id in written:
                lags.append(event.t - result.seconds - written[event.solution_id])
                pending.append((written[event.solution_id], event.t - result.seconds))
            first = event.t - result.seconds if first is None else min(first, event.t - result.seconds)
            last = event.t if last is None else max(last, event.t)
            busy.append(held)
            for stage, seconds in result.stages.items():
                stages.setdefault(stage, []).append(seconds)
            prebuilt += result.triton_prebuilt or 0
            compiled += result.triton_compiled or 0
        if not busy:
            print(f"{run_dir}: no evaluation of a new candidate")
            empty += 1
            continue
        median = statistics.median(busy)
        print(f"{run_dir}: {len(busy)} new candidates; median busy {median:.2f} s (mean {statistics.mean(busy):.2f} s); "
              f"{3600 / statistics.mean(busy):.0f} candidates per GPU-hour at the mean; kernels timed "
              f"{100 * timed / total:.1f} % of {total:.1f} s busy; Triton kernels built ahead {prebuilt}, "
              f"compiled on the GPU worker {compiled}")
        if first is not None and last is not None and last > first:
            # How busy the evaluator was while the search made candidates (every measurement on it counted): what a
            # GPU-hour of the search's wall buys.
            span = last - first
            inside = sum(held for start, end, held in spans if start >= first - 1e-6 and end <= last + 1e-6)
            print(f"  from the first new candidate's start to the last one's end: {span:.1f} s, evaluator busy "
                  f"{100 * inside / span:.1f} % of it, {3600 * len(busy) / span:.0f} new candidates per hour of it"
                  + (f"; besides them, {tuned} idle-tuning variants measured in the run" if tuned else ""))
            # Idle gaps on the evaluator (one evaluator): from one measurement's end to the next one's start.
            ordered = sorted((start, end) for start, end, _ in spans if start >= first - 1e-6 and end <= last + 1e-6)
            gaps = [b[0] - a_end for a_end, b in zip(itertools.accumulate((e for _, e in ordered), max), ordered[1:], strict=False)]
            idle = [g for g in gaps if g > 0]
            if idle:
                print(f"  idle gaps between measurements: {len(idle)} of {len(gaps)}, median {statistics.median(idle):.2f} s, "
                      f"longest {max(idle):.2f} s, {sum(idle):.1f} s in all")
                # What each idle second waited for: a candidate whose code had come and that had not started (its
                # build, or the dispatch to the evaluator), or nothing at all (planner, coder or world model).
                ends = list(itertools.accumulate((e for _, e in ordered), max))
                waiting = nothing = 0.0
                for a_end, (b_start, _) in zip(ends, ordered[1:], strict=False):
                    if b_start > a_end:
                        held_up = _covered(a_end, b_start, pending)
                        waiting, nothing = waiting + held_up, nothing + (b_start - a_end - held_up)
                print(f"  of the idle time, {waiting:.1f} s had a written candidate waiting to start (its build), "
                      f"{nothing:.1f} s had none (the planner, the coder or the world model)")
        if baselined is not None and seeded is not None and events:
            # The session's start: the seed's build either waited for the baselines or ran beside them (cluster.build_ahead).
            began = events[0].t
            print(f"  the session's start: baselines measured by {baselined - began:.1f} s, the seed's evaluation from "
                  f"{seeded[0] - began:.1f} s to {seeded[1] - began:.1f} s ({seeded[0] - baselined:.1f} s after the baselines)")
        if lags:
            print(f"  from the coder's answer to its evaluation's start (its build, then the wait for the evaluator): "
                  f"median {statistics.median(lags):.2f} s, longest {max(lags):.2f} s")
        print("  a new candidate's stages, medians (s): " + ", ".join(
            f"{stage} {statistics.median(values):.2f}" for stage, values in stages.items()))
    if empty:
        raise SystemExit(f"error: {empty} run(s) evaluated no new candidate: no figures for them")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    e = sub.add_parser("evals", help="JIT against built-ahead evaluations, side by side (GPU).")
    e.add_argument("--task", default="trimul")
    e.add_argument("--task-dir", action="append", default=[], help="Extra directory of task bundles.")
    e.add_argument("--device", default="", choices=["", "cuda", "cpu"],
                   help="cpu: the plumbing alone (the interpreter compiles nothing), built for --arch.")
    e.add_argument("--arch", default="9.0a", help="With --device cpu: the GPU architecture to build for.")
    e.add_argument("--solutions", default="triton_seed,triton_fused")
    e.add_argument("--workloads", default="", help="Workload set (default: benchmarks, else feedback).")
    e.add_argument("--repeats", type=int, default=3)
    e.add_argument("--variants", default="jit,built,helper", help=f"in this order, each repeat (of {', '.join(VARIANTS)})")
    e.add_argument("--isolation", default="best-effort", choices=["require", "best-effort", "off"])
    e.add_argument("--out", default="")
    b = sub.add_parser("builds", help="Seconds per new candidate's Triton build on this machine's CPUs.")
    b.add_argument("--task", default="trimul")
    b.add_argument("--task-dir", action="append", default=[])
    b.add_argument("--solutions", default="triton_seed,triton_fused")
    b.add_argument("--workloads", default="")
    b.add_argument("--arch", default="9.0a")
    b.add_argument("--repeats", type=int, default=2)
    b.add_argument("--gpu", default="NVIDIA H200:132", help="NAME:SMS the build tells host code ('' for nothing), "
                   "as a pool of evaluators of one GPU kind does.")
    s = sub.add_parser("search", help="Issue 40's figures from run directories' evaluation records.")
    s.add_argument("run_dirs", nargs="+")
    t = sub.add_parser("threads", help="One call's kernels compiled for sm_90 one after another and in threads (CPU).")
    t.add_argument("--task", default="trimul")
    t.add_argument("--task-dir", action="append", default=[])
    t.add_argument("--solution", default="triton_fused")
    t.add_argument("--threads", type=int, default=2)
    t.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    from ksearch_ray.taskspec.spec import TaskError

    try:
        {"evals": evals, "builds": builds, "search": search, "threads": threads}[args.command](args)
    except TaskError as exc:  # a task or solution name that is not there: one line
        raise SystemExit(f"error: {exc}") from None


if __name__ == "__main__":
    main()
