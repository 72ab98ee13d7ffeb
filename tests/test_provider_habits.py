"""Each habit of a real provider, through the LLM stand-in on loopback and litellm's real HTTP client,
in a whole K-Search run in this process. Evaluators are fakes that judge the stand-in's toy kernels by
their tunables (the sandbox has tests of its own), so every test asserts what the loop did: the rounds
spent, the world model's state and the ledger.

Slow habits run on a compressed clock: an outage "of minutes" is one of two seconds against an
allowance of thirty (the same ratio of waiting to allowance as three minutes against the default
thirty), backoffs are tens of milliseconds, a "60-second call" takes half a second.
"""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import Any

import pytest
from local_backends import FakeEvaluators, local_search, settings

from ksearch_ray.events import Candidate, CycleEnd, LlmCallEvent, Outage, RunView, Stopped
from ksearch_ray.models import Solution, Status
from ksearch_ray.policies.llm.llm_policy import LLMPolicy
from ksearch_ray.policies.standin.habits import Habits
from ksearch_ray.policies.standin.server import StandIn
from ksearch_ray.run.engine import Search
from ksearch_ray.run.errors import SearchError
from ksearch_ray.run.local import LocalPolicy
from ksearch_ray.taskspec.tunables import read_tunables
from ksearch_ray.worldmodel.tree import NodeStatus, NoteKind

QUIET = {"other_shape": 0, "prose_only": 0, "broken_json": 0, "coder_prose_only": 0, "code_drift": 0, "broken_code": 0,
         "breakage_actions": 0, "risky_changes": 0, "missing_fields": 0, "rate_limit_every": 0}
"""A stand-in that follows every format, so a test sees one habit at a time."""
RUN = {"model": "hosted_vllm/standin", "from_solution": "triton_seed", "width": 2, "rounds": 6, "stagnation_window": 2,
       "parent_patience": 2, "max_retries": 0, "backoff_base_s": 0.01, "backoff_max_s": 0.05, "timeout_s": 20,
       "outage_s": 30.0}
FAILED_CALL = ("LLM call failed", "rate_limit", "server:", "timeout:", "connection:", "content_policy")


def judge(solution: Solution) -> tuple[float | None, Status, str]:
    """The baseline 1 ms; the stand-in's kernels by their tunables (larger blocks faster), broken drafts as
    the evaluator would judge them."""
    source = solution.sources.get("axpy.py")
    if source is None:
        return 1.0, Status.PASSED, ""
    try:
        compile(source, "axpy.py", "exec")
    except SyntaxError as exc:
        return None, Status.COMPILE_ERROR, f"SyntaxError: {exc.msg} (axpy.py:{exc.lineno})"
    if ") * 1.5" in source:
        return None, Status.INCORRECT_NUMERICAL, "n4096: 4096 of 4096 elements outside tolerance; first at [0]: got 1.5, expected 1"
    values = {n: t.value for n, t in read_tunables(source).items()}
    return 100.0 / float(values.get("BLOCK", 64)) + values.get("NUM_WARPS", 4) / 100.0, Status.PASSED, ""


def search_against(tmp_path: Path, server: StandIn, **config: Any) -> Search:
    settings_ = RUN | {"api_base": server.api_base} | config
    llm = settings(task="toy_axpy", **settings_).llm
    policy = LocalPolicy(LLMPolicy(llm, cache_dir=tmp_path / "cache"))
    return local_search(tmp_path, policy, policy, FakeEvaluators(judge), **settings_)  # type: ignore[arg-type]


def run(search: Search) -> RunView:
    """As `ksearch run` does: an error that stops the run is logged as `stopped`, and the run stays resumable."""
    try:
        return asyncio.run(search.run())
    except SearchError as exc:
        search.record(Stopped(reason=str(exc)))
        raise


def calls(search: Search) -> list[Any]:
    return [e.call for e in search.store.read_events() if isinstance(e, LlmCallEvent)]


def assert_no_round_spent_on_failed_calls(search: Search) -> None:
    """Rounds are candidates, and no candidate, outcome or too-hard verdict came from a failed call."""
    events = search.store.read_events()
    candidates = [e for e in events if isinstance(e, Candidate)]
    view = search.view
    assert view.rounds_used == len(candidates)
    assert not [c for c in candidates if c.error and any(word in c.error for word in FAILED_CALL)]
    assert view.tree is not None
    for node in view.tree.nodes.values():
        text = " ".join(n.text for n in node.notes) + (node.outcome.failures if node.outcome else "")
        assert not any(word in text for word in FAILED_CALL), (node.id, text)


def assert_the_ledger_counts_every_request(search: Search, server: StandIn) -> None:
    ledger = calls(search)
    assert sum(c.attempts for c in ledger) == len(server.exchanges)
    assert search.view.llm_tokens == sum(c.prompt_tokens + c.completion_tokens for c in ledger)


# --- the provider's troubles that pass -------------------------------------------------------------------


def test_an_outage_spends_no_round_and_the_run_finishes_once_the_provider_answers(tmp_path):
    with StandIn(habits=Habits(**QUIET, outages=[(0.0, 2.0)])) as server:
        search = search_against(tmp_path, server)
        view = run(search)
    assert view.finished == "rounds" and view.rounds_used == 6
    outages = [e for e in search.store.read_events() if isinstance(e, Outage)]
    assert [o.state for o in outages] == ["began", "ended"] and outages[1].waited_s >= 1.5
    failed = [c for c in calls(search) if c.error_kind == "server"]
    assert failed and outages[1].failed_calls == len(failed)  # every failed call is in the ledger, none a round
    assert_no_round_spent_on_failed_calls(search)
    assert_the_ledger_counts_every_request(search, server)
    assert not any(n.status is NodeStatus.TOO_HARD for n in view.tree.nodes.values())  # type: ignore[union-attr]
    # A followed log and the report say it too.
    from ksearch_ray.report.console import event_line
    from ksearch_ray.report.html import render
    from ksearch_ray.report.run_tables import Run

    said = [event_line(o, 0.0) or "" for o in outages]
    assert "the LLM provider is failing" in said[0] and "answers again" in said[1]
    assert "LLM outages" in render(Run.load(search.store.root))


def test_an_outage_longer_than_the_allowance_stops_the_run_resumable_and_resume_finishes_it(tmp_path):
    with StandIn(habits=Habits(**QUIET, outages=[(0.0, 3600.0)])) as server:
        port = int(server.api_base.rsplit(":", 1)[1].split("/")[0])
        search = search_against(tmp_path, server, outage_s=0.5)
        started = time.monotonic()
        with pytest.raises(SearchError, match="outage allowance"):
            run(search)
        assert time.monotonic() - started < 10
        search.store.close()  # as `ksearch run` does when it exits
    events = search.store.read_events()
    assert isinstance(events[-1], Stopped) and "kept failing" in events[-1].reason
    assert [e.state for e in events if isinstance(e, Outage)] == ["began", "gave_up"]
    assert search.view.rounds_used == 0
    with StandIn(port, habits=Habits(**QUIET)) as healthy:  # the provider is back, at the same address
        again = search_against(tmp_path, healthy, outage_s=0.5)
        view = run(again)
    assert view.finished == "rounds" and view.rounds_used == 6 and view.resumes == 1
    assert_no_round_spent_on_failed_calls(again)


def test_a_429_with_retry_after_is_waited_out_by_the_client(tmp_path):
    with StandIn(habits=Habits(**QUIET | {"rate_limit_every": 1, "retry_after_s": 0.2})) as server:
        search = search_against(tmp_path, server, max_retries=2, rounds=3, width=1, backoff_max_s=1.0)
        view = run(search)
        limited = [x for x in server.exchanges if x.status == 429]
    assert view.finished == "rounds" and view.rounds_used == 3
    ledger = calls(search)
    assert all(c.error is None for c in ledger)  # each new prompt: a 429, then the reply, within one call
    retried = [c for c in ledger if c.attempts == 2]
    assert limited and len(retried) == len(limited) and all(c.latency_s >= 0.2 for c in retried)  # Retry-After honoured
    assert not [e for e in search.store.read_events() if isinstance(e, Outage)]  # never reached the engine
    assert_no_round_spent_on_failed_calls(search)
    assert_the_ledger_counts_every_request(search, server)


# --- errors that never clear --------------------------------------------------------------------------------


def test_an_exhausted_quota_stops_the_run_at_once(tmp_path):
    with StandIn(habits=Habits(**QUIET, quota_after=2)) as server:
        search = search_against(tmp_path, server, outage_s=3600.0)
        started = time.monotonic()
        with pytest.raises(SearchError, match="insufficient_quota|exceeded your current quota"):
            run(search)
        elapsed = time.monotonic() - started
    assert elapsed < 10  # no waiting on an error that never clears
    assert not [e for e in search.store.read_events() if isinstance(e, Outage)]
    assert [c.error_kind for c in calls(search) if c.error] == ["quota"]
    assert_no_round_spent_on_failed_calls(search)


# --- one request refused ---------------------------------------------------------------------------------------


def test_a_400_on_temperature_drops_the_parameter_for_the_model(tmp_path):
    with StandIn(habits=Habits(**QUIET, refuse_temperature=True)) as server:
        search = search_against(tmp_path, server, temperature=0.3, rounds=3, width=1)
        view = run(search)
        bodies = [x.body for x in server.exchanges]
    assert view.finished == "rounds" and view.rounds_used == 3
    assert "temperature" in bodies[0] and not any("temperature" in b for b in bodies[2:])
    ledger = calls(search)
    assert ledger[0].dropped_params == ["temperature"] and all(c.error is None for c in ledger)
    assert_no_round_spent_on_failed_calls(search)
    assert_the_ledger_counts_every_request(search, server)


def test_a_content_policy_refusal_is_one_failed_call_asked_again(tmp_path):
    with StandIn(habits=Habits(**QUIET, content_policy=40)) as server:
        search = search_against(tmp_path, server)
        view = run(search)
    assert view.finished == "rounds" and view.rounds_used == 6
    refused = [c for c in calls(search) if c.error_kind == "content_policy"]
    assert refused  # in the ledger, each followed by the same call asked again
    assert_no_round_spent_on_failed_calls(search)
    assert_the_ledger_counts_every_request(search, server)


def test_a_context_overflow_is_asked_again_with_a_smaller_prompt(tmp_path):
    with StandIn(habits=Habits(**QUIET, context_tokens=2_900)) as server:
        search = search_against(tmp_path, server, prompt_budget_tokens=50_000, rounds=4)
        view = run(search)
        prompts = [x for x in server.exchanges if x.status == 200]
    assert view.finished == "rounds" and view.rounds_used == 4
    overflows = [c for c in calls(search) if c.error_kind == "context_window"]
    assert overflows  # the 50,000-token budget did not fit; the smaller one did
    assert all(len(x.prompt) <= 2_900 * 3 for x in prompts)
    assert not [e for e in search.store.read_events() if e.kind == "plan_failed"]  # every plan fitted, in the end
    assert_no_round_spent_on_failed_calls(search)


def test_the_default_budget_follows_the_context_window_the_server_states(tmp_path):
    with StandIn(habits=Habits(**QUIET, context_tokens=3_000)) as server:
        search = search_against(tmp_path, server, rounds=4)
        view = run(search)
    assert view.finished == "rounds"
    assert not [c for c in calls(search) if c.error_kind == "context_window"]  # learnt from /v1/models, never overflowed


# --- replies in other shapes -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("habit", "where"), [("reasoning", "reasoning"), ("tool_calls", "tool_call")])
def test_replies_without_content_are_read_where_the_model_put_them(tmp_path, habit, where):
    with StandIn(habits=Habits(**QUIET, **{habit: 100})) as server:
        search = search_against(tmp_path, server, rounds=4)
        view = run(search)
    assert view.finished == "rounds" and view.rounds_used == 4
    ledger = calls(search)
    assert {c.answer_from for c in ledger} == {where}
    candidates = [e for e in search.store.read_events() if isinstance(e, Candidate)]
    assert all(c.solution_id for c in candidates)  # code came back every time
    assert view.tree is not None and len(view.tree.nodes) >= 2  # and so did the plans


def test_a_reply_cut_at_the_length_limit_is_continued(tmp_path):
    with StandIn(habits=Habits(**QUIET, truncate=100)) as server:
        search = search_against(tmp_path, server, rounds=4)
        view = run(search)
    assert view.finished == "rounds"
    ledger = calls(search)
    continued = [c for c in ledger if c.kind.endswith("_continue")]
    assert continued and all(c.finish_reason == "length" for c in ledger if not c.kind.endswith("_continue"))
    candidates = [e for e in search.store.read_events() if isinstance(e, Candidate)]
    assert all(c.solution_id for c in candidates)


# --- time -----------------------------------------------------------------------------------------------------------


def test_slow_calls_at_width_4_run_side_by_side_and_keep_their_leases(tmp_path):
    lines: list[str] = []
    with StandIn(habits=Habits(**QUIET, latency_s=(0.5, 0.5))) as server:
        search = search_against(tmp_path, server, width=4, rounds=8, lease_ttl_s=0.4, stagnation_window=1)
        search.on_line = lines.append
        started = time.monotonic()
        view = run(search)
        elapsed = time.monotonic() - started
        calls_made = len(server.exchanges)
    assert view.finished == "rounds" and view.rounds_used == 8
    assert elapsed < 0.5 * calls_made * 0.75  # calls overlapped: four cycles waited at once
    # Each call outlasts the lease (0.5 s against 0.4 s): renewed while waiting, none expired.
    assert not any("expired" in line for line in lines), [line for line in lines if "expired" in line]
    assert not [e for e in search.store.read_events() if isinstance(e, CycleEnd) and e.abandoned]
    assert_no_round_spent_on_failed_calls(search)


class SlowFirstCoder(StandIn):
    """A stand-in whose first coder call on n1 takes long, while the run's clock jumps past the lease."""

    def __init__(self, clock: dict[str, float], ttl: float, **kwargs: Any):
        super().__init__(**kwargs)
        self.clock, self.ttl, self.done = clock, ttl, False

    def respond(self, body: dict[str, Any]):  # type: ignore[no-untyped-def]
        answer = super().respond(body)
        prompt = "\n".join(str(m.get("content")) for m in body.get("messages") or [])
        if not self.done and "Call: generate_from_base" in prompt and re.search(r"^n1: ", prompt, re.MULTILINE):
            self.done = True
            self.clock["t"] += self.ttl + 1  # the driver stalled longer than the lease
            answer.delay_s = 1.5
        return answer


def test_a_lease_that_expires_mid_cycle_ends_that_cycle_cleanly(tmp_path):
    clock = {"t": 1_000_000.0}
    with SlowFirstCoder(clock, 60.0, habits=Habits(**QUIET)) as server:
        settings_ = RUN | {"api_base": server.api_base, "lease_ttl_s": 60.0, "rounds": 8, "stagnation_window": 1}
        policy = LocalPolicy(LLMPolicy(settings(task="toy_axpy", **settings_).llm))
        search = local_search(tmp_path, policy, policy, FakeEvaluators(judge), clock=lambda: clock["t"], **settings_)  # type: ignore[arg-type]
        view = run(search)
    assert view.finished is not None
    events = search.store.read_events()
    abandoned = [e for e in events if isinstance(e, CycleEnd) and e.abandoned == "its lease expired"]
    assert [e.node for e in abandoned] == ["n1"]  # the cycle that waited learnt it at its next renewal
    n1 = view.tree.nodes["n1"]  # type: ignore[union-attr]
    assert n1.status is not NodeStatus.LEASED and n1.status is not NodeStatus.TOO_HARD
    # Never two cycles to the end on one node: the one that lost its lease stopped, judged nothing.
    ends = [e for e in events if isinstance(e, CycleEnd) and e.node == "n1" and not e.abandoned]
    assert len(ends) <= 1
    assert not any(n.kind is NoteKind.TOO_HARD for n in n1.notes)


# --- done means -----------------------------------------------------------------------------------------------------


def test_a_width_8_search_through_an_outage_slow_reasoning_calls_and_400s_completes(tmp_path):
    habits = Habits(outages=[(1.0, 3.0)], latency_s=(0.05, 0.3), reasoning=50, refuse_temperature=True,
                    content_policy=10, rate_limit_every=5, breakages=["syntax", "scale"])
    with StandIn(seed=3, habits=habits) as server:
        search = search_against(tmp_path, server, width=8, rounds=24, temperature=0.5, outage_s=60.0, max_retries=1)
        view = run(search)
    assert view.finished == "rounds" and view.rounds_used == 24
    ledger = calls(search)
    kinds = {c.error_kind for c in ledger if c.error}
    assert "server" in kinds  # the outage, waited out
    assert any(c.dropped_params == ["temperature"] for c in ledger)
    assert any(c.answer_from == "reasoning" for c in ledger)
    assert_no_round_spent_on_failed_calls(search)
    assert_the_ledger_counts_every_request(search, server)
