"""What moves the call figure of a TriMul kernel (issue 39's reproduction check), factor by factor, in one process.

The evaluator's call figure for `triton_fused` came out 4.4 % above a plain GPUMode-style loop (17.6 % on
N256_B2_D384 with mask), both well above the 0.946 ms an independent harness measured, and it moved 11 %
between two evaluations in one process. This script times the same solution on the same shapes under
loops that differ in one factor each, side by side:

in this process (CUDA events around one call after torch.cuda.synchronize(), the call's arguments in the
task's calling convention made before (eval.py's `data`), GPUMode's stop rule: 3 to
`--max-calls` calls, until the standard error is below 0.1 % of the mean or 10 s of calls; an untimed
call first on each loop's first inputs):

    plain      new inputs for every call, the last ones freed first; nothing else between calls
    same       one input set for every call (GPUMode's benchmark mode)
    keep_old   new inputs made while the last ones are still alive (eval.py rebinds `data`)
    check      plain, and each output checked against the reference after its call (GPU work between calls)
    gpumode    eval.py's leaderboard loop: keep_old, a clone of each input set, each output checked on the clone
    gpu_busy   plain, and --busy-ms of unrelated GPU work (matmuls) after each call
    cpu_busy   plain, and --busy-ms of Python spinning after each call (the GPU idle)
    idle       plain, and a --busy-ms sleep after each call
    remote_check  plain, and after each call the reference for new inputs of the workload computed in another
               process (a second CUDA context, as the evaluator's judge) while this one waits for its answer
               asleep in a blocking read, as the evaluator's worker waits for `go` under recheck
    remote_spin   the same, waiting for the answer on the CPU (polling), as eval.py's process stays on it
               while it checks an output
    harness    plain, and the evaluator worker's own work after each call: its integrity checks (the worker
               no longer sends a message after every call: a tick a quarter second at most)
    ksclock    plain, timed by the evaluator's native stopwatch (sandbox/ksclock.c) instead of torch events
    flush      plain, and a 128 MiB write before each call (the evaluator's L2 flush)
    nogc       plain with Python's garbage collector off during the loop
    plain2     plain again, last: drift over the experiment

in fresh processes: tests/gpumode_loop.py (the reproduction test's own GPUMode-style loop) `--processes` times;

through the evaluator (sandboxed, `--isolation`, in this process): the call figure with each timed call's
output checked before the next (`recheck`: GPUMode's leaderboard, `evaluation.timing.recheck: true`), with
the last call's only (`last_only`, TriMul's default), `last_only` without the kernel figure timed before it (`last_only_nographs`), and `last_only`
again in a new worker (`last_only_again`: how far two evaluations of one kernel differ).

Every timed call's host time (call entry to return) is kept beside its event time: where they are close,
the call is bound by its host launch work. Python's garbage collections that ran inside timed calls are
counted. Output: a table per shape (mean, median, p90, max, host median; ratio of means to `gpumode`),
geomeans per loop, and the raw times as JSON (--out).

    python3 experiments/call_timing_factors.py --out /tmp/out/factors.json
    TRITON_INTERPRET=1 python3 experiments/call_timing_factors.py --device cpu --workload-set smoke-cpu \\
        --max-calls 4 --out /tmp/f.json   # the logic only, on the CPU
    python3 experiments/call_timing_factors.py --pin-cpus 2,3 --processes 3 --out /tmp/out/pinned.json  # on two cores
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ksearch_ray.taskspec.task import Task, find_task, load_module_file

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Loop:
    name: str
    fresh: bool = True
    keep_old: bool = False
    clone: bool = False
    check: bool = False
    after: str = ""  # gpu_busy | cpu_busy | idle | harness
    clock: str = "events"  # events | ksclock
    flush: bool = False
    nogc: bool = False


LOOPS = [  # the likeliest factors first: a run cut short by its budget loses the others
    Loop("plain"), Loop("gpumode", keep_old=True, clone=True, check=True), Loop("remote_check", after="remote"),
    Loop("remote_spin", after="remote_spin"), Loop("same", fresh=False),
    Loop("check", check=True), Loop("keep_old", keep_old=True), Loop("harness", after="harness"),
    Loop("ksclock", clock="ksclock"), Loop("gpu_busy", after="gpu_busy"), Loop("idle", after="idle"),
    Loop("cpu_busy", after="cpu_busy"), Loop("flush", flush=True), Loop("nogc", nogc=True), Loop("plain2"),
]


# The remote loops' other process: for each workload named on its standard input, the reference on new
# inputs (a second CUDA context, like the evaluator's judge), then a line back.
_HELPER = """
import sys
import torch
from ksearch_ray.taskspec.spec import Workload
from ksearch_ray.taskspec.task import find_task
task, device, seed = find_task("trimul"), sys.argv[1], 0
for line in sys.stdin:
    seed += 1
    task.reference(task.generate_inputs(Workload.model_validate_json(line), seed, device))
    if device == "cuda":
        torch.cuda.synchronize()
    sys.stdout.write("ok\\n")
    sys.stdout.flush()
"""


class Collections:
    """Python's garbage collections, and which of them ran inside a timed call."""

    def __init__(self) -> None:
        self.in_call = False
        self.started = 0.0
        self.inside: list[tuple[int, float]] = []  # (generation, ms)
        self.total = 0
        gc.callbacks.append(self.callback)

    def callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self.started = time.perf_counter()
            return
        self.total += 1
        if self.in_call:
            self.inside.append((info["generation"], (time.perf_counter() - self.started) * 1e3))


class Clock:
    """One call between CUDA events after a sync (GPUMode's), or the native stopwatch; the host's wall
    time of the call beside it. On the CPU, the host's wall clock alone."""

    def __init__(self, device: str, kind: str, gcs: Collections):
        self.cuda, self.kind, self.gcs = device == "cuda", kind, gcs
        if kind == "ksclock":
            self.native = native_stopwatch(self.cuda)

    def time(self, call: Callable[[], Any]) -> tuple[Any, float, float]:
        """(the call's result, its timed ms, its host ms)."""
        if self.kind == "ksclock":
            watch, read_fd = self.native
            self.gcs.in_call = True
            t0 = time.perf_counter()
            watch.begin()
            out = call()
            host = (time.perf_counter() - t0) * 1e3
            rc = watch.end()
            self.gcs.in_call = False
            if rc != 0:
                raise RuntimeError(f"native stopwatch: code {rc}")
            from ksearch_ray.evaluation.sandbox.clock import RECORD_SIZE, parse_records

            [record] = parse_records(bytearray(os.read(read_fd, RECORD_SIZE)))
            return out, record.time_ms, host
        start = end = None
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        self.gcs.in_call = True
        t0 = time.perf_counter()
        out = call()
        host = (time.perf_counter() - t0) * 1e3
        self.gcs.in_call = False
        if start is None or end is None:
            return out, host, host
        end.record()
        torch.cuda.synchronize()
        return out, start.elapsed_time(end), host


_NATIVE: tuple[Any, int] | None = None


def native_stopwatch(cuda: bool) -> tuple[Any, int]:
    """The evaluator's stopwatch (built from sandbox/ksclock.c), writing its records to a pipe read here."""
    global _NATIVE
    if _NATIVE is None:
        from ksearch_ray.evaluation.sandbox.clock import NativeStopwatch, build_native

        lib, problem = build_native(Path(tempfile.gettempdir()) / f"ksclock-{os.getuid()}")
        if lib is None:
            raise RuntimeError(f"no native stopwatch: {problem}")
        read_fd, write_fd = os.pipe()
        watch = NativeStopwatch(lib)
        watch.start(write_fd, cuda, torch.cuda.current_stream().cuda_stream if cuda else 0)
        _NATIVE = (watch, read_fd)
    return _NATIVE


class Between:
    """What a loop does after each timed call."""

    def __init__(self, device: str, busy_ms: float):
        self.device, self.busy_ms = device, busy_ms
        self.cuda = device == "cuda"
        self.a = torch.randn(2048, 2048, device=device, dtype=torch.float16 if self.cuda else torch.float32)
        self.flush_buf = torch.empty(128 * 1024 * 1024 // 4, dtype=torch.int32, device=device) if self.cuda else None
        self.matmuls = self.calibrate() if self.cuda else 1
        self.guard: Any = None
        self.helper: subprocess.Popen[bytes] | None = None  # the remote loops' reference process
        self.workload: Any = None  # the workload being timed

    def calibrate(self) -> int:
        """Matmuls of 2048^2 in fp16 that take about busy_ms on this GPU."""
        for _ in range(3):
            self.a @ self.a
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(20):
            self.a @ self.a
        torch.cuda.synchronize()
        each = (time.perf_counter() - t0) * 1e3 / 20
        return max(1, round(self.busy_ms / each))

    def flush(self) -> None:
        if self.flush_buf is not None:
            self.flush_buf.zero_()

    def run(self, kind: str) -> None:
        if kind == "gpu_busy":
            for _ in range(self.matmuls):
                self.a @ self.a
        elif kind == "cpu_busy":
            end = time.perf_counter() + self.busy_ms / 1e3
            while time.perf_counter() < end:
                pass
        elif kind == "idle":
            time.sleep(self.busy_ms / 1e3)
        elif kind == "harness":
            self.harness()
        elif kind in ("remote", "remote_spin"):
            self.remote(spin=kind == "remote_spin")

    def remote(self, spin: bool) -> None:
        """A reference computed by another process for new inputs of `self.workload`, this one waiting."""
        if self.helper is None:
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
            self.helper = subprocess.Popen([sys.executable, "-c", _HELPER, self.device], stdin=subprocess.PIPE,
                                           stdout=subprocess.PIPE, bufsize=0, env=env)
        assert self.helper.stdin is not None and self.helper.stdout is not None
        self.helper.stdin.write((self.workload.model_dump_json() + "\n").encode())
        fd = self.helper.stdout.fileno()
        os.set_blocking(fd, not spin)
        got = b""
        while not got.endswith(b"\n"):
            try:
                chunk = os.read(fd, 64)
            except BlockingIOError:
                continue
            if not chunk:
                raise RuntimeError("the reference process ended")
            got += chunk

    def close(self) -> None:
        if self.helper is not None and self.helper.stdin is not None:
            self.helper.stdin.close()
            self.helper.wait(timeout=30)

    def harness(self) -> None:
        """The evaluator worker's work after a timed call (sandbox/timer.py): its integrity checks."""
        from ksearch_ray.evaluation.sandbox import integrity

        if self.guard is None:
            self.guard = integrity.Guard()
        problems = self.guard.check_and_restore() + self.guard.lingering_threads()
        if problems:
            raise RuntimeError(f"integrity: {problems}")


def clone(inputs: dict[str, Any]) -> dict[str, Any]:
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def check(task: Task, inputs: dict[str, Any], output: Any) -> None:
    expected = task.reference(inputs)
    got = task.normalize_outputs(output)
    tol = task.definition.tolerance
    for name, ref in expected.items():
        out = got[name].to(ref.dtype)
        if not bool(((out - ref).abs() <= tol.atol + tol.rtol * ref.abs()).all()):
            raise AssertionError(f"{name} differs from the reference")


def enough(times: list[float], started: float, max_calls: int) -> bool:
    n = len(times)
    if n >= max_calls:
        return True
    if n < 3:
        return False
    mean = statistics.fmean(times)
    return statistics.stdev(times) / math.sqrt(n) / mean < 1e-3 or mean * n > 10e3 or time.perf_counter() - started > 60


def run_loop(task: Task, kernel: Any, workload: Any, device: str, loop: Loop, between: Between, gcs: Collections,
             max_calls: int) -> dict[str, Any]:
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    clock = Clock(device, loop.clock, gcs)
    seed = int(workload.params.get("seed", 0)) * 7919 + len(loop.name)  # each loop its own inputs
    between.workload = workload
    data: dict[str, Any] | None = task.generate_inputs(workload, seed, device)
    assert data is not None
    copy = clone(data) if loop.clone else data
    out = task.call(kernel, data)
    if loop.check:
        check(task, copy, out)
    del out
    times: list[float] = []
    hosts: list[float] = []
    inside_before, total_before = len(gcs.inside), gcs.total
    t_start, started = time.time(), time.perf_counter()
    if loop.nogc:
        gc.disable()
    try:
        while not enough(times, started, max_calls):
            if loop.fresh and times:
                seed += 13
                if not loop.keep_old:
                    data = copy = None
                data = task.generate_inputs(workload, seed, device)
                copy = clone(data) if loop.clone else data
            if loop.flush:
                between.flush()
            args = task.arguments(data)
            sync()
            out, ms, host = clock.time(lambda: kernel(*args))  # noqa: B023
            if loop.check:
                check(task, copy, out)
            del out
            if loop.after:
                between.run(loop.after)
            times.append(ms)
            hosts.append(host)
    finally:
        if loop.nogc:
            gc.enable()
    inside = gcs.inside[inside_before:]
    return {**summary(times), "host_median_ms": statistics.median(hosts), "t_start": t_start, "t_end": time.time(),
            "gc_total": gcs.total - total_before, "gc_in_calls": len(inside),
            "gc_in_calls_ms": round(sum(ms for _, ms in inside), 3), "times": times, "hosts": hosts}


def summary(times: list[float]) -> dict[str, Any]:
    ordered = sorted(times)
    return {"n": len(times), "mean_ms": statistics.fmean(times), "median_ms": statistics.median(times),
            "min_ms": ordered[0], "p90_ms": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))],
            "max_ms": ordered[-1]}


def in_process(task: Task, solution: str, device: str, workloads: list[Any], args: argparse.Namespace,
               deadline: float) -> dict[str, dict[str, Any]]:
    sol = task.solution(solution)
    folder = Path(tempfile.mkdtemp(prefix="factors-"))
    for name, text in sol.sources.items():
        (folder / name).write_text(text)
    kernel = getattr(load_module_file(folder / sol.entry_file, f"factors_{solution}"), sol.entry_point)
    between = Between(device, args.busy_ms)
    gcs = Collections()
    loops = [loop for loop in LOOPS if not args.loops or loop.name in args.loops.split(",")]
    out: dict[str, dict[str, Any]] = {}
    for workload in workloads:
        for _ in range(2):  # compiles
            task.call(kernel, task.generate_inputs(workload, 1, device))
        rows = out[workload.name] = {}
        for loop in loops:
            if time.monotonic() > deadline:
                rows[loop.name] = {"skipped": "budget"}
                continue
            try:
                rows[loop.name] = run_loop(task, kernel, workload, device, loop, between, gcs, args.max_calls)
            except Exception as exc:  # an experiment: one loop's failure is recorded, the others still run
                rows[loop.name] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-1500:]}
            if device == "cuda":
                torch.cuda.empty_cache()
        print(f"  {workload.name}: " + ", ".join(
            f"{k} {r['mean_ms']:.4g}" if "mean_ms" in r else f"{k} -" for k, r in rows.items()), flush=True)
    between.close()
    return out


def fresh_processes(solution: str, count: int, deadline: float) -> list[dict[str, Any]]:
    runs = []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    for i in range(count):
        if time.monotonic() > deadline:
            runs.append({"skipped": "budget"})
            continue
        t0 = time.time()
        done = subprocess.run([sys.executable, str(ROOT / "tests" / "gpumode_loop.py"), "--solution", solution],
                              capture_output=True, text=True, env=env, timeout=max(30.0, deadline - time.monotonic() + 30))
        if done.returncode != 0:
            runs.append({"error": done.stderr[-1500:]})
        else:
            runs.append({"workloads": json.loads(done.stdout.splitlines()[-1]), "t_start": t0, "t_end": time.time()})
        print(f"  fresh process {i + 1}: {'ok' if done.returncode == 0 else 'failed'}", flush=True)
    return runs


def through_evaluator(task: Task, solution: str, device: str, workload_set: str, isolation: str, max_calls: int,
                      deadline: float) -> dict[str, Any]:
    from ksearch_ray.evaluation.evaluator import Evaluator
    from ksearch_ray.evaluation.sandbox.isolation import Isolation
    from ksearch_ray.evaluation.settings import TimingPolicy

    base = TimingPolicy.for_device(device).model_copy(update={"max_calls": max_calls})
    configs = {"last_only": {"recheck": False}, "last_only_nographs": {"recheck": False, "graphs": False},
               "recheck": {"recheck": True}, "last_only_again": {"recheck": False}}  # the last: a new worker's spread
    out: dict[str, Any] = {}
    with Evaluator(device, isolation=Isolation(isolation), timing=base) as ev:
        for name, update in configs.items():
            if time.monotonic() > deadline:
                out[name] = {"skipped": "budget"}
                continue
            ev.timing = base.model_copy(update=update)  # one sandbox for every configuration
            t0 = time.time()
            r = ev.evaluate(task, task.solution(solution), workload_set=workload_set)
            out[name] = {"status": r.status.value, "message": r.message, "seconds": round(r.seconds, 1),
                         "t_start": t0, "t_end": time.time(), "rule": r.timing_rule,
                         "workloads": {w.workload: {
                             "call_mean_ms": w.call_timing.mean_ms if w.call_timing else None,
                             "call_median_ms": w.call_timing.median_ms if w.call_timing else None,
                             "call_min_ms": w.call_timing.min_ms if w.call_timing else None,
                             "call_host_median_ms": w.call_timing.host_median_ms if w.call_timing else None,
                             "call_n": w.call_timing.count if w.call_timing else None,
                             "kernel_mean_ms": w.kernel_timing.mean_ms if w.kernel_timing else None}
                             for w in r.workloads}}
            print(f"  evaluator {name}: {r.status.value} in {r.seconds:.0f} s", flush=True)
    return out


def geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values and all(v > 0 for v in values) else None


def report(result: dict[str, Any]) -> str:
    lines = []
    loops: dict[str, dict[str, Any]] = result["in_process"]
    columns: dict[str, dict[str, float]] = {}  # source -> workload -> mean ms
    for workload, rows in loops.items():
        ref = rows.get("gpumode", {}).get("mean_ms")
        lines.append(f"\n{workload}  (ms; ratio = mean / gpumode's mean)")
        lines.append(f"  {'loop':<20} {'n':>4} {'mean':>8} {'median':>8} {'p90':>8} {'max':>8} {'host med':>9} "
                     f"{'gc in calls':>11} {'ratio':>7}")
        for name, r in rows.items():
            if "mean_ms" not in r:
                lines.append(f"  {name:<20} {r.get('skipped') or r.get('error', '')[:90]}")
                continue
            columns.setdefault(name, {})[workload] = r["mean_ms"]
            ratio = f"{r['mean_ms'] / ref:.3f}" if ref else "-"
            lines.append(f"  {name:<20} {r['n']:>4} {r['mean_ms']:>8.4f} {r['median_ms']:>8.4f} {r['p90_ms']:>8.4f} "
                         f"{r['max_ms']:>8.3f} {r['host_median_ms']:>9.4f} {r['gc_in_calls']:>5} {r['gc_in_calls_ms']:>5.1f}"
                         f" {ratio:>7}")
        for i, run in enumerate(result.get("fresh_processes", [])):
            m = run.get("workloads", {}).get(workload)
            if m:
                columns.setdefault(f"fresh_process_{i + 1}", {})[workload] = m["mean_ms"]
                ratio = f"{m['mean_ms'] / ref:.3f}" if ref else "-"
                lines.append(f"  {f'fresh_process_{i + 1}':<20} {m['count']:>4} {m['mean_ms']:>8.4f} {m['median_ms']:>8.4f} "
                             f"{'':>8} {m['max_ms']:>8.3f} {m.get('host_median_ms') or 0:>9.4f} {'':>11} {ratio:>7}")
        for name, ev in result.get("evaluator", {}).items():
            w = ev.get("workloads", {}).get(workload)
            if w and w["call_mean_ms"]:
                columns.setdefault(f"evaluator_{name}", {})[workload] = w["call_mean_ms"]
                ratio = f"{w['call_mean_ms'] / ref:.3f}" if ref else "-"
                kernel = f"kernel {w['kernel_mean_ms']:.4f}" if w["kernel_mean_ms"] else ""
                host = w.get("call_host_median_ms")
                lines.append(f"  {f'evaluator_{name}':<20} {w['call_n']:>4} {w['call_mean_ms']:>8.4f} "
                             f"{w['call_median_ms']:>8.4f} {kernel:>17} {host or 0:>9.4f} {'':>11} {ratio:>7}")
    lines.append("\ngeomean over the workloads each has (ms), and its ratio to gpumode's over the same workloads")
    ref_col = columns.get("gpumode", {})
    for name, col in columns.items():
        g = geomean(list(col.values()))
        common = [k for k in col if k in ref_col]
        r = geomean([col[k] / ref_col[k] for k in common]) if common else None
        lines.append(f"  {name:<26} {g:.4f} ms over {len(col)}" + (f"   x{r:.3f} of gpumode" if r else ""))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--solution", default="triton_fused")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--workload-set", default="benchmarks")
    ap.add_argument("--loops", default="", help="comma-separated loop names (default: all)")
    ap.add_argument("--max-calls", type=int, default=100)
    ap.add_argument("--busy-ms", type=float, default=5.0)
    ap.add_argument("--processes", type=int, default=1, help="runs of tests/gpumode_loop.py in fresh processes (GPU only)")
    ap.add_argument("--isolation", default="require", choices=["require", "best-effort", "off"])
    ap.add_argument("--no-evaluator", action="store_true")
    ap.add_argument("--budget-s", type=float, default=240.0, help="what is left after this many seconds is skipped")
    ap.add_argument("--pin-cpus", default="", help="comma-separated CPU numbers this process and every process it "
                    "starts (the loops, the evaluator's sandbox workers) run on: does host speed still differ between "
                    "processes when they share cores?")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if args.pin_cpus:
        try:
            os.sched_setaffinity(0, {int(c) for c in args.pin_cpus.split(",")})
        except (ValueError, OSError) as exc:
            raise SystemExit(f"error: --pin-cpus {args.pin_cpus}: {exc}") from None
    t0 = time.monotonic()
    task = find_task("trimul")
    workloads = task.workloads(args.workload_set, args.device)
    result: dict[str, Any] = {"solution": args.solution, "device": args.device, "workload_set": args.workload_set,
                              "torch": torch.__version__, "gpu": torch.cuda.get_device_name() if args.device == "cuda" else None,
                              "argv": sys.argv[1:], "cpus": sorted(os.sched_getaffinity(0))}
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:  # after each part: a run cut short keeps what it measured
        result["seconds"] = round(time.monotonic() - t0, 1)
        args.out.write_text(json.dumps(result, indent=1))

    # Shares of the budget: loops in this process, then fresh processes, then the evaluator.
    print(f"in this process: {args.solution} on {len(workloads)} workloads", flush=True)
    result["in_process"] = in_process(task, args.solution, args.device, workloads, args, t0 + 0.55 * args.budget_s)
    save()
    if args.device == "cuda" and args.processes:
        torch.cuda.empty_cache()
        print("in fresh processes (tests/gpumode_loop.py)", flush=True)
        result["fresh_processes"] = fresh_processes(args.solution, args.processes, t0 + 0.7 * args.budget_s)
        save()
    if not args.no_evaluator:
        print("through the evaluator", flush=True)
        try:
            result["evaluator"] = through_evaluator(task, args.solution, args.device, args.workload_set, args.isolation,
                                                    args.max_calls, t0 + args.budget_s)
        except Exception as exc:  # recorded and shown: the loops above still count
            result["evaluator_error"] = traceback.format_exc()[-2000:]
            print(f"  evaluator failed: {type(exc).__name__}: {exc}", flush=True)
        save()
    text = report(result)
    args.out.with_suffix(".txt").write_text(text + "\n")
    print(text)
    print(f"\n{result['seconds']} s; raw times in {args.out}")


if __name__ == "__main__":
    main()
