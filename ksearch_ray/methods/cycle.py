"""One K-Search action cycle, in plain Python: implement one action, then teach the planner.

Attempt 1 writes code from the parent's solution plus the action (or from the specification when
the parent has none); later attempts debug (nothing passed yet) or improve (something passed),
always from the best passing attempt, else the last attempt with code. The cycle stops after
`stagnation_window` attempts in a row that do not improve on the cycle's best, or when, once an
attempt has passed, `parent_patience` attempts in a row leave the cycle's best no faster than the
parent's solution ("cannot beat the parent"), or when the budget runs out.

Then, each step at most once (a resumed cycle skips the steps already logged): the system records
the action's observed outcome; a passing cycle attaches its best solution and the planner refines
the tree with the evidence; a failed one is marked too hard and the planner says why and splits
it where it can; a cycle cut short by the budget is neither: the action goes back to the frontier
with its partial outcome recorded. A call the provider failed is not an attempt (the engine waits it
out and asks again); one the provider refuses however often it is asked ends the cycle unjudged: the
action goes back with a note, and the second time the system closes it (never too hard).

Every coder call after a failed attempt is shown that attempt's code and evidence, even when an
earlier attempt passed, and the last code that passed beside it.

While its attempts run the cycle renews its lease in the background (every third of `lease_ttl_s`),
so a slow LLM call, an outage or a long evaluation queue never lets it expire. If it expires anyway
(a driver stalled longer than the lease) the cycle learns so at its next renewal and stops: its
evaluations stay in the log, its outcome is recorded, and a passing solution is attached only where
no other cycle holds the node (an attach never replaces a faster solution), so a node is never worked
by two cycles to the end and a slower solution never replaces a faster one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ksearch_ray.config import KSearchConfig
from ksearch_ray.events import CycleEnd, CycleRecord, CycleStep, CycleStop
from ksearch_ray.methods.attempts import evaluate
from ksearch_ray.methods.context import Refused, SearchContext, Where
from ksearch_ray.methods.evidence import attempt_evidence, eval_summary, failure_digest, workload_times
from ksearch_ray.models import Solution
from ksearch_ray.policies.contract import Attempt, AttemptEvidence, CodeKind, FailedAttempt
from ksearch_ray.worldmodel.api import ApplyOps, Release, Renew
from ksearch_ray.worldmodel.ops import AnnotateOp, AttachSolutionOp, CloseOp, MarkTooHardOp, RecordOutcomeOp
from ksearch_ray.worldmodel.tree import ActionNode, Outcome

LEASE_LOST = "lease lost"
"""The stop reason of a cycle whose lease expired under it."""
REFUSED = "refused"
"""The stop reason of a cycle whose coder call the provider refused."""
CODE_HISTORY = 64
"""The settled attempts a coder request carries, the latest (with their solutions, and the cycle's best and current
beside them): a cycle as wide as a share of width 1,024 has hundreds, and every request used to carry them all."""


def stagnation(attempts: list[Attempt]) -> int:
    """Attempts since the cycle's best last improved (every attempt, if nothing passed)."""
    best, streak = None, 0
    for a in attempts:
        if a.passed and a.speedup is not None and (best is None or a.speedup > best):
            best, streak = a.speedup, 0
        else:
            streak += 1
    return streak


def behind_parent(attempts: list[Attempt], parent_speedup: float | None) -> int:
    """Attempts in a row, after the first pass, that left the cycle's best no faster than the parent."""
    if parent_speedup is None:
        return 0
    best, streak, passed = None, 0, False
    for a in attempts:
        if a.passed and a.speedup is not None:
            passed = True
            best = max(best or a.speedup, a.speedup)
        if passed:
            streak = 0 if best is not None and best > parent_speedup else streak + 1
    return streak


def next_kind(attempts: list[Attempt], has_base: bool) -> CodeKind:
    if not attempts:
        return "generate_from_base" if has_base else "generate_from_spec"
    return "improve" if any(a.passed for a in attempts) else "debug"


def current_attempt(attempts: list[Attempt]) -> Attempt | None:
    """What attempt N+1 works from: the best passing attempt, else the last one with code."""
    passing = [a for a in attempts if a.passed]
    if passing:
        return max(passing, key=lambda a: a.speedup or 0.0)
    with_code = [a for a in attempts if a.solution_id]
    return with_code[-1] if with_code else None


def settled(attempts: list[Attempt]) -> list[Attempt]:
    """The attempts whose outcome is known: evaluated, or without code (an attempt in flight is neither)."""
    return [a for a in attempts if a.result is not None or a.solution_id is None]


class ActionCycle:
    def __init__(self, ctx: SearchContext, record: CycleRecord, lanes: Callable[[], int] = lambda: 1):
        """`lanes`: how many attempts this cycle may have in flight now (the method's share of the width for it;
        1: K-Search's sequential cycle)."""
        self.ctx = ctx
        self.rec = record
        self.lanes = lanes
        self.where = Where(cycle=record.cycle_id, node=record.node_id)
        self.budget_cut = record.stop_reason == "budget"  # as logged, when a resumed cycle skips its attempts
        self.refused = record.stop_reason == REFUSED  # the provider refused its coder call: nothing to judge
        self.lost = record.stop_reason == LEASE_LOST  # the lease expired under this cycle: it stops, judges nothing

    @property
    def config(self) -> KSearchConfig:
        return self.ctx.run.config.search.ksearch

    async def run(self) -> None:
        ctx, rec = self.ctx, self.rec
        node = ctx.world.tree().nodes[rec.node_id]
        ctx.run.working(rec.cycle_id, node.title)
        try:
            if not rec.steps:
                stop = asyncio.Event()
                keeper = asyncio.create_task(self._keep_lease(stop))
                try:
                    await self._attempts(node)
                finally:
                    stop.set()
                    await keeper
            await self._finish(ctx.world.tree().nodes.get(rec.node_id, node))
        finally:
            ctx.run.working(rec.cycle_id, None)

    # --- the lease --------------------------------------------------------------------------------

    async def _keep_lease(self, stop: asyncio.Event) -> None:
        """Renew the lease while the cycle waits (on the LLM, an outage, the evaluator queue): a slow call
        must not let it expire under a cycle that is still working."""
        period = max(self.config.lease_ttl_s / 3, 0.01)
        while not self.lost:
            try:
                await asyncio.wait_for(stop.wait(), timeout=period)
                return
            except TimeoutError:
                await self._renew()

    async def _renew(self) -> None:
        if self.lost:
            return
        rec = self.rec
        lost = await self.ctx.world.wm(Renew(ids=[rec.node_id], holder=rec.cycle_id, now=self.ctx.run.now(),
                                       ttl=self.config.lease_ttl_s))
        if lost:
            self.lost = True
            self.ctx.run.say(f"{rec.cycle_id}: its lease on {rec.node_id} expired before it could renew it; the cycle stops "
                         "(its results are kept, and attached only where the node is free and they are faster)")

    # --- attempts -----------------------------------------------------------------------------

    def _parent(self, node: ActionNode) -> tuple[Solution | None, float | None]:
        parent = self.ctx.world.tree().get(node.parent)
        ref = parent.solution if parent is not None else None
        if ref is None:
            return None, None
        return self.ctx.evals.solution(ref.solution_id), ref.evaluation.speedup

    def _should_stop(self, parent_speedup: float | None) -> str | None:
        """The stop rules over the settled attempts; with several lanes, each lane has the rules' patience (a
        wave of parallel attempts that does not improve counts as one non-improving step per lane)."""
        attempts = settled(self.rec.attempts)
        lanes = max(1, self.lanes())
        if stagnation(attempts) >= self.config.stagnation_window * lanes:
            return "stagnation"
        if behind_parent(attempts, parent_speedup) >= self.config.parent_patience * lanes:
            return "cannot beat the parent"
        return None

    async def _attempts(self, node: ActionNode) -> None:
        base, base_speedup = self._parent(node)
        for attempt in [a for a in self.rec.attempts if a.solution_id and a.result is None]:
            # Candidates the last session generated and did not evaluate: evaluated first, before the stop rules
            # look at the attempts (a candidate with code is always evaluated, once).
            await evaluate(self.ctx.run, self.ctx.evals, attempt, self.where)
        in_flight: set[asyncio.Task[str | None]] = set()
        stop: str | None = None
        while True:
            while stop is None and len(in_flight) < max(1, self.lanes()):
                stop = self._should_stop(base_speedup)
                if stop is not None:
                    break
                round_ = await self.ctx.run.take_round()
                if round_ is None:
                    stop = "budget"
                    break
                in_flight.add(asyncio.create_task(self._one(node, base, base_speedup, round_)))
            if not in_flight:
                break
            done, in_flight = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                stop = stop or task.result()  # (an attempt's bug stops the run loudly)
        assert stop is not None  # the loop ends only once a reason to stop is known and nothing is in flight
        if stop == REFUSED:
            self.refused = True
        elif stop == "budget":
            self.budget_cut = True
        self.ctx.run.record(CycleStop(cycle=self.rec.cycle_id, reason=stop))

    async def _one(self, node: ActionNode, base: Solution | None, base_speedup: float | None, round_: int) -> str | None:
        """One attempt: its code, its evaluation, the lease renewed; a reason the cycle must stop, if any."""
        try:
            attempt = await self._generate(node, base, base_speedup, round_)
        except Refused as exc:
            self.ctx.run.say(f"{self.rec.cycle_id} on {node.id}: {exc}; the action goes back unjudged")
            return REFUSED
        if attempt is None:  # the budget ran out (perhaps while the provider was failing)
            return "budget"
        if attempt.solution_id is not None and not self.lost:
            await evaluate(self.ctx.run, self.ctx.evals, attempt, self.where)
        await self._renew()
        return LEASE_LOST if self.lost else None

    async def _generate(self, node: ActionNode, base: Solution | None, base_speedup: float | None, round_: int
                        ) -> Attempt | None:
        ctx, rec = self.ctx, self.rec
        attempts = settled(rec.attempts)  # (the cycle's other lanes' attempts in flight are not evidence yet)
        kind = next_kind(attempts, base is not None)
        current = current_attempt(attempts)
        carried = attempts[-CODE_HISTORY:]
        sols = {a.solution_id: ctx.evals.solution(a.solution_id)
                for a in (*carried, current) if a is not None and a.solution_id}
        base_result = ctx.run.view.results.get(base.id) if base else None
        current_result = current.result if current else None
        baseline = ctx.evals.baseline_for(current.evaluator if current else None)
        # The attempt before this one, when it failed, is shown with its code and evidence even after an
        # earlier one passed; beside it, the last code that passed (the cycle's best, else the parent's).
        last = attempts[-1] if attempts else None
        failure = None
        if last is not None and not last.passed:
            failure = FailedAttempt(round=last.round, kind=last.kind, solution=sols.get(last.solution_id or ""),
                                    result=last.result, error=last.error, reply_start=last.reply_start)
        best = current if current is not None and current.passed else None  # (current_attempt: the best passing one)
        # The code of attempts older than the carried ones leaves memory: a wide cycle makes thousands.
        ctx.evals.uncache(a.solution_id for a in attempts[:-CODE_HISTORY] if a.solution_id and a.solution_id not in sols)
        request = ctx.llm.code_request(
            kind, node_id=node.id, base=base, base_speedup=base_speedup,
            base_times=workload_times(base_result, None, ctx.evals.baseline_for(None)),
            current=sols.get(current.solution_id) if current and current.solution_id else None,
            current_result=current_result, current_speedup=current.speedup if current else None,
            current_times=workload_times(current_result, base_result, baseline),
            history=carried, earlier_attempts=len(attempts) - len(carried), solutions=sols, failure=failure,
            passed=sols[best.solution_id] if best and best.solution_id else base,
            passed_speedup=best.speedup if best else base_speedup,
        )
        return await ctx.llm.generate(request, round_, self.where)

    # --- the end of the cycle -----------------------------------------------------------------

    def evidence(self, node: ActionNode) -> list[AttemptEvidence]:
        ctx = self.ctx
        base, base_speedup = self._parent(node)
        parent_result = ctx.run.view.results.get(base.id) if base else None
        out = []
        for a in self.rec.attempts:
            change = ctx.evals.solution(a.solution_id).description if a.solution_id else ""
            out.append(attempt_evidence(a, change, parent_result, ctx.evals.baseline_for(a.evaluator), base_speedup))
        return out

    def outcome(self, node: ActionNode, evidence: list[AttemptEvidence]) -> Outcome:
        previous = node.outcome or Outcome()
        statuses = dict(previous.statuses)
        for e in evidence:
            statuses[e.status] = statuses.get(e.status, 0) + 1
        passing = [e for e in evidence if e.speedup is not None and e.status == "PASSED"]
        best = max(passing, key=lambda e: e.speedup or 0.0, default=None)
        keep_old = previous.best_speedup is not None and (best is None or (best.speedup or 0) <= previous.best_speedup)
        digest = "; ".join(part for part in (previous.failures, failure_digest(evidence)) if part)
        return Outcome(
            attempts=previous.attempts + len(evidence), statuses=statuses,
            best_speedup=previous.best_speedup if keep_old else (best.speedup if best else None),
            over_parent=previous.over_parent if keep_old else (best.over_parent if best else None),
            failures=digest[-600:], budget_cut=self.budget_cut, cycles=[*previous.cycles, self.rec.cycle_id],
        )

    async def _finish(self, node: ActionNode) -> None:
        """Record, attach or mark, and ask the planner; each step once, so a resume repeats none."""
        ctx, rec = self.ctx, self.rec
        tag = {"cycle": rec.cycle_id}
        best = current_attempt(rec.attempts)
        passed = best is not None and best.passed
        if self.refused:
            await self._finish_refused(node)
            return
        if not rec.attempts:
            # The budget ran out before the first attempt: the action goes back to the frontier untouched.
            await ctx.world.wm(Release(ids=[rec.node_id], holder=rec.cycle_id), tag=tag)
            self._end(passed=False)
            return
        evidence = self.evidence(node)
        if self.lost:
            await self._finish_without_lease(node, evidence, best)
            return
        if "recorded" not in rec.steps:
            await ctx.world.wm(ApplyOps(ops=[RecordOutcomeOp(op="record_outcome", node=rec.node_id,
                                                       outcome=self.outcome(node, evidence))]), tag=tag)
            self._step("recorded")
        if passed and "attached" not in rec.steps:
            assert best is not None and best.result is not None and best.solution_id is not None
            await ctx.world.wm(ApplyOps(ops=[AttachSolutionOp(
                op="attach_solution", node=rec.node_id, solution_id=best.solution_id,
                evaluation=eval_summary(best.result, best.speedup),
            )]), tag=tag)
            self._step("attached")
        elif not passed and self.budget_cut and "released" not in rec.steps:
            # Cut short by the budget, not judged: back to the frontier, its outcome kept.
            await ctx.world.wm(Release(ids=[rec.node_id], holder=rec.cycle_id), tag=tag)
            self._step("released")
        elif not passed and not self.budget_cut and "marked" not in rec.steps:
            await ctx.world.wm(ApplyOps(ops=[MarkTooHardOp(
                op="mark_too_hard", node=rec.node_id,
                reason=f"no passing attempt in {len(rec.attempts)}: {failure_digest(evidence)[:300] or 'no code came back'}",
            )]), tag=tag)
            self._step("marked")
        judged = passed or not self.budget_cut
        if judged and "planned" not in rec.steps and ctx.run.budget_left() != "cost":
            kind = "refine" if passed else "too_hard"
            request = ctx.llm.plan_request(kind, node_id=rec.node_id, attempts=rec.attempts, evidence=evidence)
            await ctx.llm.plan(request, cycle=rec.cycle_id)
            self._step("planned")
        self._end(passed=passed)

    async def _finish_refused(self, node: ActionNode) -> None:
        """The provider refused this cycle's coder call: no attempt to judge, so the action goes back to the
        frontier with a note (its outcome kept); the second time, the system closes it (not too hard: it
        was never tried), so a prompt the provider always refuses cannot hold the search."""
        ctx, rec = self.ctx, self.rec
        tag = {"cycle": rec.cycle_id}
        if rec.attempts and "recorded" not in rec.steps:
            await ctx.world.wm(ApplyOps(ops=[RecordOutcomeOp(op="record_outcome", node=rec.node_id,
                                                       outcome=self.outcome(node, self.evidence(node)))]), tag=tag)
            self._step("recorded")
        if "released" not in rec.steps:
            await ctx.world.wm(Release(ids=[rec.node_id], holder=rec.cycle_id), tag=tag)
            self._step("released")
        refused = sum(c.node_id == rec.node_id and c.stop_reason == REFUSED for c in ctx.run.view.cycles.values())
        why = "the provider refused the coder's calls for this action (a content policy or a rejected request)"
        if "noted" not in rec.steps:
            op = (CloseOp(op="close", target=rec.node_id, reason=f"{why}, in {refused} cycles") if refused >= 2
                  else AnnotateOp(op="annotate", target=rec.node_id, text=why))
            await ctx.world.wm(ApplyOps(ops=[op]), tag=tag)
            self._step("noted")
        self._end(passed=False)

    async def _finish_without_lease(self, node: ActionNode, evidence: list[AttemptEvidence], best: Attempt | None) -> None:
        """A cycle whose lease expired: what it measured is kept, a passing solution attached only where the
        node is not another cycle's now (the attach keeps the faster of two), and nothing is judged: the
        node is not marked too hard, the planner not asked."""
        ctx, rec = self.ctx, self.rec
        tag = {"cycle": rec.cycle_id}
        if "recorded" not in rec.steps:
            await ctx.world.wm(ApplyOps(ops=[RecordOutcomeOp(op="record_outcome", node=rec.node_id,
                                                       outcome=self.outcome(node, evidence))]), tag=tag)
            self._step("recorded")
        passed = best is not None and best.passed
        free = rec.node_id not in ctx.world.tree().leases
        if passed and free and "attached" not in rec.steps:
            assert best is not None and best.result is not None and best.solution_id is not None
            await ctx.world.wm(ApplyOps(ops=[AttachSolutionOp(
                op="attach_solution", node=rec.node_id, solution_id=best.solution_id,
                evaluation=eval_summary(best.result, best.speedup),
            )]), tag=tag)
            self._step("attached")
        self._end(passed=passed, abandoned="its lease expired")

    def _step(self, step: str) -> None:
        self.ctx.run.record(CycleStep(cycle=self.rec.cycle_id, step=step))

    def _end(self, *, passed: bool, abandoned: str | None = None) -> None:
        """The cycle's last event; the code of what the live view forgets with it (see RunView.live) leaves memory."""
        rec = self.rec
        solution_ids = list(rec.solution_ids)
        self.ctx.run.record(CycleEnd(cycle=rec.cycle_id, node=rec.node_id, passed=passed, attempts=len(rec.attempts),
                                     budget_cut=self.budget_cut, abandoned=abandoned))
        self.ctx.evals.uncache(i for i in solution_ids if i not in self.ctx.run.view.results)

