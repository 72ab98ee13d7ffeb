"""Speedup of a candidate over the baseline, by the task's score rule."""

from __future__ import annotations

from ksearch_ray.models import EvalResult
from ksearch_ray.taskspec.spec import TaskDefinition


def speedup(task: TaskDefinition, baseline: EvalResult, candidate: EvalResult) -> float | None:
    """geomean_latency: ratio of geometric-mean latencies. mean_speedup (FlashInfer-Bench):
    arithmetic mean over workloads of baseline/candidate latency. None unless both passed and
    were timed on the same workloads."""
    if not (baseline.passed and candidate.passed and baseline.timed and candidate.timed):
        return None
    if task.score.kind == "geomean_latency":
        if not baseline.score or not candidate.score:
            return None
        return baseline.score / candidate.score
    base = {w.workload: w.timing.mean_ms for w in baseline.workloads if w.timing}
    ratios = [base[w.workload] / w.timing.mean_ms for w in candidate.workloads if w.timing and w.workload in base]
    if not ratios or len(ratios) != len(base):
        return None
    return sum(ratios) / len(ratios)
