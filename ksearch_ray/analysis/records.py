"""One run directory as plain records: one dict per evaluation, one dict for the run.

Built from the run's read model (`events.RunView`, the reducer the live run and every other reader
use), so the frames say what `ksearch show` says: the best is the run's confirmed best (as last
measured beside the baseline), finished means a `run_end` no `resume` followed, times are active
wall-clock seconds (the gaps before a `ksearch resume` are not counted). Needs no Ray and no polars
(the lent GPU machine has none, and the experiment launchers use it there to see which cells are
complete); `runs.py` turns the records into polars frames, whose schemas document every field.
"""

from __future__ import annotations

import bisect
from pathlib import Path
from typing import Any

from ksearch_ray.events import RunView
from ksearch_ray.models import EvalResult
from ksearch_ray.store import RunDirError, RunStore, read_manifest


def find_runs(root: Path) -> list[Path]:
    """Every run directory under `root` (a directory holding manifest.json and events.jsonl)."""
    root = Path(root)
    found = {p.parent for p in root.rglob("manifest.json") if (p.parent / "events.jsonl").is_file()}
    return sorted(found)


def read_view(run_dir: Path) -> tuple[dict[str, Any], RunView]:
    run_dir = Path(run_dir)
    try:
        manifest = read_manifest(run_dir)
    except RunDirError as exc:
        raise RunDirError(f"{run_dir}: no readable manifest.json ({exc})") from None
    store = RunStore(run_dir)
    store.check_schema()
    return manifest, RunView.of(store.read_events(), store.has_solution)


def read_run(run_dir: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(one dict per evaluation, one dict for the run), shaped as the two schemas."""
    run_dir = Path(run_dir)
    manifest, view = read_view(run_dir)
    config = manifest.get("config", {})
    search, budget = config.get("search") or {}, {**(config.get("budget") or {}), **view.budget}
    model = (config.get("llm") or {}).get("model")
    label = {
        "run": run_dir.name, "task": Path(str(config.get("task", ""))).name, "method": search.get("method", "ksearch"),
        "width": search.get("width"), "random_seed": search.get("random_seed", 0), "policy": model or "offline",
    }
    rows: list[dict[str, Any]] = []
    best_seqs = [b.seq for b in view.best_rows]
    for i, r in enumerate(view.rows):
        if r.origin not in ("seed", "candidate", "tune") or r.solution_id is None:
            continue
        # The run's best (confirmed bests only) once this evaluation and what it led to (tuning,
        # re-timing) are in: the last change of the best before the next evaluation.
        boundary = view.rows[i + 1].seq if i + 1 < len(view.rows) else None
        changes = bisect.bisect_left(best_seqs, boundary) if boundary is not None else len(best_seqs)
        best_so_far = view.best_rows[changes - 1].speedup if changes else None
        rows.append({
            **label, "round": 0 if r.origin == "seed" else r.round,
            "kind": "seed" if r.origin == "seed" else ("tune" if r.origin == "tune" else r.attempt_kind or ""),
            "solution_id": r.solution_id, "status": r.status, "passed": r.status == "PASSED",
            "workloads": view.results_at[r.seq].workload_set, "speedup": r.speedup, "best_so_far": best_so_far,
            "wall_s": r.active_s, "cost_usd": r.cost_usd, "llm_tokens": r.llm_tokens, "evaluator": r.evaluator,
            "gpu": r.gpu, "eval_s": r.seconds, **figures(view.results_at[r.seq]),
        })
    candidates = [r for r in view.rows if r.origin == "candidate"]
    evaluated = [r for r in candidates if r.solution_id is not None]
    failed = sum(1 for r in evaluated if r.status != "PASSED")
    no_code = sum(1 for r in candidates if r.solution_id is None)
    first_candidate = next((e.seq for e in view.events if e.kind == "candidate"), None)
    first_s = next((row.active_s for row in view.timeline if row.seq == first_candidate), None)
    last_eval_s = evaluated[-1].active_s if evaluated else None
    search_s = last_eval_s - first_s if first_s is not None and last_eval_s is not None else None
    evaluators = {e for e in view.gpu_of}
    busy = sum(sum(end.evaluator_busy_s.values()) for end in view.run_ends)
    session = sum(end.session_wall_s for end in view.run_ends)
    confirm = next(iter(view.confirms.values()), None) if view.confirms else None
    seed = view.seed
    best = view.best
    run = {
        **label, "run_dir": str(run_dir.resolve()), "device": (config.get("evaluation") or {}).get("device"),
        "gpu": next(iter(view.gpu_of.values()), None), "evaluators": len(evaluators) or None,
        "rounds_budget": budget.get("rounds"), "cost_budget_usd": budget.get("max_cost_usd"), "rounds": view.rounds_used,
        "evaluations": len(evaluated), "passed": len(evaluated) - failed, "no_code": no_code,
        "failure_rate": (failed + no_code) / len(candidates) if candidates else None,
        "seed_speedup": seed.speedup if seed else None, "best_speedup": best.speedup if best else None,
        "best_solution_id": best.solution_id if best else None, "best_round": best.round if best else None,
        "confirmed_speedup": confirm.best_speedup.median if confirm and confirm.best_speedup else None,
        "cost_usd": view.llm_cost_usd, "llm_tokens": view.llm_tokens, "llm_calls": view.llm_call_count,
        "wall_s": view.active_s, "search_s": search_s,
        "evals_per_min": 60.0 * len(evaluated) / search_s if search_s else None,
        "evaluator_busy_s": busy, "session_wall_s": session,
        "busy_share": busy / (session * max(len(evaluators), 1)) if session else None,
        "finished": view.finished, "complete": view.finished is not None,
    }
    return rows, run


def figures(result: EvalResult) -> dict[str, Any]:
    """The objective and both figures of one evaluation (geomeans over its workloads, ms)."""
    timed = any(w.timing for w in result.workloads)
    return {"objective": result.objective if timed else None,
            "kernel_ms": result.figure_ms("kernel"), "call_ms": result.figure_ms("call")}
