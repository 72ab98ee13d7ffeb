"""A search never dies of its policies: a planner or coder that raises or replies out of contract is a
recorded fault (a `policy_fault` event, a bug report, no round spent), a policy that keeps failing stops
the run resumably, and whatever the policies say, the run ends cleanly and opens again.

The property test drives the real engine, world model and K-Search method in this process with random
policy replies; the evaluators are a fake (the sandbox has tests of its own)."""

from __future__ import annotations

import asyncio
import random
import zlib
from pathlib import Path

import pytest
from cli_runner import ksearch
from local_backends import FakeEvaluators, ScriptedPolicy, local_search, toy_kernel

from ksearch_ray import session
from ksearch_ray.events import Candidate, PolicyFault, RunView
from ksearch_ray.models import Solution, Status
from ksearch_ray.policies.contract import CodeReply, CodeRequest, PlanReply, PlanRequest
from ksearch_ray.policies.offline.offline_policy import OfflinePolicy
from ksearch_ray.run.errors import RunStopped
from ksearch_ray.run.local import LocalPolicy
from ksearch_ray.run.progress import PlainLines
from ksearch_ray.store import RunStore

BASELINE, SEED = "good", "triton_seed"


def judge(solution: Solution) -> tuple[float | None, Status, str]:
    """The task's own kernels pass; `broken*` does not compile; anything else passes at a time of its own."""
    if solution.name.startswith("broken"):
        return None, Status.COMPILE_ERROR, "SyntaxError: invalid syntax"
    if solution.name in (BASELINE, SEED):
        return (1.0 if solution.name == BASELINE else 2.0), Status.PASSED, ""
    return 0.5 + (zlib.crc32(solution.id.encode()) % 1000) / 500, Status.PASSED, ""


class Boom(Exception):
    """A policy's own bug."""


def random_policies(rng: random.Random, fault_rate: float) -> tuple[ScriptedPolicy, ScriptedPolicy]:
    counter = iter(range(1, 1_000_000))

    def fault() -> object:
        how = rng.choice(["raise", "raise", "wrong type"])
        if how == "raise":
            raise rng.choice([Boom, ValueError, KeyError, AssertionError, TypeError])("the policy's own bug")
        return {"not": "a reply"}

    def plan(request: PlanRequest) -> PlanReply:
        if rng.random() < fault_rate:
            return fault()  # type: ignore[return-value]
        what = rng.choice(["ops", "ops", "ops", "empty", "error"])
        if what == "error":
            return PlanReply(error="the reply held no ops")
        if what == "empty":
            return PlanReply()
        ops = [{"op": "insert", "parent": request.node_id or "root", "title": f"idea {len(request.tree.nodes)}-{i}",
                "difficulty": 1, "score": 0.5, "expected_speedup": 1.2} for i in range(rng.randint(1, 3))]
        return PlanReply(ops=ops)

    def code(request: CodeRequest) -> CodeReply:
        if rng.random() < fault_rate:
            return fault()  # type: ignore[return-value]
        what = rng.choice(["code", "code", "no code", "broken"])
        n = next(counter)
        if what == "no code":
            return CodeReply(error="the reply held no code block", reply_start="I cannot")
        return CodeReply(solution=toy_kernel(f"{'broken' if what == 'broken' else 'k'}{n}"))

    return ScriptedPolicy(plan=plan), ScriptedPolicy(code=code)


def run_to_end(tmp_path: Path, planner: object, coder: object, **config: object) -> tuple[RunView, str | None]:
    """A session as `ksearch run` drives it; its view and, when it stopped on an error, the one line."""
    search = local_search(tmp_path, planner, coder, FakeEvaluators(judge), **config)  # type: ignore[arg-type]
    try:
        session._run(search, PlainLines())
        return search.view, None
    except RunStopped as exc:
        return search.view, str(exc)
    finally:
        search.store.close()


def reopens(tmp_path: Path) -> None:
    """`show` and `resume` read the run: the log parses, `show` exits 0, a resumed session finishes."""
    root = tmp_path / "run"
    shown = ksearch(tmp_path, "show", str(root))
    assert shown.returncode == 0, shown.stderr
    before = RunView.of(RunStore(root).read_events())
    good_planner, good_coder = random_policies(random.Random(0), fault_rate=0.0)
    view, stopped = run_to_end(tmp_path, good_planner, good_coder, rounds=before.rounds_used + 2)
    assert stopped is None and view.finished is not None and view.resumes == before.resumes + 1


@pytest.mark.parametrize("width", range(1, 17))
def test_any_sequence_of_policy_replies_ends_the_search_cleanly_and_the_run_reopens(tmp_path, width):
    rng = random.Random(1000 + width)
    planner, coder = random_policies(rng, fault_rate=0.15)
    view, stopped = run_to_end(tmp_path, planner, coder, width=width, rounds=12, stagnation_window=2)
    assert (view.finished is not None) != (stopped is not None)
    if stopped is not None:  # only a policy failing FAULT_LIMIT times in a row may stop it
        assert "broke the policy contract" in stopped and view.stopped == stopped
    # Faults spend no round: every round is a candidate, and no candidate came from a faulty reply.
    events = RunStore(tmp_path / "run").read_events()
    candidates = [e for e in events if isinstance(e, Candidate)]
    assert sorted(c.round for c in candidates) == list(range(1, len(candidates) + 1))
    faults = [e for e in events if isinstance(e, PolicyFault)]
    for fault in faults:
        assert (tmp_path / "run" / fault.report).is_file()
    reopens(tmp_path)


def test_a_policy_that_keeps_failing_stops_the_run_resumably_with_one_line(tmp_path):
    def broken(request: CodeRequest) -> CodeReply:
        raise ValueError("debug needs the failing solution as request.current")

    planner, _ = random_policies(random.Random(1), fault_rate=0.0)
    view, stopped = run_to_end(tmp_path, planner, ScriptedPolicy(code=broken), rounds=5)
    assert stopped is not None and "\n" not in stopped
    assert "the coder broke the policy contract 5 times in a row" in stopped
    assert "ValueError: debug needs the failing solution" in stopped
    assert view.rounds_used == 0 and len(view.policy_faults) == 5  # no round spent
    report = (tmp_path / "run" / view.policy_faults[0].report).read_text()
    assert "Traceback" in report and "role: coder" in report
    reopens(tmp_path)


def test_the_offline_search_goes_on_after_an_attempt_without_code(tmp_path):
    """The offline crash: a cycle whose first attempt returned no code asked the offline policy to debug
    with no code to debug (a valid request), and it raised; the run died at round 11 of 40."""
    view, stopped = run_to_end(tmp_path, LocalPolicy(OfflinePolicy()), LocalPolicy(OfflinePolicy()), rounds=40)
    assert stopped is None, stopped
    assert view.finished is not None and view.policy_faults == []
    full = RunView.of(RunStore(tmp_path / "run").read_events())  # (the live view forgets ended cycles' candidates)
    no_code = [c for c in full.candidates.values() if c.solution_id is None]
    assert any(c.attempt_kind == "debug" for c in no_code), "the search never met the case"


def test_a_fault_in_a_ray_policy_actor_is_recorded_too():
    """Ray hands a remote exception over as a RayTaskError: the fault's line is the policy's own."""
    from ksearch_ray.run.faults import one_line

    class Wrapped(ValueError):
        def __init__(self) -> None:
            super().__init__("Traceback (most recent call last):\n  ...\nValueError: boom")
            self.cause = ValueError("boom")

    assert one_line(Wrapped()) == "ValueError: boom"
    assert asyncio.iscoroutinefunction(OfflinePolicy().code)
