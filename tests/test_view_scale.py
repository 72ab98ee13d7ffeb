"""The read model stays linear in a run's length: `show` and `report` of a 10,000-round run (issue 42)."""

from __future__ import annotations

import time

from ksearch_ray.events import Candidate, CycleStart, Evaluation, RunView
from ksearch_ray.models import EvalResult, Status


def _events(rounds: int) -> list:
    result = EvalResult(solution_id="s", solution_name="k", task="toy", status=Status.PASSED, workload_set="tests",
                        mode="fresh", device="cpu", score=1.0)
    events: list = [CycleStart(seq=1, t=0.0, cycle="c1", node="n1")]
    for r in range(1, rounds + 1):
        sid = f"s{r}"
        events.append(Candidate(seq=len(events) + 1, t=float(r), round=r, cycle="c1", node="n1",
                                attempt_kind="improve", solution_id=sid))
        events.append(Evaluation(seq=len(events) + 1, t=float(r), round=r, cycle="c1", node="n1", evaluator=0,
                                 solution_id=sid, result=result.model_copy(update={"solution_id": sid})))
    return events


def _reduce_s(events: list) -> float:
    best = float("inf")
    for _ in range(3):
        start = time.process_time()
        RunView.of(events)
        best = min(best, time.process_time() - start)
    return best


def test_one_long_cycle_is_reduced_in_time_linear_in_its_attempts():
    # One cycle holding every attempt: each evaluation finds its attempt by round. A scan of the cycle's
    # attempts made this quadratic (19x the time for 6x the rounds, on a 2-core CPU machine); the index by
    # round brought it to 9x (CPU time, the best of three).
    small, large = _events(1000), _events(6000)
    ratio = _reduce_s(large) / _reduce_s(small)
    assert ratio < 13, f"6x the rounds took {ratio:.1f}x the time to reduce"


def test_an_evaluation_is_filed_under_the_first_attempt_of_its_round():
    events = _events(3)
    view = RunView.of(events)
    record = view.cycles["c1"]
    assert [a.round for a in record.attempts] == [1, 2, 3]
    assert view.attempt_at(2, "c1") is record.attempts[1]
    assert view.attempt_at(9, "c1") is None


def test_show_and_report_read_a_run_without_polars_and_their_rows_agree_with_its_frames(tmp_path):
    """`show` and `report` draw plain rows (polars' import is a third of `show`'s time); the frames that report's
    readers and the analysis use are the same rows, and the ledger's sums and means are polars' own."""
    import subprocess
    import sys

    import polars as pl

    from ksearch_ray.events import LlmCallEvent
    from ksearch_ray.policies.llm_call import LLMCall
    from ksearch_ray.report.run_tables import Run

    calls = [("planner", "plan", 10, 0.5, False, None, 1.5), ("coder", "generate", 20, None, True, None, 0.5),
             ("coder", "generate", 5, 0.25, False, "rate_limit: 429", 2.5), ("planner", "plan", 7, 0.125, False, None, 0.5)]
    events = _events(3) + [
        LlmCallEvent(seq=100 + i, t=10.0 + i, role=role, call=LLMCall(
            kind=kind, model="m", request_hash=f"h{i}", prompt_tokens=tokens, completion_tokens=1, cost_usd=cost or 0.0, cost_known=cost is not None,
            cached=cached, error=error, latency_s=latency))
        for i, (role, kind, tokens, cost, cached, error, latency) in enumerate(calls)]
    run = Run(tmp_path, {}, RunView.of(events))
    expected = (run.llm_calls.group_by("role", "kind").agg(
        calls=pl.len(), cached=pl.col("cached").sum(), failed=pl.col("failed").sum(),
        prompt_tokens=pl.col("prompt_tokens").sum(), completion_tokens=pl.col("completion_tokens").sum(),
        cost_usd=pl.col("cost_usd").sum(), mean_latency_s=pl.col("latency_s").mean()).sort("role", "kind"))
    assert run.ledger().equals(expected) and run.ledger_rows() == expected.rows(named=True)
    assert run.ledger_rows()[0]["calls"] == 2 and run.ledger_rows()[0]["failed"] == 1
    assert run.evaluations.rows(named=True) == run.evaluation_rows and len(run.evaluation_rows) == 3
    assert run.llm_calls.rows(named=True) == run.llm_call_rows

    code = ("import sys, ksearch_ray.cli, ksearch_ray.report.run_tables, ksearch_ray.report.run_summary, "
            "ksearch_ray.report.console, ksearch_ray.report.html; print('polars' in sys.modules)")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "False", "the modules show and report import pull in polars"
