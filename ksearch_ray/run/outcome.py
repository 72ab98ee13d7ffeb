"""What a finished session tells the user: counts, the seed, the best, how sure we are, where."""

from __future__ import annotations

from pathlib import Path

from ksearch_ray.events import RunView
from ksearch_ray.measure import format_noise, with_noise


def outcome_lines(view: RunView, run_dir: Path, policy: str = "") -> list[str]:
    by = f"; planner and coder: {policy}" if policy else ""
    lines = [f"finished ({view.finished}): {view.rounds_used} rounds, {view.evaluations} evaluations{by}"]
    seed = view.seed
    gpus = sorted(view.best_by_gpu) or [""]
    for gpu in gpus:
        noise = view.noise(gpu) if gpu else view.noise()
        where = f" on {gpu}" if len(gpus) > 1 else ""
        best = view.best_by_gpu.get(gpu) or view.best
        if seed is not None and seed.solution_id and seed.speedup is not None:
            lines.append(f"seed{where}: {with_noise(seed.speedup, noise)} over the baseline")
        elif seed is not None and not seed.solution_id:
            lines.append("started from the specification (no seed kernel)")
        if best is None:
            lines.append(f"best{where}: nothing passed that could be compared with the baseline")
            continue
        if seed is not None and best.solution_id == seed.solution_id:
            why = f" ({best.why})" if best.why.startswith("back") else ""
            lines.append(f"best{where}: the seed; the search found nothing faster{why}")
        else:
            lines.append(f"best{where}: {with_noise(best.speedup, noise)} over the baseline "
                         f"(node {best.node}, round {best.round}, solution {best.solution_id})")
        confirm = view.confirms.get(gpu)
        if confirm is not None:
            timed = f"{confirm.best_speedup.text()} over the baseline; " if confirm.best_speedup else ""
            cut = f" (stopped early: {confirm.cut_short})" if confirm.cut_short else ""
            lines.append(f"re-timed {len(confirm.repeats)}x, interleaved with the baseline: {timed}{confirm.verdict}{cut}")
        lines.append(f"measurement {format_noise(noise)}")
    if view.best:
        lines.append(f"best kernel: {run_dir / 'best'} (record: {run_dir / 'best.json'})")
    lines.append(f"run directory: {run_dir}")
    return lines
