"""The K-Search control flow in plain Python (no Ray): cycles, stop rules, fallbacks, leases."""

from __future__ import annotations

import asyncio
import re

from local_backends import FakeEvaluators, ScriptedPolicy, local_search

from ksearch_ray.events import RunView
from ksearch_ray.methods.ksearch import KSearch
from ksearch_ray.models import Solution, Status
from ksearch_ray.policies.contract import CodeReply, CodeRequest, PlanReply, PlanRequest
from ksearch_ray.policies.llm_call import LLMCall
from ksearch_ray.worldmodel.api import ApplyOps, Renew, SelectAndLease
from ksearch_ray.worldmodel.tree import NodeStatus, NoteKind


def kernel(tag: str, n: int = 0) -> Solution:
    """A kernel whose first line says how it fares; `n` makes each reply's code its own."""
    return Solution(name=tag, task="toy_axpy", language="python", entry_file="k.py", entry_point="run",
                    sources={"k.py": f"# {tag}\n# reply {n}\ndef run(x, a, b):\n    return a * x + b\n"},
                    description=f"change: {tag}")


def judge(solution: Solution) -> tuple[float | None, Status, str]:
    """The baseline runs 1 ms, the seed 2 ms; a candidate says in its first line how it fares."""
    if solution.name == "good":
        return 1.0, Status.PASSED, ""
    if solution.name == "triton_seed":
        return 2.0, Status.PASSED, ""
    first = next(iter(solution.sources.values())).splitlines()[0]
    if match := re.match(r"# ms=([0-9.]+)", first):
        return float(match.group(1)), Status.PASSED, ""
    return None, Status.COMPILE_ERROR, f"build failed: {first[2:]}"


def insert(parent: str, title: str, **fields) -> dict:
    return {"op": "insert", "parent": parent, "title": title, "difficulty": 1, "score": 0.5, "expected_speedup": 1.2} | fields


def planner(first: list[dict], later: list[dict] | None = None) -> ScriptedPolicy:
    calls = {"n": 0}

    def plan(request: PlanRequest) -> PlanReply:
        calls["n"] += 1
        return PlanReply(ops=first if request.kind == "initialize_tree" else (later or []))

    return ScriptedPolicy(plan=plan)


def coder(*tags: str) -> ScriptedPolicy:
    queue = list(tags)
    replies = iter(range(1, 10_000))

    def code(request: CodeRequest) -> CodeReply:
        return CodeReply(solution=kernel(queue.pop(0) if queue else tags[-1], next(replies)))

    return ScriptedPolicy(code=code)


def run(search) -> object:
    return asyncio.run(search.run())


def test_a_cycle_cut_short_by_the_budget_goes_back_to_the_frontier_not_too_hard(tmp_path):
    plans = planner([insert("root", "tile")])
    search = local_search(tmp_path, plans, coder("broken"), FakeEvaluators(judge), rounds=2, stagnation_window=5)
    state = run(search)
    node = state.tree.nodes["n1"]
    assert state.finished == "rounds" and node.status is NodeStatus.OPEN
    assert node.outcome is not None and node.outcome.budget_cut and node.outcome.statuses == {"COMPILE_ERROR": 2}
    assert not any(n.kind is NoteKind.TOO_HARD for n in node.notes)
    assert [p.kind for p in plans.plans] == ["initialize_tree"]  # no too_hard verdict on an unjudged action


def test_a_cycle_stops_when_it_cannot_beat_its_parent_and_still_attaches_its_best(tmp_path):
    plans = planner([insert("root", "slower path")])
    search = local_search(tmp_path, plans, coder("ms=3.0"), FakeEvaluators(judge), rounds=10, stagnation_window=10,
                          parent_patience=2)
    state = run(search)
    events = search.store.read_events()
    stops = [e.reason for e in events if e.kind == "cycle_stop"]
    assert stops[0] == "cannot beat the parent"
    assert sum(e.kind == "candidate" and e.cycle == "c1" for e in events) == 2
    assert state.tree.nodes["n1"].status is NodeStatus.DONE  # a slower step may still lead somewhere
    assert "refine" in [p.kind for p in plans.plans]


def test_a_failed_action_keeps_the_system_verdict_and_the_planners_reason(tmp_path):
    def plan(request: PlanRequest) -> PlanReply:
        if request.kind == "initialize_tree":
            return PlanReply(ops=[insert("root", "fp16 accumulate")])
        if request.kind == "too_hard":
            evidence = request.evidence
            assert evidence and evidence[0].status == "COMPILE_ERROR" and "build failed" in evidence[0].error
            return PlanReply(ops=[{"op": "mark_too_hard", "node": request.node_id, "reason": "fp16 overflows"},
                                  {"op": "split", "node": request.node_id, "alternatives": [
                                      {"title": "fp16 with fp32 accumulate", "difficulty": 2, "score": 0.4, "expected_speedup": 1.1}]}])
        return PlanReply()

    search = local_search(tmp_path, ScriptedPolicy(plan=plan), coder("broken"), FakeEvaluators(judge), rounds=3,
                          stagnation_window=2)
    state = run(search)
    node = state.tree.nodes["n1"]
    reasons = [n.text for n in node.notes if n.kind is NoteKind.TOO_HARD]
    assert node.status is NodeStatus.TOO_HARD and len(reasons) == 2
    assert reasons[0].startswith("no passing attempt in 2") and reasons[1] == "fp16 overflows"
    assert state.tree.nodes["n2"].split_from == "n1" and state.tree.nodes["n2"].parent == "root"
    applied = [e for e in search.store.read_events() if e.kind == "wm" and getattr(e, "plan_kind", None) == "too_hard"]
    assert applied, "the planner's too_hard ops were applied"


def test_a_planner_with_nothing_usable_never_ends_the_run_the_coder_improves_the_best(tmp_path):
    plans = ScriptedPolicy(plan=lambda request: PlanReply(error="unparseable planner reply: no JSON"))
    lines: list[str] = []
    search = local_search(tmp_path, plans, coder("ms=1.5"), FakeEvaluators(judge), rounds=3, stagnation_window=2)
    search.on_line = lines.append
    state = run(search)
    assert state.finished == "rounds" and state.rounds_used == 3
    continuation = state.tree.nodes["n1"]
    assert continuation.author == "system" and continuation.parent == "root"
    assert any("no usable action from the planner" in line for line in lines)


def test_the_run_ends_for_lack_of_actions_only_on_an_empty_plan_after_evaluations(tmp_path):
    search = local_search(tmp_path, planner([insert("root", "one idea")], later=[]), coder("ms=1.5"),
                          FakeEvaluators(judge), rounds=20, stagnation_window=1)
    state = run(search)
    assert state.finished.startswith("the planner returned an empty plan after seeing")
    assert state.rounds_used < 20


def test_new_actions_expand_the_node_with_the_best_solution(tmp_path):
    plans = planner([insert("root", "tile")], later=[])
    search = local_search(tmp_path, plans, coder("ms=1.5", "ms=1.4"), FakeEvaluators(judge), rounds=20,
                          stagnation_window=2)
    run(search)
    proposals = [p for p in plans.plans if p.kind == "propose_actions"]
    assert proposals and proposals[0].node_id == "n1"


def test_the_improve_request_carries_the_speedup_of_the_attempt_it_improves(tmp_path):
    # Attempt 1 passes fast, attempt 2 passes slower: attempt 3 improves attempt 1, with its numbers.
    code = coder("ms=0.5", "ms=4.0", "ms=4.0")
    search = local_search(tmp_path, planner([insert("root", "tile")]), code, FakeEvaluators(judge), rounds=3,
                          stagnation_window=5)
    run(search)
    third = code.codes[2]
    assert third.kind == "improve" and third.current is not None and third.current.name == "ms=0.5"
    assert third.current_speedup == 2.0  # baseline 1 ms / 0.5 ms, not the last attempt's 0.25x
    assert [t.ms for t in third.current_times] == [0.5] and third.current_times[0].baseline_ms == 1.0


def test_a_lease_whose_cycle_stopped_expires_through_the_driver(tmp_path):
    now = {"t": 1000.0}
    search = local_search(tmp_path, planner([insert("root", "a"), insert("root", "b")]), coder("ms=1.5"),
                          FakeEvaluators(judge), clock=lambda: now["t"], lease_ttl_s=60)

    async def go() -> None:
        await search.setup()
        await search.world.wm(ApplyOps(ops=[insert("root", "a")]))
        await search.world.wm(SelectAndLease(k=1, holder="c9", now=now["t"], ttl=60.0, max_difficulty=4, relax_at=None))
        assert search.world.tree().nodes["n1"].status is NodeStatus.LEASED
        now["t"] += 61
        await KSearch()._expire_leases(search.context)

    asyncio.run(go())
    assert search.world.tree().nodes["n1"].status is NodeStatus.OPEN and not search.world.tree().leases
    # The expiry is in the log, so a replay agrees.
    state = RunView.of(search.store.read_events(), search.store.has_solution)
    assert state.tree.nodes["n1"].status is NodeStatus.OPEN


def test_renewing_a_lease_keeps_the_version(tmp_path):
    search = local_search(tmp_path, planner([]), coder("x"), FakeEvaluators(judge))

    async def go() -> None:
        await search.setup()
        await search.world.wm(ApplyOps(ops=[insert("root", "a")]))
        await search.world.wm(SelectAndLease(k=1, holder="c1", now=0.0, ttl=60.0, max_difficulty=4, relax_at=None))
        version = search.world.tree().version
        await search.world.wm(Renew(ids=["n1"], holder="c1", now=30.0, ttl=60.0))
        assert search.world.tree().version == version and search.world.tree().leases["n1"].expires_at == 90.0

    asyncio.run(go())


def test_a_new_best_that_an_independent_re_timing_contradicts_is_not_recorded(tmp_path):
    evaluators = FakeEvaluators(judge)
    evaluators.retime_agrees = lambda solution: solution.name != "ms=0.1"  # too good to be true
    search = local_search(tmp_path, planner([insert("root", "tile")]), coder("ms=0.1", "ms=1.5"), evaluators,
                          rounds=2, stagnation_window=5)
    state = run(search)
    retimes = [e for e in search.store.read_events() if e.kind == "retime"]
    assert [(e.agreed) for e in retimes] == [False, True]
    assert state.best is not None and state.best.speedup == 1.0 / 1.5  # the honest one, not the 10x


# --- failed calls, upkeep, versioned plans --------------------------------------------------------------


def refused_call() -> LLMCall:
    return LLMCall(kind="generate_from_base", model="m", request_hash="h", error="content_policy: refused",
                   error_kind="content_policy", attempts=1)


def test_a_coder_call_the_provider_always_refuses_spends_no_round_and_never_makes_the_action_too_hard(tmp_path):
    def code(request: CodeRequest) -> CodeReply:
        if request.node_id == "n1":
            return CodeReply(error="LLM call failed: content_policy: refused", calls=[refused_call()],
                             failed_call=refused_call())
        return CodeReply(solution=kernel("ms=1.5", len(coder_calls)))

    coder_calls: list[CodeRequest] = []
    policy = ScriptedPolicy(code=lambda r: (coder_calls.append(r), code(r))[1])
    plans = planner([insert("root", "refused idea", score=0.9), insert("root", "fine idea", score=0.1)])
    search = local_search(tmp_path, plans, policy, FakeEvaluators(judge), rounds=4, stagnation_window=2,
                          backoff_base_s=0.01)
    state = run(search)
    events = search.store.read_events()
    candidates = [e for e in events if e.kind == "candidate"]
    assert state.finished == "rounds" and state.rounds_used == len(candidates) == 4
    assert all(c.node != "n1" for c in candidates)  # no round went to the refused action
    n1 = state.tree.nodes["n1"]
    assert n1.status is NodeStatus.CLOSED and not any(n.kind is NoteKind.TOO_HARD for n in n1.notes)
    assert [e.reason for e in events if e.kind == "cycle_stop" and e.cycle in ("c1", "c3")][:1] == ["refused"]
    refused = [e for e in events if e.kind == "llm_call" and e.call.error_kind == "content_policy"]
    assert len(refused) == 6  # two cycles, each call asked three times: all in the ledger


def test_unchanged_code_is_a_round_without_code_and_is_not_evaluated(tmp_path):
    def code(request: CodeRequest) -> CodeReply:
        return CodeReply(solution=request.base)  # hands back the code it was given

    evaluators = FakeEvaluators(judge)
    search = local_search(tmp_path, planner([insert("root", "tile")]), ScriptedPolicy(code=code), evaluators,
                          rounds=2, stagnation_window=2)
    state = run(search)
    candidates = [e for e in search.store.read_events() if e.kind == "candidate"]
    assert state.rounds_used == 2 and all(c.solution_id is None and "unchanged" in c.error for c in candidates)
    assert state.evaluations == 0


def test_code_identical_to_an_evaluated_candidate_is_recognised_and_not_evaluated_again(tmp_path):
    same, other = kernel("ms=1.6"), kernel("ms=1.5")  # the second is faster: the third round improves it
    replies = iter([same, other, same])  # the third reply goes back to the first one's sources

    evaluators = FakeEvaluators(judge)
    search = local_search(tmp_path, planner([insert("root", "tile")]),
                          ScriptedPolicy(code=lambda request: CodeReply(solution=next(replies))), evaluators, rounds=3,
                          stagnation_window=3)
    state = run(search)
    candidates = [e for e in search.store.read_events() if e.kind == "candidate"]
    assert state.rounds_used == 3 and [c.solution_id for c in candidates[:2]] == [same.id, other.id]
    assert candidates[2].solution_id is None and f"identical to solution {same.id}" in candidates[2].error
    assert "PASSED" in candidates[2].error
    assert [s.id for s in evaluators.evaluated].count(same.id) == 1


def test_code_a_cycle_that_ended_already_judged_is_still_recognised_after_the_live_view_forgot_its_result(tmp_path):
    """The live view forgets an ended cycle's failed results (issue 42) and keeps their verdict: a later cycle handed
    the same code is told how it fared, and it is not evaluated again."""
    broken = kernel("broken")
    evaluators = FakeEvaluators(judge)
    search = local_search(tmp_path, planner([insert("root", "tile"), insert("root", "unroll")]),
                          ScriptedPolicy(code=lambda request: CodeReply(solution=broken)), evaluators, rounds=2,
                          stagnation_window=1)
    state = run(search)
    events = search.store.read_events()
    candidates = [e for e in events if e.kind == "candidate"]
    assert [c.cycle for c in candidates] == ["c1", "c2"] and candidates[0].solution_id == broken.id
    c1_end = next(e.seq for e in events if e.kind == "cycle_end" and e.cycle == "c1")
    assert c1_end < candidates[1].seq  # c1 ended (and the live view forgot its result) before c2's reply came
    assert broken.id in state.forgotten and broken.id not in state.results
    assert candidates[1].solution_id is None and f"identical to solution {broken.id}" in candidates[1].error
    assert "COMPILE_ERROR: build failed: broken" in candidates[1].error
    assert [s.id for s in evaluators.evaluated].count(broken.id) == 1


def test_the_best_node_gets_an_open_continuation_when_the_planner_left_it_none(tmp_path):
    plans = planner([insert("root", "tile")], later=[])  # refine proposes nothing under the new best
    search = local_search(tmp_path, plans, coder("ms=1.5", "ms=1.4"), FakeEvaluators(judge), rounds=4,
                          stagnation_window=1)
    state = run(search)
    continuations = [n for n in state.tree.nodes.values() if n.author == "system"]
    assert continuations and continuations[0].parent == "n1"


def test_an_empty_proposal_while_nothing_runs_is_asked_again_once_before_the_run_ends(tmp_path):
    plans = planner([insert("root", "one idea")], later=[])
    search = local_search(tmp_path, plans, coder("ms=1.5"), FakeEvaluators(judge), rounds=30, stagnation_window=1)
    state = run(search)
    proposals = [p for p in plans.plans if p.kind == "propose_actions"]
    assert state.finished.startswith("the planner returned an empty plan")
    assert [p.empty_before for p in proposals][-2:] == [False, True]


def test_ops_rejected_because_the_tree_moved_on_are_told_to_the_planner_in_its_next_call(tmp_path):
    class SlowPlanner(ScriptedPolicy):
        """Refines take a while: the other cycles move on (lease n3) before the batch applies."""

        async def plan(self, request: PlanRequest) -> PlanReply:
            self.plans.append(request)
            if request.kind == "initialize_tree":
                return PlanReply(ops=[insert("root", t, score=s) for t, s in (("a", 0.9), ("b", 0.8), ("c", 0.7))])
            if request.kind == "refine" and request.node_id == "n1":
                await asyncio.sleep(0.3)
                return PlanReply(ops=[{"op": "update", "node": "n3", "score": 0.99}])
            return PlanReply()

    class SlowCoder(ScriptedPolicy):
        async def code(self, request: CodeRequest) -> CodeReply:
            await asyncio.sleep(0.05)
            return CodeReply(solution=kernel("ms=1.5", len(self.codes.append(request) or self.codes)))

    plans = SlowPlanner()
    search = local_search(tmp_path, plans, SlowCoder(), FakeEvaluators(judge), rounds=16, width=2,
                          stagnation_window=1)
    run(search)
    told = [line for p in plans.plans for line in p.rejected]
    assert any("n3" in line and "REJECTED" in line and "changed" in line for line in told), told
    assert search.world.tree().nodes["n3"].score == 0.7  # the stale edit did not apply


def test_a_long_cycle_s_coder_request_carries_its_latest_attempts_and_the_best_not_all_of_them(tmp_path):
    """A wide cycle makes hundreds of attempts; each request carries the latest CODE_HISTORY, the best beside them,
    and how many came before (issue 42: every request used to carry every attempt and its code)."""
    from ksearch_ray.methods.cycle import CODE_HISTORY
    from ksearch_ray.policies.llm.views import history_text

    rounds = CODE_HISTORY + 6
    code = coder("ms=0.5", "slower")
    cached: list[int] = []  # the engine's solutions in memory at each request
    answer = code._code
    assert answer is not None

    def counting(request: CodeRequest) -> CodeReply:
        cached.append(len(search.evals._solutions))
        return answer(request)

    code._code = counting
    search = local_search(tmp_path, planner([insert("root", "tile")]), code, FakeEvaluators(judge), rounds=rounds,
                          stagnation_window=rounds)
    run(search)
    assert max(cached) <= CODE_HISTORY + 4  # (the carried attempts', the best's, the seeds')
    last = code.codes[-1]
    assert len(code.codes) == rounds and last.kind == "improve"
    assert len(last.history) == CODE_HISTORY and last.earlier_attempts == rounds - 1 - CODE_HISTORY
    assert [a.round for a in last.history] == list(range(rounds - CODE_HISTORY, rounds))
    assert last.current is not None and last.current.name == "ms=0.5"  # the best, from before the carried window
    assert last.passed == last.current and last.current.id in last.solutions
    assert {a.solution_id for a in last.history} <= set(last.solutions) and len(last.solutions) == CODE_HISTORY + 1
    hidden = rounds - 1 - 12
    assert history_text(last.history, earlier=last.earlier_attempts).startswith(f"({hidden} earlier attempts not shown)")
