"""TriMul kernels side by side on one GPU (issue 21): correctness and timing in one evaluator, a
per-kernel breakdown, and a coordinate sweep of a solution's tunables.

    python experiments/trimul_kernels.py eval --solutions triton_fused,triton_seed,baseline \
        --sets tests:fresh,benchmarks:fresh,benchmarks:reuse --out eval.json
    python experiments/trimul_kernels.py profile --solution triton_fused --out profile.json
    python experiments/trimul_kernels.py sweep --solution triton_fused --out sweep.json \
        --group "PROJ_BLOCK_M=64,128;PROJ_BLOCK_K=32,64" --group "BLOCK_N=64,128,256"
    ncu -k regex:_project_kernel -c 1 python experiments/trimul_kernels.py once \
        --workload N1024_B1_D384_normal_nomask_s23291

`eval` runs every solution through one `Evaluator` (the sandbox, `--isolation`, the task's
tolerance and timing rules), so the scores are comparable as ratios. `profile` and `sweep` run the
project's own kernels in this process (trusted code, never an LLM's): `profile` lists each CUDA
kernel's share of a call (torch.profiler) on the benchmark workloads; `sweep` measures a
solution's whole call as a CUDA graph (triton.testing.do_bench_cudagraph, the inputs of each
benchmark workload) for each value of each group's tunables in turn, keeping the best of each
group for the next (coordinate descent over groups: each group is one kernel's tunables), and
prints the geomean. Sweep figures guide tuning only; the evaluator's figures are the results.
`once` calls a solution on one workload and does nothing else, for a profiler such as `ncu`.
`host` measures each solution's host work per call (issue 44): the call's seconds on the host, the
call as GPUMode times it, and a cProfile of where the host's time goes:

    python experiments/trimul_kernels.py host --out host.json \
        --solutions triton_fused,triton_fused:DIRECT_LAUNCH=false,.external/triton_fused_before.py
A solution is named, a file, or `name:TUNABLE=value,...` (the named solution with tunables set; in a
list of solutions, separate the tunables with `;`: `triton_fused:PROJ_BLOCK_M=256;PROJ_WARPS=8`).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from tunable_sweep import coordinate_sweep

from ksearch_ray.taskspec.task import find_task, load_module_file, solution_from_file
from ksearch_ray.taskspec.tunables import declared_tunables, with_values


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def cmd_eval(args: argparse.Namespace) -> dict[str, Any]:
    from ksearch_ray.evaluation.evaluator import Evaluator
    from ksearch_ray.evaluation.sandbox.isolation import Isolation

    task = find_task("trimul")
    names = args.solutions.split(",")
    out: dict[str, Any] = {}
    with Evaluator(args.device, isolation=Isolation(args.isolation)) as ev:
        ev.evaluate(task, task.baseline(), workload_set="smoke")  # the evaluator learns the task's stage times
        for spec in args.sets.split(","):
            workload_set, mode = spec.split(":")
            for name in names:
                t0 = time.monotonic()
                solution = _solution(task, name)
                r = ev.evaluate(task, solution, workload_set=workload_set, mode=mode)
                row = {"status": r.status.value, "score": r.score, "seconds": round(time.monotonic() - t0, 2),
                       "message": r.message[:400],
                       "kernel_geomean_ms": _geomean_of([w.kernel_ms for w in r.workloads]),
                       "call_geomean_ms": _geomean_of([w.call_ms for w in r.workloads]),
                       "workloads": {w.workload: {"status": w.status.value,
                                                  "mean_ms": w.timing.mean_ms if w.timing else None,
                                                  "kernel_ms": w.kernel_ms, "call_ms": w.call_ms,
                                                  "max_abs_err": w.max_abs_error, "max_rel_err": w.max_rel_error}
                                     for w in r.workloads}}
                out[f"{workload_set}:{mode}/{name}"] = row
                print(f"{workload_set}:{mode} {name}: {row['status']} score {row['score']} ({row['seconds']} s) "
                      f"geomean kernel {row['kernel_geomean_ms']} ms, call {row['call_geomean_ms']} ms "
                      f"{row['message'][:200]}", flush=True)
            first = out.get(f"{workload_set}:{mode}/{names[0]}", {}).get("score")
            for name in names[1:]:
                other = out.get(f"{workload_set}:{mode}/{name}", {}).get("score")
                if first and other:
                    print(f"  {workload_set}:{mode} {name} / {names[0]} = {other / first:.3f}x", flush=True)
    return out


def _solution(task: Any, name: str) -> Any:
    """A solution by name, a solution file, or `name:K=V,K=V` (the named solution with tunables set;
    `;` separates them too, for a list of solutions that is itself comma-separated)."""
    if ":" in name:
        base, _, sets = name.partition(":")
        values = {k: json.loads(v) for k, v in (kv.split("=", 1) for kv in sets.replace(";", ",").split(","))}
        path = Path(tempfile.mkdtemp()) / "submission.py"
        path.write_text(with_values(task.solution(base), values)[task.solution(base).entry_file])
        return solution_from_file(path, task)
    return solution_from_file(Path(name), task) if name.endswith(".py") else task.solution(name)


def _geomean_of(values: list[float | None]) -> float | None:
    return round(_geomean([v for v in values if v]), 4) if values and all(values) else None


def _inputs(task: Any, workload_set: str, device: str, only: str = "") -> list[tuple[str, tuple]]:
    """The GPUMode `data` of each workload of the set (of the one named `only`, if given)."""
    ref = load_module_file(task.root / "reference.py", "trimul_reference")
    sets = []
    for i, w in enumerate(task.workloads(workload_set, device)):
        if not only or w.name == only:
            sets.append((w.name, ref.pack_data(ref.generate_inputs(w, 1000 + i, device))))
    if not sets:
        raise SystemExit(f"no workload {only!r} in the set {workload_set}")
    return sets


def _module(solution: Any, values: dict[str, Any], tmp: Path) -> Any:
    sources = with_values(solution, values)
    tag = abs(hash(json.dumps(values, sort_keys=True)))
    path = tmp / f"variant_{tag}.py"
    path.write_text(sources[solution.entry_file])
    return load_module_file(path, path.stem)


def _solution_module(task: Any, solution: str, name: str) -> Any:
    """A solution of the task by name, or a solution file (such as a sweep's best); `name:K=V,K=V`
    is the task's solution `name` with those tunables set."""
    if ":" in solution:
        sol = _solution(task, solution)
        path = Path(tempfile.mkdtemp()) / f"{name}.py"
        path.write_text(sol.sources[sol.entry_file])
        return load_module_file(path, name)
    path = Path(solution) if solution.endswith(".py") else task.root / "solutions" / solution / "submission.py"
    return load_module_file(path, name)


def cmd_host(args: argparse.Namespace) -> dict[str, Any]:
    """Each solution's host work per call, side by side: the call's own seconds on the host (it
    returns once its kernels are queued; the GPU is idle before each call), the call as GPUMode
    times it (CUDA events around one call after a synchronize), and, on the first workload, where
    the host's time goes (cProfile, the functions with most time of their own)."""
    import cProfile
    import pstats
    import statistics

    task = find_task("trimul")
    inputs = _inputs(task, args.workloads, args.device)
    out: dict[str, Any] = {}
    for spec in args.solutions.split(","):
        mod = _solution_module(task, spec, "host_" + str(abs(hash(spec))))
        rows: dict[str, Any] = {}
        for i, (name, data) in enumerate(inputs):
            for _ in range(3):
                mod.custom_kernel(data)
            host, call = [], []
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            for _ in range(args.calls):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                mod.custom_kernel(data)
                host.append((time.perf_counter() - t0) * 1e6)
                torch.cuda.synchronize()
                start.record()
                mod.custom_kernel(data)
                end.record()
                torch.cuda.synchronize()
                call.append(start.elapsed_time(end))
            rows[name] = {"host_us": round(statistics.median(host), 1), "call_ms": round(statistics.median(call), 4)}
            if i == 0:
                prof = cProfile.Profile()
                prof.enable()
                for _ in range(args.calls):
                    mod.custom_kernel(data)
                prof.disable()
                torch.cuda.synchronize()
                stats = pstats.Stats(prof).sort_stats("tottime")
                top = [(f"{fn[0].rsplit('/', 1)[-1]}:{fn[1]}({fn[2]})", round(st[2] / args.calls * 1e6, 1))
                       for fn, st in sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:args.top]]  # type: ignore[attr-defined]
                rows[name]["profile_us_per_call"] = top
        out[spec] = rows
        print(f"{spec}: " + "; ".join(f"{k} host {v['host_us']} us, call {v['call_ms']} ms" for k, v in rows.items()),
              flush=True)
        first = rows[inputs[0][0]]
        print("  own time per call (cProfile): " + ", ".join(f"{f} {t}" for f, t in first["profile_us_per_call"]),
              flush=True)
        print(f"  geomean call {_geomean([v['call_ms'] for v in rows.values()]):.4f} ms, "
              f"median host {statistics.median(v['host_us'] for v in rows.values()):.1f} us", flush=True)
    return out


def cmd_profile(args: argparse.Namespace) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile

    task = find_task("trimul")
    mod = _solution_module(task, args.solution, "profiled")
    out: dict[str, Any] = {}
    for name, data in _inputs(task, args.workloads, args.device):
        for _ in range(3):
            mod.custom_kernel(data)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                mod.custom_kernel(data)
            torch.cuda.synchronize()
        kernels: dict[str, float] = {}
        for e in prof.key_averages():
            t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
            if t:
                kernels[e.key[:60]] = kernels.get(e.key[:60], 0.0) + t / 10 / 1e3  # ms per call
        total = sum(kernels.values())
        out[name] = {"total_ms": total, "kernels_ms": dict(sorted(kernels.items(), key=lambda kv: -kv[1]))}
        print(f"{name}: {total:.4f} ms of kernels per call: " +
              ", ".join(f"{k} {v:.4f}" for k, v in list(out[name]["kernels_ms"].items())[:6]), flush=True)
        del data
    return out


def cmd_once(args: argparse.Namespace) -> dict[str, Any]:
    """A few calls of the solution on one workload and nothing else, for `ncu` to profile."""
    task = find_task("trimul")
    mod = _solution_module(task, args.solution, "once")
    [(name, data)] = _inputs(task, args.workloads, args.device, only=args.workload)
    for _ in range(args.calls):
        mod.custom_kernel(data)
    if args.device == "cuda":
        torch.cuda.synchronize()
    return {"workload": name, "calls": args.calls}


def cmd_sweep(args: argparse.Namespace) -> dict[str, Any]:
    import triton.testing

    task = find_task("trimul")
    solution = task.solution(args.solution)
    declared = declared_tunables(solution)
    best = {k: t.value for k, t in declared.items()}
    inputs = _inputs(task, args.workloads, args.device)
    tmp = Path(tempfile.mkdtemp())

    def measure(values: dict[str, Any]) -> float | None:
        try:
            mod = _module(solution, values, tmp)
            times = []
            for _, data in inputs:
                def call(data: tuple = data) -> Any:
                    return mod.custom_kernel(data)
                call()
                times.append(triton.testing.do_bench_cudagraph(call, rep=args.rep_ms))
            return _geomean(times)
        except Exception as exc:  # a config that does not compile or fit: skipped, and said
            # The last line of a compiler error says what went wrong; its first lines are source.
            print(f"  {values}: failed: {type(exc).__name__}: {str(exc).strip().splitlines()[-1][:240]}", flush=True)
            return None

    result = coordinate_sweep(args.group, best, measure)
    if args.best_out:  # the best combination as a source file, for `eval` to judge
        Path(args.best_out).write_text(with_values(solution, result["best"])[solution.entry_file])
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("eval", "profile", "sweep", "once", "host"):
        p = sub.add_parser(name)
        p.add_argument("--out", required=name != "once")
        p.add_argument("--device", default="cuda")
    sub.choices["eval"].add_argument("--solutions", default="triton_fused,triton_seed,baseline")
    sub.choices["eval"].add_argument("--sets", default="tests:fresh,benchmarks:fresh")
    sub.choices["eval"].add_argument("--isolation", default="require")
    sub.choices["host"].add_argument("--solutions", default="triton_fused",
                                     help="Names, files, or name:TUNABLE=value,... (comma-separated).")
    sub.choices["host"].add_argument("--workloads", default="benchmarks")
    sub.choices["host"].add_argument("--calls", type=int, default=50)
    sub.choices["host"].add_argument("--top", type=int, default=14)
    for name in ("profile", "sweep", "once"):
        sub.choices[name].add_argument("--solution", default="triton_fused",
                                       help="A solution's name, or (profile, once) a solution file.")
        sub.choices[name].add_argument("--workloads", default="benchmarks")
    sub.choices["once"].add_argument("--workload", required=True, help="The one workload to call the solution on.")
    sub.choices["once"].add_argument("--calls", type=int, default=2)
    sub.choices["sweep"].add_argument("--group", action="append", default=[])
    sub.choices["sweep"].add_argument("--rep-ms", type=int, default=40)
    sub.choices["sweep"].add_argument("--best-out", default="", help="Write the best combination's source here.")
    args = ap.parse_args()
    info = {"argv": sys.argv, "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
            "torch": torch.__version__}
    result = {"eval": cmd_eval, "profile": cmd_profile, "sweep": cmd_sweep, "once": cmd_once,
              "host": cmd_host}[args.cmd](args)
    if args.out:
        Path(args.out).write_text(json.dumps({"info": info, "result": result}, indent=1, default=str))


if __name__ == "__main__":
    main()
