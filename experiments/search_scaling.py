"""How one search scales with GPU-pinned evaluators on one host.

Runs the same TriMul search (offline policy, fixed rounds) once per evaluator count, each in
its own `ksearch run` (its own embedded Ray), then measures every run from its run directory
alone, and finally evaluates the baseline, the seed and each run's best solution side by side
in one evaluator on the `benchmarks` set.

    python experiments/search_scaling.py --gpus 1 2 --rounds 24 --width 4 --out runs/scaling
    python experiments/search_scaling.py --gpus 1 2 4 8 --rounds 48 --width-per-gpu 2 --out runs/scaling

Columns: evaluations per minute over the search phase (first candidate to the end), scaling
efficiency against the 1-evaluator run, the share of the search phase each evaluator spent
evaluating, the round that produced the final best, driver time waiting on the world-model
actor per round, and the best speedup over the seed found by the search (on the scoring set).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_search(gpus: int, width: int, args: argparse.Namespace) -> Path:
    run_dir = Path(args.out) / f"gpus{gpus}"
    cmd = [sys.executable, "-m", "ksearch_ray", "run", "--task", "trimul", "--evaluators", str(gpus),
           "--width", str(width), "--rounds", str(args.rounds), "--stagnation-window", str(args.stagnation_window),
           "--workloads", args.workloads, "--device", args.device, "--no-progress", "--run-dir", str(run_dir)]
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "NCCL_NVLS_ENABLE": "0"}
    print("$", " ".join(cmd[1:]), flush=True)
    subprocess.run(cmd, check=True, env=env, cwd=ROOT)
    return run_dir


def measure(run_dir: Path) -> dict:
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    cands = [e for e in events if e["kind"] == "candidate"]
    evals = [e for e in events if e["kind"] == "evaluation"]
    end = next(e for e in events if e["kind"] == "run_end")
    seed = next(e for e in events if e["kind"] == "seed")
    t0, t1 = cands[0]["t"], end["t"]
    minutes = (t1 - t0) / 60
    busy: dict[int, float] = {}
    for e in evals:
        busy[e["evaluator"]] = busy.get(e["evaluator"], 0.0) + e["result"]["seconds"]
    bests = [e for e in events if e["kind"] == "best"]
    return {
        "evaluators": len(busy),
        "evaluations": len(evals),
        "passed": sum(e["result"]["status"] == "PASSED" for e in evals),
        "search_minutes": minutes,
        "evals_per_min": len(evals) / minutes,
        "busy_share": {k: round(v / (t1 - t0), 3) for k, v in sorted(busy.items())},
        "rounds_to_best": bests[-1]["round"] if bests else None,
        "wm_ms_per_round": 1e3 * end["wm_s"] / max(end["rounds"], 1),
        "seed_speedup": seed["speedup"],
        "best_speedup": end["best"]["speedup"] if end["best"] else None,
        "best_solution": end["best"]["solution_id"] if end["best"] else None,
        "best_over_seed": (end["best"]["speedup"] / seed["speedup"]) if end["best"] else None,
    }


def side_by_side(run_dirs: list[Path], workloads: str, device: str) -> list[str]:
    from ksearch_ray.evaluation.evaluator import Evaluator
    from ksearch_ray.models import Solution
    from ksearch_ray.taskspec.task import find_task

    task = find_task("trimul")
    entries = [("baseline", task.baseline()), ("seed", task.solution("triton_seed"))]
    for d in run_dirs:
        best = json.loads((d / "best.json").read_text())
        entries.append((f"best of {d.name}", Solution.model_validate(best["solution"])))
    lines = []
    with Evaluator(device, Path(run_dirs[0]).parent / "sandbox-compare") as ev:
        results = [(name, ev.evaluate(task, sol, workload_set=workloads)) for name, sol in entries]
    base = results[0][1].score
    for name, r in results:
        ratio = f"{base / r.score:.3f}x" if r.score else r.status.value
        lines.append(f"| {name} | {r.status.value} | {r.score:.3f} | {ratio} |" if r.score else f"| {name} | {r.status.value} | — | — |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=24)
    ap.add_argument("--width", type=int, default=None, help="Fixed width for every run.")
    ap.add_argument("--width-per-gpu", type=int, default=2)
    ap.add_argument("--stagnation-window", type=int, default=3)
    ap.add_argument("--workloads", default="smoke")
    ap.add_argument("--compare-workloads", default="benchmarks")
    ap.add_argument("--out", default="runs/scaling")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--no-compare", action="store_true", help="Skip the side-by-side evaluation.")
    args = ap.parse_args()
    rows, dirs = [], []
    for g in args.gpus:
        width = args.width or args.width_per_gpu * g
        d = run_search(g, width, args)
        dirs.append(d)
        rows.append((g, width, measure(d)))
    one = rows[0][2]["evals_per_min"] if rows and rows[0][0] == 1 else None
    print("\n| evaluators | width | evaluations | evals/min | efficiency vs 1 | busy share per evaluator | rounds to final best | WM ms/round | best/seed |")
    print("|---|---|---|---|---|---|---|---|---|")
    for g, width, m in rows:
        eff = f"{m['evals_per_min'] / (one * g):.2f}" if one else "—"
        print(f"| {g} | {width} | {m['evaluations']} ({m['passed']} passed) | {m['evals_per_min']:.1f} | {eff} | "
              f"{', '.join(f'{v:.2f}' for v in m['busy_share'].values())} | {m['rounds_to_best']} | "
              f"{m['wm_ms_per_round']:.1f} | {m['best_over_seed']:.3f}x |" if m["best_over_seed"] else "| — |")
    (Path(args.out) / "scaling.json").write_text(json.dumps([{"gpus": g, "width": w, **m} for g, w, m in rows], indent=2))
    if args.no_compare:
        return
    print(f"\nSide by side on `{args.compare_workloads}` (one evaluator, fresh mode; geomean latency ms, speedup over the baseline):")
    print("| solution | status | geomean ms | vs baseline |\n|---|---|---|---|")
    print("\n".join(side_by_side(dirs, args.compare_workloads, args.device)))


if __name__ == "__main__":
    main()
