"""One run directory as plain records: one dict per evaluation, one dict for the run.

Reads only `manifest.json` and `events.jsonl`, so it works on run directories copied off a cluster,
never needs Ray, and needs no polars (the lent GPU machine has none, and the experiment launchers use
it there to see which cells are complete). `runs.py` turns the records into polars frames; its schemas
document every field. Times are *active* wall-clock seconds since the run started: the gap between a
session's end and the next `ksearch resume` is not counted, as in the run's own wall-clock budget.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ksearch_ray.search.store import RunDirError, RunStore


def find_runs(root: Path) -> list[Path]:
    """Every run directory under `root` (a directory holding manifest.json and events.jsonl)."""
    root = Path(root)
    found = {p.parent for p in root.rglob("manifest.json") if (p.parent / "events.jsonl").is_file()}
    return sorted(found)


def _active_times(events: list[dict[str, Any]]) -> list[float]:
    """Per event, active seconds since the run started (a `resume` restarts the clock where it stopped)."""
    out, offset, start, last = [], 0.0, None, None
    for ev in events:
        if ev["kind"] == "resume" and start is not None and last is not None:
            offset += last - start
            start = None
        if start is None:
            start = ev["t"]
        last = ev["t"]
        out.append(offset + ev["t"] - start)
    return out


def read_run(run_dir: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(one dict per evaluation, one dict for the run), shaped as the two schemas."""
    run_dir = Path(run_dir)
    try:
        manifest = json.loads((run_dir / "manifest.json").read_text())
    except (OSError, ValueError) as exc:
        raise RunDirError(f"{run_dir}: no readable manifest.json ({exc})") from None
    events = RunStore(run_dir).read_events()
    config = manifest.get("config", {})
    label = {
        "run": run_dir.name, "task": Path(str(config.get("task", ""))).name, "method": config.get("method", "ksearch"),
        "width": config.get("width"), "random_seed": config.get("random_seed", 0), "policy": config.get("model") or "offline",
    }
    times = _active_times(events)
    rows: list[dict[str, Any]] = []
    kinds: dict[int, str] = {}
    cost, tokens, calls, best = 0.0, 0, 0, None
    no_code = candidates = 0
    first_candidate_s = last_eval_s = None
    busy = session = 0.0
    evaluators: set[int] = set()
    gpu = None
    seed_speedup = confirmed = None
    best_id = best_round = None
    for ev, t in zip(events, times, strict=True):
        kind = ev["kind"]
        if kind == "llm_call":
            cost += float(ev["call"].get("cost_usd") or 0.0)
            tokens += int(ev["call"].get("prompt_tokens") or 0) + int(ev["call"].get("completion_tokens") or 0)
            calls += 1
        elif kind == "baseline":
            evaluators.add(int(ev.get("evaluator", 0)))
            gpu = gpu or ev.get("gpu")
        elif kind == "candidate":
            candidates += 1
            no_code += ev.get("solution_id") is None
            kinds[ev["round"]] = ev.get("attempt_kind", "")
            first_candidate_s = t if first_candidate_s is None else first_candidate_s
        elif kind in ("seed", "evaluation", "tune") and ev.get("solution_id") and ev.get("result"):
            result = ev["result"]
            passed = result.get("status") == "PASSED"
            speedup = ev.get("speedup") if passed else None
            if speedup is not None and (best is None or speedup > best):
                best = speedup
            if kind == "seed":
                seed_speedup = speedup
            else:
                last_eval_s = t
            rows.append({
                **label, "round": 0 if kind == "seed" else ev["round"],
                "kind": kind if kind in ("seed", "tune") else kinds.get(ev["round"], ""),
                "solution_id": ev["solution_id"], "status": result.get("status"), "passed": passed, "workloads": result.get("workload_set"), "speedup": speedup,
                "best_so_far": best, "wall_s": t, "cost_usd": cost, "llm_tokens": tokens, "evaluator": ev.get("evaluator"),
                "gpu": ev.get("gpu"), "eval_s": result.get("seconds"),
            })
        elif kind == "best":
            best_id, best_round = ev["solution_id"], ev["round"]
        elif kind == "confirm" and ev.get("best_speedup"):
            confirmed = ev["best_speedup"].get("median")
        elif kind == "run_end":
            busy += sum(float(v) for v in (ev.get("evaluator_busy_s") or {}).values())
            session += float(ev.get("session_wall_s") or 0.0)
    # A session that ended normally wrote `run_end` last; a later session starts with `resume`.
    finished = events[-1]["reason"] if events and events[-1]["kind"] == "run_end" else None
    evaluations = sum(1 for r in rows if r["kind"] != "seed")
    failed = sum(1 for r in rows if r["kind"] != "seed" and not r["passed"])
    search_s = (last_eval_s - first_candidate_s) if first_candidate_s is not None and last_eval_s is not None else None
    n_eval = max(len(evaluators), 1)
    run = {
        **label, "run_dir": str(run_dir.resolve()), "device": config.get("device"), "gpu": gpu, "evaluators": len(evaluators) or None,
        "rounds_budget": config.get("rounds"), "cost_budget_usd": config.get("max_cost_usd"), "rounds": candidates,
        "evaluations": evaluations, "passed": evaluations - failed, "no_code": no_code,
        "failure_rate": (failed + no_code) / candidates if candidates else None, "seed_speedup": seed_speedup,
        "best_speedup": best, "best_solution_id": best_id, "best_round": best_round, "confirmed_speedup": confirmed,
        "cost_usd": cost, "llm_tokens": tokens, "llm_calls": calls, "wall_s": times[-1] if times else 0.0,
        "search_s": search_s, "evals_per_min": 60.0 * evaluations / search_s if search_s else None,
        "evaluator_busy_s": busy, "session_wall_s": session,
        "busy_share": busy / (session * n_eval) if session else None, "finished": finished, "complete": finished is not None,
    }
    _budget_changes(events, run)
    return rows, run


def _budget_changes(events: list[dict[str, Any]], run: dict[str, Any]) -> None:
    """`ksearch resume --rounds N` changes the budget from then on: the run row shows the last one."""
    for ev in events:
        budget = ev.get("budget") if ev["kind"] == "resume" else None
        if budget:
            run["rounds_budget"] = budget.get("rounds", run["rounds_budget"])
            run["cost_budget_usd"] = budget.get("max_cost_usd", run["cost_budget_usd"])
