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
