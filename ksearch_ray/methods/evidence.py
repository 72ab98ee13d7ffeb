"""What a cycle teaches, in the few lines a planner can act on.

An evaluation log can be thousands of lines; the planner needs the decisive part: the first
compiler errors, the exception with its last frames, or the mismatch summary (which workload,
which element, what value against what). Timings are given per workload against the parent and
the baseline, because an average hides the workload a change made worse.
"""

from __future__ import annotations

from ksearch_ray.models import EvalResult
from ksearch_ray.policies.contract import Attempt, AttemptEvidence, WorkloadTime
from ksearch_ray.policies.failure import decisive_text
from ksearch_ray.worldmodel.tree import EvalSummary

DIGEST_CHARS = 500
ERROR_CHARS = 1500
"""Of each failed attempt's evidence, what the planner is shown (the coder gets more)."""


def trim_error(result: EvalResult) -> str:
    """The decisive lines of a failed evaluation ('' when it passed)."""
    return decisive_text(result, ERROR_CHARS)


def workload_times(result: EvalResult | None, parent: EvalResult | None, baseline: EvalResult | None) -> list[WorkloadTime]:
    if result is None or not result.passed:
        return []

    def means(r: EvalResult | None) -> dict[str, float]:
        return {w.workload: w.timing.mean_ms for w in r.workloads if w.timing} if r else {}

    parent_ms, baseline_ms = means(parent), means(baseline)
    return [
        WorkloadTime(w.workload, w.timing.mean_ms, parent_ms.get(w.workload), baseline_ms.get(w.workload))
        for w in result.workloads if w.timing
    ]


def attempt_evidence(attempt: Attempt, change: str, parent: EvalResult | None, baseline: EvalResult | None,
                     parent_speedup: float | None) -> AttemptEvidence:
    result = attempt.result
    status = result.status.value if result else "NO_CODE"
    over_parent = attempt.speedup / parent_speedup if attempt.speedup and parent_speedup else None
    return AttemptEvidence(
        round=attempt.round, kind=attempt.kind, status=status, change=change,
        error=trim_error(result) if result else (attempt.error or "no code came back"),
        speedup=attempt.speedup, over_parent=over_parent, times=workload_times(result, parent, baseline),
    )


def failure_digest(evidence: list[AttemptEvidence]) -> str:
    """One line per failed attempt, newest last, within DIGEST_CHARS: the node's memory of why."""
    parts = []
    for e in evidence:
        if e.status == "PASSED":
            continue
        first = e.error.strip().splitlines()[0] if e.error.strip() else ""
        first = first.removeprefix(f"{e.status}:").strip()  # the evidence starts with its status already
        parts.append(f"round {e.round} {e.status}: {first[:160]}")
    text = "; ".join(parts)
    return text if len(text) <= DIGEST_CHARS else "..." + text[-(DIGEST_CHARS - 3):]


def eval_summary(result: EvalResult, speedup: float | None) -> EvalSummary:
    """What the world model keeps of an evaluation: status, score, speedup and the start of its log."""
    latency = result.score if result.score_kind.startswith("geomean") else None
    return EvalSummary(status=result.status, score=result.score, latency_ms=latency, speedup=speedup,
                       log=(result.message + "\n" + result.log).strip())
