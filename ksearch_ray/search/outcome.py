"""What a finished session tells the user: counts, the seed, the best, how sure we are, where."""

from __future__ import annotations

from pathlib import Path

from ksearch_ray.search.measure import Spread, with_noise
from ksearch_ray.search.runstate import RunState


def outcome_lines(state: RunState, run_dir: Path) -> list[str]:
    lines = [f"finished ({state.finished}): {state.rounds_used} rounds, {state.evaluations} evaluations"]
    seed, best = state.seed, state.best
    gpus = sorted(state.best_by_gpu) or [""]
    for gpu in gpus:
        noise = state.noise(gpu)
        where = f" on {gpu}" if len(gpus) > 1 else ""
        gpu_best = state.best_by_gpu.get(gpu) or best
        if seed and seed.get("speedup") is not None:
            lines.append(f"seed{where}: {with_noise(seed['speedup'], noise)} over the baseline")
        if gpu_best is None:
            lines.append(f"best{where}: nothing passed that could be compared with the baseline")
            continue
        if seed and gpu_best["solution_id"] == seed.get("solution_id"):
            lines.append(f"best{where}: the seed; the search found nothing faster")
        else:
            lines.append(f"best{where}: {with_noise(gpu_best['speedup'], noise)} over the baseline "
                         f"(node {gpu_best['node']}, round {gpu_best['round']}, solution {gpu_best['solution_id']})")
        confirm = state.confirms.get(gpu)
        if confirm and confirm.get("solution_id") == gpu_best["solution_id"]:
            spread = Spread(**confirm["best_speedup"]) if confirm.get("best_speedup") else None
            timed = f"{spread.text()} over the baseline; " if spread else ""
            lines.append(f"re-timed {len(confirm['repeats'])}x, interleaved with the baseline: {timed}{confirm['verdict']}")
    if state.best:
        lines.append(f"best kernel: {run_dir / 'best'} (record: {run_dir / 'best.json'})")
    lines.append(f"run directory: {run_dir}")
    return lines
