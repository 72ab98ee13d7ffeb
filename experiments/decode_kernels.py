"""Paged attention kernels side by side on one GPU: GQA decode (issue 22), MLA decode (issue 23) and
MLA prefill (issue 24); and the FP8 MoE (issue 25), whose grouped kernel the same commands judge.

The evaluator's verdicts and timings, achieved bandwidth per workload against a measured peak, and
a sweep of a Triton solution's tunables:

    python experiments/decode_kernels.py peak --out peak.json
    python experiments/decode_kernels.py eval --solutions triton_splitkv,triton_seed,flashinfer_kernel \
        --sets feedback:fresh,all:fresh,feedback:reuse,all:reuse --peak peak.json --out eval.json
    python experiments/decode_kernels.py sweep --solution triton_splitkv --out sweep.json --best-out best.py \
        --group "BLOCK_KV=16,32,64;NUM_STAGES=2,3,5" --group "PROGRAMS_PER_SM=2,4,8,16;MIN_PIECE_TILES=1,2,4"
    python experiments/decode_kernels.py graphs --solutions triton_splitkv,triton_seed,flashinfer_kernel \
        --out graphs.json
    ncu -k regex:_split_kernel -c 4 python experiments/decode_kernels.py once --solution triton_splitkv \
        --workload 06b8480d

The task is GQA's unless `--task mla_decode`, `--task mla_prefill` or `--task moe` comes first (`decode_kernels.py
--task mla_decode eval ...`); the solution defaults (`triton_splitkv`, for MLA prefill `triton_flash`, for the
MoE `triton_grouped`) follow it. The MoE's cost formula leaves out the expert weights (routing decides how
many are read), so its TB/s column is a lower bound of the traffic, not the traffic.
`eval` runs every solution through one `Evaluator` with `--isolation` (default: require), the task's
tolerance, timing rules and fresh page tables, so the latencies are comparable as ratios; a
solution is a name of the task's (`flashinfer_kernel`: the library's kernel, its plan() untimed) or
a .py file of a Triton solution's source (such as a sweep's best). It prints, per set and mode,
each solution's geomean latency and its FlashInfer-Bench score against the last solution named
(the mean over workloads of that solution's latency / this one's), then per workload the bytes a
call must move (the task's cost formula: the KV cache rows of every token, q, output, lse) over the mean
latency, against the peak `peak` measured. `peak` times a read (a sum) and a copy of 2 GiB with
CUDA events. `sweep` runs a solution's own kernels in this process (trusted code, never an LLM's):
coordinate descent over groups of tunables, each variant timed as a CUDA-graph replay of the whole
call after an L2 flush, on every workload of `--workloads` for `--seeds` input sets each (different
page tables and length splits), and checked against the reference; sweep figures guide tuning,
the evaluator's figures are the results. `graphs` times every solution named the same way in this
process (trusted code only), a CUDA-graph replay after an L2 flush with a solution's per-input setup
run before the capture: kernel against kernel, as the evaluator now times a prepared baseline too,
for any variant's source, such as a library wrapper with other settings. `once` calls a solution on one workload and does nothing
else, for a profiler such as `ncu`. `host` gives each solution's host work per call (the host's
microseconds, the call figure, and a cProfile of the first workload), side by side:

    python experiments/decode_kernels.py --task mla_decode host --solutions triton_splitkv,flashinfer_kernel \
        --workloads feedback --out host.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from tunable_sweep import coordinate_sweep

from ksearch_ray.evaluation.compare import compare_outputs
from ksearch_ray.models import Solution
from ksearch_ray.taskspec.task import Task, find_task, load_module_file
from ksearch_ray.taskspec.tunables import declared_tunables, with_values

TASKS = {"gqa": "gqa_paged_decode_h32_kv4_d128_ps1", "mla_decode": "mla_paged_decode_h16_ckv512_kpe64_ps1",
         "mla_prefill": "mla_paged_prefill_causal_h16_ckv512_kpe64_ps1",
         "moe": "moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e32_h7168_i2048"}
KERNELS = {"gqa": "triton_splitkv", "mla_decode": "triton_splitkv", "mla_prefill": "triton_flash",
           "moe": "triton_grouped"}
"""Each task's kernel under study: the default of --solution(s) and --base."""
BASELINES = {"moe": "reference"}
"""What a task's kernels are scored against by default, where not FlashInfer's kernel (the MoE has none)."""
DATASHEET_TBS = 4.8  # H200 HBM3e


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _label(name: str) -> str:
    name = name.split(":")[0]
    return Path(name).name if name.endswith(".py") else name


def _solution(task: Task, name: str, base: str) -> Solution:
    """A solution of the task by name, or a source file standing in for `base`'s (a sweep's best);
    `file.py:other` names the solution the file stands in for."""
    if ":" in name:
        name, base = name.rsplit(":", 1)
    if not name.endswith(".py"):
        return task.solution(name)
    parent = task.solution(base)
    text = Path(name).read_text()
    return Solution(**{**parent.model_dump(), "name": f"{parent.name}[{Path(name).stem}]",
                       "sources": {**parent.sources, parent.entry_file: text}})


def _event_ms(fn: Any, reps: int) -> float:
    """Median of `reps` CUDA-event timings of fn()."""
    fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for s, e in zip(starts, ends, strict=True):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends, strict=True))


def cmd_peak(args: argparse.Namespace) -> dict[str, Any]:
    n = 2**30  # bf16 elements: 2 GiB
    x = torch.ones(n, dtype=torch.bfloat16, device="cuda")
    y = torch.empty_like(x)
    nbytes = x.numel() * x.element_size()
    read_ms = _event_ms(lambda: x.sum(dtype=torch.float32), args.reps)
    copy_ms = _event_ms(lambda: y.copy_(x), args.reps)
    out = {"read_tbs": nbytes / read_ms / 1e9, "copy_tbs": 2 * nbytes / copy_ms / 1e9, "datasheet_tbs": DATASHEET_TBS}
    out["peak_tbs"] = max(out["read_tbs"], out["copy_tbs"])
    print(f"DRAM bandwidth, 2 GiB, median of {args.reps}: read (sum) {out['read_tbs']:.3f} TB/s, "
          f"copy (read + write) {out['copy_tbs']:.3f} TB/s; datasheet {DATASHEET_TBS} TB/s", flush=True)
    return out


def _peak_tbs(path: str) -> tuple[float, str]:
    if path and Path(path).is_file():
        return json.loads(Path(path).read_text())["result"]["peak_tbs"], "measured"
    return DATASHEET_TBS, "datasheet"


def cmd_eval(args: argparse.Namespace) -> dict[str, Any]:
    from ksearch_ray.evaluation.evaluator import Evaluator
    from ksearch_ray.evaluation.sandbox.isolation import Isolation
    from ksearch_ray.evaluation.settings import TimingPolicy

    task = find_task(TASKS[args.task])
    names = args.solutions.split(",")
    peak, peak_kind = _peak_tbs(args.peak)
    cost = {w.name: task.workload_cost(w) for w in task.workloads("all", args.device)}
    axes = {w.name: w.axes for w in task.workloads("all", args.device)}
    out: dict[str, Any] = {"peak_tbs": peak, "peak_kind": peak_kind, "runs": {}}
    with Evaluator(args.device, isolation=Isolation(args.isolation), timing=TimingPolicy(max_calls=args.feedback_calls)) as ev:
        for spec in args.sets.split(","):
            set_name, mode = spec.split(":")
            ev.timing.max_calls = args.feedback_calls if set_name == "feedback" else args.all_calls
            results = {}
            for name in names:
                if time.time() > args.deadline - 30:
                    print(f"{spec} {name}: skipped, no time left", flush=True)
                    continue
                t0 = time.monotonic()
                r = ev.evaluate(task, _solution(task, name, args.base), workload_set=set_name, mode=mode)
                results[name] = r
                row = {"status": r.status.value, "score": r.score, "seconds": round(time.monotonic() - t0, 1),
                       "prepared_untimed": r.prepared_untimed, "message": r.message[:400],
                       "workloads": {w.workload: {"status": w.status.value,
                                                  "mean_ms": w.timing.mean_ms if w.timing else None,
                                                  "median_ms": w.timing.median_ms if w.timing else None,
                                                  "count": w.timing.count if w.timing else None,
                                                  "method": w.timing.method if w.timing else None,
                                                  "max_abs_err": w.max_abs_error, "max_rel_err": w.max_rel_error}
                                     for w in r.workloads}}
                out["runs"][f"{spec}/{name}"] = row
                passed = sum(w.status.value == "PASSED" for w in r.workloads)
                methods = sorted({w["method"] for w in row["workloads"].values() if w["method"]})
                print(f"{spec:15s} {_label(name):24s} {row['status']:20s} {passed}/{len(r.workloads)} geomean "
                      f"{r.score if r.score is None else round(r.score, 5)} ms ({row['seconds']} s, "
                      f"timed as {'/'.join(methods)}) {row['message'][:160]}", flush=True)
            _print_comparison(spec, names, results, cost, axes, peak, peak_kind)
    return out


def _print_comparison(spec: str, names: list[str], results: dict[str, Any], cost: dict[str, Any],
                      axes: dict[str, dict[str, int]], peak: float, peak_kind: str) -> None:
    against = names[-1]
    means = {n: {w.workload: w.timing.mean_ms for w in r.workloads if w.timing} for n, r in results.items() if r.passed}
    for name in names[:-1]:
        if name in means and against in means:
            shared = [k for k in means[name] if k in means[against]]
            ratios = [means[against][k] / means[name][k] for k in shared]
            if ratios:
                wins = sum(x >= 1 for x in ratios)
                print(f"  {spec} {_label(name)} vs {_label(against)}: score {sum(ratios) / len(ratios):.3f}x (mean of "
                      f"{against}/{name}; {min(ratios):.2f}-{max(ratios):.2f}, geomean {_geomean(ratios):.3f}x, "
                      f"faster on {wins}/{len(ratios)})", flush=True)
    if not results:
        return
    print(f"  {spec} per workload: batch, tokens, MB a call must move; then per solution mean ms and TB/s "
          f"(% of the {peak_kind} peak {peak:.2f} TB/s)", flush=True)
    for w in next(iter(results.values())).workloads:
        nbytes = cost[w.workload][1]
        cells = []
        for name in names:
            ms = means.get(name, {}).get(w.workload)
            cells.append(f"{_label(name)} -" if ms is None else
                         f"{_label(name)} {ms:.4f} ms {nbytes / ms / 1e9:.2f} TB/s ({100 * nbytes / ms / 1e9 / peak:.0f} %)")
        print(f"    {w.workload[:8]} {_shape(axes[w.workload])} {nbytes / 1e6:7.2f} MB | " + " | ".join(cells), flush=True)


def _shape(a: dict[str, int]) -> str:
    """A workload's size in its task's axes: decode has batch_size, prefill total_q and len_indptr, MoE seq_len."""
    if "seq_len" in a:
        return f"t{a['seq_len']:<5d}"
    if "batch_size" in a:
        return f"b{a['batch_size']:<3d} {a['num_kv_indices']:6d} tok"
    return f"q{a['total_q']:<5d} b{a['len_indptr'] - 1:<3d} {a['num_kv_indices']:6d} tok"


def _inputs(task: Task, workload_set: str, seeds: int, only: str = "", reference: bool = True,
            device: str = "cuda") -> list[tuple[str, Any, Any]]:
    """(workload, inputs, reference outputs or None) for `seeds` input sets of each workload of the set."""
    sets = []
    for w in task.workloads(workload_set, device):
        if only and not w.name.startswith(only):
            continue
        for s in range(seeds):
            inputs = task.generate_inputs(w, 1000 + s, device)
            sets.append((w.name, inputs, task.reference(inputs) if reference else None))
    if not sets:
        raise SystemExit(f"no workload {only!r} in the set {workload_set}")
    return sets


def _graph_ms(fn: Any, flush: torch.Tensor, reps: int, check: Any = None) -> float:
    """Median time of fn as a CUDA-graph replay, each replay after an L2 flush (as the evaluator times);
    on the CPU (a dry run of the sweep in the interpreter) the median wall time of a few calls.
    `check`, if given, is called on what the last replay (the last call) wrote."""
    if flush.device.type == "cpu":
        times = []
        for _ in range(min(reps, 2)):
            t0 = time.perf_counter()
            got = fn()
            times.append((time.perf_counter() - t0) * 1e3)
        if check:
            check(got)
        return statistics.median(times)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for s, e in zip(starts, ends, strict=True):
        flush.zero_()
        s.record()
        graph.replay()
        e.record()
    torch.cuda.synchronize()
    if check:
        check(captured)
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends, strict=True))


def cmd_sweep(args: argparse.Namespace) -> dict[str, Any]:
    task = find_task(TASKS[args.task])
    solution = _solution(task, args.solution, args.base)  # a name, or a .py file standing in for --base
    best = {k: t.value for k, t in declared_tunables(solution).items()}
    inputs = _inputs(task, args.workloads, args.seeds, device=args.device)
    flush = torch.empty(256 * 2**20 if args.device == "cuda" else 1, dtype=torch.uint8, device=args.device)
    tmp = Path(tempfile.mkdtemp())

    def measure(values: dict[str, Any]) -> float | None:
        tag = abs(hash(json.dumps(values, sort_keys=True)))
        path = tmp / f"variant_{tag}.py"  # Triton reads kernel source from the file
        path.write_text(with_values(solution, values)[solution.entry_file])
        try:
            mod = load_module_file(path, path.stem)
            per_workload: dict[str, list[float]] = {}
            for name, data, expected in inputs:
                got = task.normalize_outputs(task.call(mod.run, data))
                verdict = compare_outputs(got, expected, task.definition.outputs, task.definition.tolerance)
                if not verdict.status.passed:
                    print(f"  {values}: wrong on {name[:8]}: {verdict.message[:200]}", flush=True)
                    return None
                ms = _graph_ms(lambda data=data: task.call(mod.run, data), flush, args.reps)
                per_workload.setdefault(name, []).append(ms)
            return _geomean([statistics.mean(v) for v in per_workload.values()])
        except Exception as exc:  # a config that does not compile or fit: skipped, and said
            # The last line of a compiler error says what went wrong; its first lines are source.
            print(f"  {values}: failed: {type(exc).__name__}: {str(exc).strip().splitlines()[-1][:240]}", flush=True)
            return None
        finally:
            sys.modules.pop(path.stem, None)

    result = coordinate_sweep(args.group, best, measure, deadline=args.deadline, skip_best=True, digits=5,
                              start_note=f" (geomean over {args.workloads}, {args.seeds} input sets each)")
    if args.best_out:  # the best combination as a source file, for `eval` to judge
        Path(args.best_out).write_text(with_values(solution, result["best"])[solution.entry_file])
    return result


def cmd_graphs(args: argparse.Namespace) -> dict[str, Any]:
    """Kernel against kernel: each solution's call timed the same way, as a CUDA-graph replay after an
    L2 flush, in this process (trusted code only: the task's own solutions and FlashInfer's). A
    solution with a per-input setup (`flashinfer_kernel`'s plan) runs it before the capture, untimed,
    so its host-side Python is out of the figure as it is out of a graph-replayed Triton call's. Each
    solution is checked against the reference on every input set, on a plain call and on what the
    graph's last replay wrote."""
    task = find_task(TASKS[args.task])
    names = args.solutions.split(",")
    mods = {}
    for name in names:
        solution = _solution(task, name, args.base)
        path = Path(tempfile.mkdtemp()) / solution.entry_file  # Triton reads kernel source from the file
        path.write_text(solution.sources[solution.entry_file])
        mods[name] = (load_module_file(path, f"graphs_{len(mods)}"), solution.prepare)
    inputs = _inputs(task, args.workloads, args.seeds, device=args.device)
    flush = torch.empty(256 * 2**20 if args.device == "cuda" else 1, dtype=torch.uint8, device=args.device)
    per: dict[str, dict[str, list[float]]] = {n: {} for n in names}
    for workload, data, expected in inputs:
        for name in names:
            mod, prepare = mods[name]
            if time.time() > args.deadline - 10:
                print("graphs stopped: no time left", flush=True)
                break
            try:
                if prepare:
                    task.call(getattr(mod, prepare), data)
                def check(outputs: Any, expected: Any = expected) -> None:
                    verdict = compare_outputs(task.normalize_outputs(outputs), expected, task.definition.outputs,
                                              task.definition.tolerance)
                    if not verdict.status.passed:
                        raise ValueError(f"wrong: {verdict.message[:200]}")

                check(task.call(mod.run, data))  # a plain call first, then what the graph's last replay wrote
                ms = _graph_ms(lambda mod=mod, data=data: task.call(mod.run, data), flush, args.reps, check)
            except Exception as exc:  # e.g. a call that cannot be captured: said, not hidden
                print(f"  {_label(name)} on {workload[:8]}: {type(exc).__name__}: "
                      f"{str(exc).strip().splitlines()[-1][:200] if str(exc).strip() else ''}", flush=True)
                continue
            per[name].setdefault(workload, []).append(ms)
    means = {n: {w: statistics.mean(v) for w, v in d.items()} for n, d in per.items()}
    against = names[-1]
    for name in names:
        m = means[name]
        line = f"{_label(name):24s} {len(m)} workloads, geomean {_geomean(list(m.values())):.5f} ms" if m else f"{_label(name)}: none timed"
        shared = [w for w in m if w in means[against]]
        if name != against and shared:
            ratios = [means[against][w] / m[w] for w in shared]
            line += (f"; vs {_label(against)} score {sum(ratios) / len(ratios):.3f}x (mean of ratios, "
                     f"{min(ratios):.2f}-{max(ratios):.2f}, faster on {sum(x >= 1 for x in ratios)}/{len(ratios)})")
        print(line, flush=True)
    for w in sorted({w for m in means.values() for w in m}):
        print(f"    {w[:8]} " + " | ".join(f"{_label(n)} {means[n][w]:.4f}" if w in means[n] else f"{_label(n)} -"
                                         for n in names), flush=True)
    return {"means_ms": means, "samples_ms": per}


def cmd_host(args: argparse.Namespace) -> dict[str, Any]:
    """Each solution's host work per call (issue 45), side by side in this process (trusted code only):
    the call's own seconds on the host (it returns once its kernels are queued; the GPU is idle before
    each call), the call as the evaluator's call figure times it (an L2 flush, a synchronize, then CUDA
    events around one call), and, on the first workload, where the host's time goes (cProfile, the
    functions with most time of their own). A solution with a per-input setup (`flashinfer_kernel`'s
    plan) runs it once per input set, untimed. One input set per workload: the host work of a call
    depends on the shapes, not the contents."""
    import cProfile
    import pstats

    task = find_task(TASKS[args.task])
    names = args.solutions.split(",")
    inputs = _inputs(task, args.workloads, 1, reference=False, device=args.device)
    flush = torch.empty(256 * 2**20, dtype=torch.uint8, device=args.device)
    out: dict[str, Any] = {}
    for n, name in enumerate(names):
        solution = _solution(task, name, args.base)
        path = Path(tempfile.mkdtemp()) / solution.entry_file  # Triton reads kernel source from the file
        path.write_text(solution.sources[solution.entry_file])
        mod = load_module_file(path, f"host_{n}")
        rows: dict[str, Any] = {}
        for i, (workload, data, _) in enumerate(inputs):
            if solution.prepare:
                task.call(getattr(mod, solution.prepare), data)
            for _ in range(3):
                task.call(mod.run, data)
            host, call = [], []
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            for _ in range(args.calls):
                flush.zero_()
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                task.call(mod.run, data)
                host.append((time.perf_counter() - t0) * 1e6)
                flush.zero_()
                torch.cuda.synchronize()
                start.record()
                task.call(mod.run, data)
                end.record()
                torch.cuda.synchronize()
                call.append(start.elapsed_time(end))
            rows[workload] = {"host_us": round(statistics.median(host), 1), "call_ms": round(statistics.median(call), 5)}
            if i == 0:
                prof = cProfile.Profile()
                prof.enable()
                for _ in range(args.calls):
                    task.call(mod.run, data)
                prof.disable()
                torch.cuda.synchronize()
                stats = pstats.Stats(prof)
                top = [(f"{fn[0].rsplit('/', 1)[-1]}:{fn[1]}({fn[2]})", round(st[2] / args.calls * 1e6, 1))
                       for fn, st in sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:args.top]]  # type: ignore[attr-defined]
                rows[workload]["profile_us_per_call"] = top
        out[name] = rows
        first = rows[inputs[0][0]]
        print(f"{_label(name)}: geomean call {_geomean([v['call_ms'] for v in rows.values()]):.5f} ms, median host "
              f"{statistics.median(v['host_us'] for v in rows.values()):.1f} us", flush=True)
        print("  own time per call on the first workload (cProfile, us): "
              + ", ".join(f"{f} {t}" for f, t in first["profile_us_per_call"]), flush=True)
    against = names[-1]
    for w in out[against]:
        print(f"    {w[:8]} " + " | ".join(f"{_label(n)} host {out[n][w]['host_us']} us call {out[n][w]['call_ms']:.4f}"
                                         for n in names), flush=True)
    for name in names[:-1]:
        ratios = [out[against][w]["call_ms"] / out[name][w]["call_ms"] for w in out[name]]
        print(f"{_label(name)} vs {_label(against)} as calls: {sum(ratios) / len(ratios):.3f}x (mean of ratios, "
              f"{min(ratios):.2f}-{max(ratios):.2f}); geomeans {_geomean([out[against][w]['call_ms'] for w in out[name]]) / _geomean([out[name][w]['call_ms'] for w in out[name]]):.3f}x",
              flush=True)
    return out


def cmd_once(args: argparse.Namespace) -> dict[str, Any]:
    """A few calls of the solution on one workload and nothing else, for `ncu` to profile."""
    task = find_task(TASKS[args.task])
    solution = _solution(task, args.solution, args.base)
    path = Path(tempfile.mkdtemp()) / solution.entry_file
    path.write_text(solution.sources[solution.entry_file])
    mod = load_module_file(path, "once")
    [(name, data, _)] = _inputs(task, "all", 1, only=args.workload, reference=False)
    for _ in range(args.calls):
        task.call(mod.run, data)
    torch.cuda.synchronize()
    return {"workload": name, "calls": args.calls}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", choices=sorted(TASKS), default="gqa")
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("peak", "eval", "sweep", "graphs", "once", "host"):
        p = sub.add_parser(name)
        p.add_argument("--out", required=name != "once")
        p.add_argument("--deadline", type=float, default=math.inf, help="Epoch seconds: start nothing after it.")
        p.add_argument("--base", default="", help="The solution a .py file stands in for (default: the task's kernel).")
    sub.choices["peak"].add_argument("--reps", type=int, default=20)
    ev = sub.choices["eval"]
    ev.add_argument("--solutions", default="", help="Comma-separated; the last one is what the others are scored "
                    "against (default: the task's kernel, triton_seed, flashinfer_kernel or the MoE's reference).")
    ev.add_argument("--sets", default="feedback:fresh,all:fresh,feedback:reuse,all:reuse")
    ev.add_argument("--isolation", default="require")
    ev.add_argument("--device", default="cuda", help="cpu: a dry run in Triton's interpreter on the -cpu sets.")
    ev.add_argument("--peak", default="", help="peak.json from `peak` (else the datasheet's 4.8 TB/s).")
    ev.add_argument("--feedback-calls", type=int, default=30, help="Cap on timed calls per workload on feedback.")
    ev.add_argument("--all-calls", type=int, default=10, help="Cap on timed calls per workload on all.")
    sw = sub.choices["sweep"]
    sw.add_argument("--solution", default="", help="Default: the task's kernel.")
    sw.add_argument("--device", default="cuda", help="cpu: a dry run in Triton's interpreter (wall times).")
    sw.add_argument("--workloads", default="feedback", help="A workload set (on the CPU: its -cpu variant).")
    sw.add_argument("--seeds", type=int, default=2, help="Input sets per workload (page tables, length splits).")
    sw.add_argument("--reps", type=int, default=30)
    sw.add_argument("--group", action="append", default=[])
    sw.add_argument("--best-out", default="", help="Write the best combination's source here.")
    gr = sub.choices["graphs"]
    gr.add_argument("--solutions", default="", help="Comma-separated names or .py files; the last one is what the "
                    "others are scored against (default: the task's kernel, triton_seed, flashinfer_kernel or the MoE's reference).")
    gr.add_argument("--device", default="cuda", help="cpu: a dry run in Triton's interpreter (wall times).")
    gr.add_argument("--workloads", default="feedback", help="A workload set (on the CPU: its -cpu variant).")
    gr.add_argument("--seeds", type=int, default=2, help="Input sets per workload (page tables, length splits).")
    gr.add_argument("--reps", type=int, default=30)
    on = sub.choices["once"]
    on.add_argument("--solution", default="", help="A solution's name, or a .py file (default: the task's kernel).")
    on.add_argument("--workload", required=True, help="Prefix of the workload's name (set `all`).")
    on.add_argument("--calls", type=int, default=3)
    ho = sub.choices["host"]
    ho.add_argument("--solutions", default="", help="Comma-separated names or .py files; the last one is what the "
                    "others are compared with (default: the task's kernel, triton_seed, flashinfer_kernel).")
    ho.add_argument("--device", default="cuda")
    ho.add_argument("--workloads", default="feedback", help="A workload set.")
    ho.add_argument("--calls", type=int, default=50)
    ho.add_argument("--top", type=int, default=12)
    args = ap.parse_args()
    if getattr(args, "device", "cuda") == "cpu":  # in-process runs (graphs, sweep) need the interpreter too
        os.environ.setdefault("TRITON_INTERPRET", "1")
    kernel = KERNELS[args.task]
    args.base = args.base or kernel
    if getattr(args, "solutions", None) == "":
        args.solutions = f"{kernel},triton_seed,{BASELINES.get(args.task, 'flashinfer_kernel')}"
    if getattr(args, "solution", None) == "":
        args.solution = kernel
    info = {"argv": sys.argv, "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu", "torch": torch.__version__}
    result = {"peak": cmd_peak, "eval": cmd_eval, "sweep": cmd_sweep, "graphs": cmd_graphs, "once": cmd_once,
              "host": cmd_host}[args.cmd](args)
    if args.out:
        Path(args.out).write_text(json.dumps({"info": info, "result": result}, indent=1, default=str))


if __name__ == "__main__":
    main()
