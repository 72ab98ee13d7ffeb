"""Where an evaluation's time goes, per candidate: seconds, the share in timed calls, seconds per stage.

Runs against whichever ksearch-ray is importable (this checkout, or an older one put first on
PYTHONPATH), so the same command measures the code before and after a change side by side
(experiments/gpu/h200_eval_throughput.sh runs both in one call). For each task and solution it
evaluates the candidate `--repeats` times in one warm evaluator (the sandbox's zygote started
beforehand, as in a search) and records, per evaluation:

* seconds, and the timed share: the sum of the timed calls' measured times over the seconds;
* seconds per stage: sandbox start (fork to the worker's `ready`), build, correctness, judging
  (references, comparisons and, in the old code, reading outputs back from files: whatever the
  worker did not overlap), warm-up, timing, teardown. The new code reports them in
  `EvalResult.stages`; for the old code they are taken from the progress lines' timestamps and
  from timers wrapped around its `_judge` and `_load_outputs`;
* per-workload means, so `--repeats` gives the noise: the spread (max - min) / median of one
  unchanged kernel's repeated measurements, per workload and of the score.

`--cross-evaluator` also measures every kernel in a second evaluator (another secret, so other
inputs): the noise that input draws add. `--hangs` measures how long a Python hang and a spinning
GPU kernel on TriMul's `smoke` set take to be judged, after the evaluator measured the baseline.

    python experiments/eval_throughput.py --label after --out after.json [--repeats 3] [--hangs]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CANDIDATES = ROOT / "tests" / "data" / "candidates"
SUITE = {  # task -> (workload set, solutions)
    "trimul": ("benchmarks", ["baseline", "triton_seed"]),
    "gqa_paged_decode_h32_kv4_d128_ps1": ("feedback", ["reference", "triton_seed"]),
    "mla_paged_decode_h16_ckv512_kpe64_ps1": ("feedback", ["reference", "triton_seed"]),
}
NOISE_FLOOR_MS = 0.05  # the noise goal is for kernels of 50 us or more


class Timers:
    """Seconds spent inside some methods of the old Evaluator (judging and reading outputs back)."""

    def __init__(self, cls: type, names: list[str]):
        self.spans: list[tuple[float, float, str]] = []
        for name in names:
            if hasattr(cls, name):
                setattr(cls, name, self._wrap(getattr(cls, name), name))

    def _wrap(self, fn: Callable[..., Any], name: str) -> Callable[..., Any]:
        def timed(*args: Any, **kw: Any) -> Any:
            t0 = time.monotonic()
            try:
                return fn(*args, **kw)
            finally:
                self.spans.append((t0, time.monotonic(), name))
        return timed

    def within(self, a: float, b: float, name: str | None = None) -> float:
        return sum(e - s for s, e, n in self.spans if s >= a and e <= b + 1e-6 and (name is None or n == name))


def evaluate_once(ev: Any, task: Any, solution: Any, workload_set: str, timers: Timers) -> dict[str, Any]:
    marks: list[tuple[float, str]] = []
    t0 = time.monotonic()
    result = ev.evaluate(task, solution, workload_set=workload_set, progress=lambda m: marks.append((time.monotonic(), m)))
    t1 = time.monotonic()
    row: dict[str, Any] = {
        "status": str(result.status.value), "message": result.message[:300], "seconds": round(t1 - t0, 4),
        "score": result.score,
        "workloads": {w.workload: {"mean_ms": w.timing.mean_ms, "median_ms": w.timing.median_ms,
                                   "min_ms": w.timing.min_ms, "std_ms": w.timing.std_ms, "count": w.timing.count,
                                   "method": getattr(w.timing, "method", "calls")}
                      for w in result.workloads if w.timing},
    }
    timed_s = getattr(result, "timed_seconds", 0.0) or sum(
        w.timing.mean_ms * w.timing.count for w in result.workloads if w.timing) / 1e3
    row["timed_seconds"] = round(timed_s, 4)
    row["timed_share"] = round(timed_s / row["seconds"], 4) if row["seconds"] else None
    row["transport"] = getattr(result, "transport", "") or "files (torch.save + sha256)"
    if getattr(result, "stages", None):
        row["stages"] = result.stages
        row["rule"] = result.timing_rule
        return row
    # The old code: stage boundaries from the progress lines it prints.
    def first(prefix: str) -> float | None:
        return next((t for t, m in marks if m.startswith(prefix)), None)

    def last(prefix: str) -> float | None:
        return next((t for t, m in reversed(marks) if m.startswith(prefix)), None)

    begin = first("starting") or t0
    ready = first("importing") or first("building") or first("loading") or begin
    checked = last("correct on") or ready
    timed = last("timed ") or checked
    judge_c, load_c = timers.within(ready, checked, "_judge"), timers.within(ready, checked, "_load_outputs")
    judge_t, load_t = timers.within(checked, timed, "_judge"), timers.within(checked, timed, "_load_outputs")
    build = float(result.build_seconds)
    row["stages"] = {
        "start": round(ready - t0, 4),
        "build": round(build, 4),
        "correctness": round(checked - ready - build - judge_c - load_c, 4),
        "judging": round(judge_c + judge_t + load_c + load_t, 4),
        "timing": round(timed - checked - judge_t - load_t, 4),
        "teardown": round(t1 - timed, 4),
    }
    row["old_output_io_seconds"] = round(load_c + load_t, 4)
    return row


def spread(values: list[float]) -> float | None:
    values = [v for v in values if v]
    if len(values) < 2:
        return None
    return (max(values) - min(values)) / statistics.median(values)


def noise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    passed = [r for r in rows if r["status"] == "PASSED"]
    out: dict[str, Any] = {"score_spread": spread([r["score"] for r in passed])}
    per = {}
    for name in passed[0]["workloads"] if passed else []:
        means = [r["workloads"][name]["mean_ms"] for r in passed if name in r["workloads"]]
        per[name] = {"median_ms": statistics.median(means), "spread": spread(means)}
    out["workloads"] = per
    big = [v["spread"] for v in per.values() if v["spread"] is not None and v["median_ms"] >= NOISE_FLOOR_MS]
    out["worst_spread_at_or_above_50us"] = max(big) if big else None
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--label", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tasks", default=",".join(SUITE))
    ap.add_argument("--cross-evaluator", action="store_true")
    ap.add_argument("--cross-repeats", type=int, default=2)
    ap.add_argument("--cross-skip", default="reference", help="Solutions not measured in the second evaluator.")
    ap.add_argument("--hangs", action="store_true")
    ap.add_argument("--only-solutions", default="", help="Comma-separated solution names to measure (default: all).")
    ap.add_argument("--only-hang", action="store_true", help="Only the Python hang (for the old code, run beside the rest).")
    args = ap.parse_args()

    import ksearch_ray
    from ksearch_ray.evaluation.evaluator import Evaluator
    from ksearch_ray.taskspec.task import find_task, solution_from_file

    report: dict[str, Any] = {"label": args.label, "code": str(Path(ksearch_ray.__file__).parent),
                              "python": sys.version.split()[0], "runs": {}, "noise": {}, "hangs": {}}
    timers = Timers(Evaluator, ["_judge", "_load_outputs"])

    def save() -> None:
        Path(args.out).write_text(json.dumps(report, indent=1))

    if not args.only_hang:
        evaluators = [Evaluator(args.device)]
        if args.cross_evaluator:
            evaluators.append(Evaluator(args.device))
        try:
            for name in args.tasks.split(","):
                task = find_task(name)
                workload_set, solutions = SUITE[name]
                for sol_name in solutions:
                    if args.only_solutions and sol_name not in args.only_solutions.split(","):
                        continue
                    solution = task.solution(sol_name)
                    key = f"{name}/{sol_name}"
                    rows = []
                    for e, ev in enumerate(evaluators):
                        if e and sol_name in args.cross_skip.split(","):
                            continue
                        for r in range(args.repeats if e == 0 else args.cross_repeats):
                            row = evaluate_once(ev, task, solution, workload_set, timers)
                            row["evaluator"], row["repeat"] = e, r
                            rows.append(row)
                            print(f"{args.label} {key} ev{e} #{r}: {row['status']} {row['seconds']:.2f} s, "
                                  f"timed {row['timed_share']:.1%}, stages {row['stages']}", flush=True)
                    report["runs"][key] = rows
                    report["noise"][key] = {"within_evaluator": noise([r for r in rows if r["evaluator"] == 0])}
                    if any(r["evaluator"] for r in rows):
                        report["noise"][key]["across_evaluators"] = noise(rows)
                    save()
        finally:
            for ev in evaluators:
                ev.close()
    if args.hangs or args.only_hang:
        trimul = find_task("trimul")
        with Evaluator(args.device) as ev:
            if not args.only_hang:  # as every search does first (the old code learns nothing from it)
                base = ev.evaluate(trimul, trimul.baseline(), workload_set="smoke")
                report["hangs"]["baseline_smoke_seconds"] = round(base.seconds, 3)
            for cand in (["hang"] if args.only_hang else ["hang", "spin_kernel"]):
                t0 = time.monotonic()
                result = ev.evaluate(trimul, solution_from_file(CANDIDATES / f"{cand}.py", trimul), workload_set="smoke")
                report["hangs"][cand] = {"status": str(result.status.value), "seconds_to_verdict": round(time.monotonic() - t0, 3),
                                         "message": result.message[:300]}
                if not args.only_hang:  # the GPU is usable again after a killed kernel
                    after = ev.evaluate(trimul, trimul.baseline(), workload_set="smoke")
                    report["hangs"][f"baseline_after_{cand}"] = {"status": str(after.status.value),
                                                                 "seconds": round(after.seconds, 3)}
                print(f"{args.label} hang {cand}: {report['hangs'][cand]}", flush=True)
                save()
    save()
    for key, n in report["noise"].items():
        w = n["within_evaluator"]
        print(f"{args.label} noise {key}: score spread {w['score_spread']}, worst >=50us {w['worst_spread_at_or_above_50us']}")


if __name__ == "__main__":
    main()
