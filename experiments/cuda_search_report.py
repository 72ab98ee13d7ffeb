"""Where the GPUs' time went in searches over CUDA candidates, from their run directories alone.

    python experiments/cuda_search_report.py --run pool=/tmp/runs/pool --run nopool=/tmp/runs/nopool \
        [--cache /tmp/scratch-pool/build-cache]

Per run (`events.jsonl`, `manifest.json`), over the search phase (first candidate to the end):
  * evaluations of candidates, how many passed, evaluations per minute;
  * evaluator time: the sum of `EvalResult.seconds` (an evaluator holds its GPU for exactly this),
    split into compiling (`build_seconds`: the compile when the evaluation builds, or the load of
    a library built ahead of time), sandbox overhead, and measuring (correctness and timing);
  * share of evaluator time not spent compiling, and share spent measuring;
  * GPU utilisation: measuring time over (evaluators x search phase);
  * time to the first measured candidate: from the run's creation to the first `evaluation`
    event, and to the seed's verdict.
`--cache`: compile times of the builds in a build-cache directory (each record keeps its own).
Prints markdown tables, then one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def measure(run_dir: Path) -> dict:
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines() if line.strip()]
    created = json.loads((run_dir / "manifest.json").read_text())["created"]
    evals = [e for e in events if e["kind"] == "evaluation"]
    cands = [e for e in events if e["kind"] == "candidate"]
    # A run stopped from outside (the script's timeout) has no run_end: its last event ends it.
    end = next((e for e in events if e["kind"] == "run_end"), {**events[-1], "reason": "stopped from outside"})
    seed = next((e for e in events if e["kind"] == "seed"), None)
    t0 = cands[0]["t"] if cands else end["t"]
    phase = max(end["t"] - t0, 1e-9)
    held = sum(e["result"]["seconds"] for e in evals)
    build = sum(e["result"].get("build_seconds", 0.0) for e in evals)
    overhead = sum(e["result"]["overhead_seconds"] for e in evals)
    measuring = held - build - overhead
    evaluators = {e["evaluator"] for e in evals if e["evaluator"] >= 0}
    statuses: dict[str, int] = {}
    for e in evals:
        statuses[e["result"]["status"]] = statuses.get(e["result"]["status"], 0) + 1
    return {
        "evaluations": len(evals),
        "statuses": statuses,
        "verdicts_from_builds": sum(e["evaluator"] < 0 for e in evals),
        "search_phase_s": round(phase, 1),
        "evals_per_min": round(len(evals) / (phase / 60), 2),
        "evaluator_s": round(held, 1),
        "compile_or_load_s": round(build, 1),
        "overhead_s": round(overhead, 1),
        "measuring_s": round(measuring, 1),
        "share_not_compiling": round((held - build) / held, 3) if held else None,
        "share_measuring": round(measuring / held, 3) if held else None,
        "gpu_utilisation": round(measuring / (max(len(evaluators), 1) * phase), 3),
        "evaluators": len(evaluators),
        "first_measured_candidate_s": round(evals[0]["t"] - created, 1) if evals else None,
        "seed_verdict_s": round(seed["t"] - created, 1) if seed else None,
        "end_reason": end["reason"],
        "best_speedup": (end.get("best") or {}).get("speedup"),
    }


def cache_builds(cache: Path) -> dict:
    records = [json.loads(p.read_text()) for p in cache.glob("*/*/record.json")]
    seconds = sorted(r["seconds"] for r in records if r["status"] == "PASSED")
    return {
        "builds": len(records),
        "passed": len(seconds),
        "compile_s_median": round(statistics.median(seconds), 1) if seconds else None,
        "compile_s_min": round(seconds[0], 1) if seconds else None,
        "compile_s_max": round(seconds[-1], 1) if seconds else None,
        "library_mb_median": round(statistics.median(r["size"] for r in records if r["size"]) / 2**20, 2) if seconds else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", action="append", required=True, help="NAME=RUN_DIR (repeatable).")
    ap.add_argument("--cache", default=None, help="A build-cache directory to read compile times from.")
    args = ap.parse_args()
    out: dict = {"runs": {}}
    for item in args.run:
        name, _, path = item.partition("=")
        out["runs"][name] = measure(Path(path))
    cols = ["evaluations", "evals_per_min", "share_not_compiling", "share_measuring", "gpu_utilisation",
            "first_measured_candidate_s", "seed_verdict_s", "evaluator_s", "compile_or_load_s", "measuring_s", "end_reason"]
    print("| run | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for name, m in out["runs"].items():
        print(f"| {name} | " + " | ".join(str(m[c]) for c in cols) + " |")
    if args.cache:
        out["cache"] = cache_builds(Path(args.cache))
        print("\nbuilds in the cache:", json.dumps(out["cache"]))
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
