"""Autotuning of a passed candidate's tunables, before the method (and its planner) sees the result.

Any candidate may declare tunables, as the seeds do (`taskspec/tunables.py`): `BLOCK_N = 64  #
tunable: [32, 64, 128]`. When one passes and `autotune_variants` is above zero, the tuner spends up
to that many evaluations on variants of it that differ only in those constants, so the LLM writes
the structure and the tuner sets the numbers:

    point = the candidate's values
    repeat: evaluate, side by side on the pool, every untried neighbour of `point` (each
            tunable one choice up or down); move to the fastest passing one if it beats the
            point by more than the measured noise; stop when none does or the budget is spent

Each variant is a full evaluation (correctness on every workload, then timing), logged as a
`tune` event; a `tuned` event then says which solution the attempt keeps. The attempt (and so the
world model's node, the planner's evidence, the best and the run directory) carries the tuned
kernel from then on. Variants spend evaluations, not rounds: rounds count the coder's kernels.
A session that dies while tuning leaves the attempt untuned; a resume does not tune it again.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ksearch_ray.events import Tune, Tuned
from ksearch_ray.methods.context import Evaluations, RunRecord, Where
from ksearch_ray.models import EvalResult, Solution
from ksearch_ray.policies.contract import Attempt
from ksearch_ray.taskspec.tunables import TunableError, declared_tunables, with_values


def tunable_values(solution: Solution) -> dict[str, Any]:
    """The values of a kernel's declared tunables; none when it declares none or its markers are malformed (the
    candidate is then measured as written)."""
    try:
        return {name: t.value for name, t in declared_tunables(solution).items()}
    except TunableError:
        return {}


def neighbours(solution: Solution, point: dict[str, Any]) -> list[dict[str, Any]]:
    """The values one step away from `point`: each tunable one choice up, then one down."""
    out = []
    for name, tunable in declared_tunables(solution).items():
        index = tunable.choices.index(point[name])
        for step in (1, -1):
            if 0 <= index + step < len(tunable.choices):
                out.append({**point, name: tunable.choices[index + step]})
    return out


def variant(solution: Solution, values: dict[str, Any], changed: dict[str, Any]) -> Solution:
    label = ", ".join(f"{k}={v!r}" for k, v in changed.items())
    return Solution(**{
        **solution.model_dump(), "sources": with_values(solution, values), "name": f"{solution.name}-tuned",
        "author": "tuner", "parent_id": solution.id,
        "description": f"{solution.description} [tuned: {label}]".strip(),
    })


_Measured = tuple[Solution, EvalResult, int, float | None, dict[str, Any]]


async def autotune(run: RunRecord, evals: Evaluations, attempt: Attempt, where: Where) -> None:
    """Tune a passed attempt's tunables (see the module's docstring); the `tuned` event updates the attempt."""
    budget = run.config.search.autotune_variants
    if budget <= 0 or not attempt.passed or attempt.speedup is None or attempt.evaluator is None:
        return
    assert attempt.solution_id is not None and attempt.result is not None
    original = evals.solution(attempt.solution_id)
    start = tunable_values(original)
    if not start:
        return
    best: tuple[Solution, EvalResult, int, float] = (original, attempt.result, attempt.evaluator, attempt.speedup)
    point, tried, spent = dict(start), {repr(sorted(start.items()))}, 0
    run.say(f"round {attempt.round}: tuning {len(start)} tunable(s) of {original.name} (up to {budget} variants)")
    while spent < budget and run.budget_left() in (None, "rounds"):  # rounds count kernels written, not variants
        batch = [v for v in neighbours(original, point) if repr(sorted(v.items())) not in tried][: budget - spent]
        if not batch:
            break
        tried |= {repr(sorted(v.items())) for v in batch}
        spent += len(batch)
        measured = await asyncio.gather(*(_measure(run, evals, attempt, original, start, values, where) for values in batch))
        passing = [(sol, res, ev, value, vals) for sol, res, ev, value, vals in measured if value is not None]
        if not passing:
            break
        fastest = max(passing, key=lambda m: m[3] or 0.0)
        assert fastest[3] is not None
        noise = evals.noise(fastest[2])
        if fastest[3] <= best[3] * (1.0 + (noise.value if noise else 0.0)):
            break
        best, point = (fastest[0], fastest[1], fastest[2], fastest[3]), fastest[4]
    tuned, _result, evaluator, speedup = best
    values = {k: v for k, v in point.items() if start[k] != v}
    before = attempt.speedup
    run.record(Tuned(round=attempt.round, original=original.id, solution_id=tuned.id, values=values, variants=spent,
                     speedup_before=before, speedup=speedup, evaluator=evaluator, **where.fields()))
    if tuned.id == original.id:
        run.say(f"round {attempt.round}: tuning found nothing faster in {spent} variant(s)")
        return
    run.say(f"round {attempt.round}: tuned {', '.join(f'{k}={v!r}' for k, v in values.items())}: "
            f"{before:.3g}x -> {speedup:.3g}x ({spent} variant(s))")


async def _measure(run: RunRecord, evals: Evaluations, attempt: Attempt, original: Solution, start: dict[str, Any],
                   values: dict[str, Any], where: Where) -> _Measured:
    changed = {k: v for k, v in values.items() if start[k] != v}
    solution = variant(original, values, changed)
    evals.save_solution(solution)
    result, evaluator, value = await evals.measure(solution)
    run.record(Tune(round=attempt.round, original=original.id, solution_id=solution.id, values=changed,
                    evaluator=evaluator, gpu=evals.gpu_name(evaluator), result=result, speedup=value, **where.fields()))
    return solution, result, evaluator, value, values
