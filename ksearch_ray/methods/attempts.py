"""An attempt's evaluation, one way: judged (measured, recorded), tuned (`--autotune`), then noted as a best.

Every method evaluates its attempts here, after the coder's candidate is recorded and before it learns from
the result; the engine never calls back into a method.
"""

from __future__ import annotations

from ksearch_ray.methods.context import Evaluations, RunRecord, Where
from ksearch_ray.methods.tuner import autotune
from ksearch_ray.policies.contract import Attempt


async def evaluate(run: RunRecord, evals: Evaluations, attempt: Attempt, where: Where) -> None:
    """Measure and record the attempt, tune it (the `tuned` event updates it), note a new best."""
    await evals.judge(attempt, where)
    await autotune(run, evals, attempt, where)
    if attempt.solution_id is not None and attempt.evaluator is not None:
        await evals.note_best(attempt.solution_id, attempt.speedup, where.node or where.method or "", attempt.round,
                              attempt.evaluator)
