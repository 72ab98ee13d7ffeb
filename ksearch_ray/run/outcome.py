"""What a finished session tells the user: counts, the seed, the best, how sure we are, where."""

from __future__ import annotations

from pathlib import Path

from ksearch_ray.events import RunView
from ksearch_ray.measure import format_noise, with_noise
from ksearch_ray.text import clip

NOTHING_EVALUATED_EXIT = 4
"""`ksearch run` / `resume`'s exit status when the run ended without evaluating a candidate of its own."""
EXTEND_FLAG = {"rounds": "--rounds N", "cost": "--max-cost-usd USD", "tokens": "--max-llm-tokens N",
               "wall clock": "--max-wall-s S"}
"""The `ksearch resume` option that extends a budget, by the reason the budget gives when it is spent."""


def nothing_evaluated(view: RunView) -> str | None:
    """One line saying why a run that ended evaluated no candidate of its own; None when it evaluated one (a run
    its budget stopped after real work is a success) or has not ended."""
    if view.finished is None or view.evaluations or view.tune_evaluations:
        return None
    candidates = len(view.round_numbers)
    if view.candidates_with_code:
        return (f"no candidate evaluated: {candidates} coder replies, {view.candidates_with_code} with code, none "
                f"evaluated before the run ended ({view.finished})")
    if candidates:
        first = view.first_candidate_error or "no code came back"
        return f"no candidate evaluated: {candidates} replies, none had usable code; first reason: {clip(first, 240)}"
    if view.llm_replies:
        plan = view.first_plan_failure or ""
        why = f"; first reason: {clip(plan, 240)}" if plan else ""
        return (f"no candidate evaluated: the run ended ({view.finished}) before a coder reply; {view.llm_replies} "
                f"replies{why}")
    if not view.llm_call_count:  # nothing was asked of a provider (the offline policy asks none): the budget went before a round
        return f"no candidate evaluated: the run ended ({view.finished}) before its first round; {session_start(view)}"
    last = view.llm_last_error
    said = f" ({view.llm_call_count} failed calls; the last: {clip(last, 200)})" if last else ""
    return f"no candidate evaluated: the LLM provider never answered{said}"


def session_start(view: RunView) -> str:
    """What the current session's start measured and how long it took (the wall budget's clock: from the
    session's first event to its last measurement)."""
    counts = {name: view.session_measured.get(key, 0)
              for name, key in (("the baseline", "baseline"), ("the seed", "seed"), ("the best so far", "best"))}
    what = " and ".join(f"{name} {n}x" for name, n in counts.items() if n) or "nothing"
    start = view.session_start_t
    took = f" took {view.session_measured_t - start:.1f} s" if view.session_measured_t is not None and start is not None else ""
    if view.finished == "wall clock" and view.confirms:
        took += ", and the wall budget held time back for the final re-timing"
    extend = EXTEND_FLAG.get(view.finished or "")
    more = f"; `ksearch resume RUN_DIR {extend}` gives it more" if extend else ""
    return f"measuring {what}{took}{more}"


def outcome_lines(view: RunView, run_dir: Path, policy: str = "") -> list[str]:
    by = f"; planner and coder: {policy}" if policy else ""
    counts = f"{view.rounds_used} rounds, {view.evaluations} evaluations{by}"
    nothing = nothing_evaluated(view)
    # A run that evaluated nothing does not say "finished": it says why, first.
    lines = [nothing, f"ended ({view.finished}): {counts}"] if nothing else [f"finished ({view.finished}): {counts}"]
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
