"""Search methods without action cycles (evolve, refine): `width` lanes, one candidate at a time each.

A lane takes a round, asks the coder for one candidate, evaluates it and starts again, until the
budget runs out, or the coder has answered without code NO_CODE_LIMIT times in a row (the offline
policy has then tried everything it can reach; a model keeps failing the format). Each attempt is logged twice, and the log is all a resumed run needs:

* `candidate` when the coder answers: method, lane, round, kind, solution id or error, and what the
  method needs to rebuild its state (evolve: the island, the parent, the inspirations);
* `evaluation` when it is measured (no `cycle`: the read model files it under `view.attempts`).

A candidate logged without its evaluation (the driver died meanwhile) is evaluated first on
resume, without taking a new round, so nothing is lost and nothing is counted twice.
"""

from __future__ import annotations

import asyncio

from ksearch_ray.events import Candidate, Event
from ksearch_ray.methods.attempts import evaluate
from ksearch_ray.methods.context import Evaluations, LlmCalls, Refused, RunRecord, SearchContext, Where
from ksearch_ray.methods.evidence import workload_times
from ksearch_ray.models import EvalResult, Solution
from ksearch_ray.policies.contract import (
    Attempt,
    CodeKind,
    CodeRequest,
    FailedAttempt,
    Inspiration,
    WorkloadTime,
)
from ksearch_ray.worldmodel.tree import ROOT_ID

NO_CODE_LIMIT = 5


def failed_attempt(evals: Evaluations, attempt: Attempt | None) -> FailedAttempt | None:
    """An attempt that failed, as the next coder call is shown it (None for one that passed or is pending)."""
    if attempt is None or attempt.passed or (attempt.solution_id is not None and attempt.result is None):
        return None
    return FailedAttempt(round=attempt.round, kind=attempt.kind,
                         solution=evals.solution(attempt.solution_id) if attempt.solution_id else None,
                         result=attempt.result, error=attempt.error, reply_start=attempt.reply_start)


class Lanes:
    """What evolve and refine share; a subclass says how a lane chooses its next candidate."""

    name = ""
    lane_prefix = ""

    def __init__(self) -> None:
        self.candidates: dict[int, Candidate] = {}  # round -> its `candidate` event (this method's)
        self._no_code = 0
        self.stopped: str | None = None

    # --- what a method provides ------------------------------------------------------------------

    def observe(self, event: Event) -> None:
        """Every event of the run, in log order (on replay, then live): the method's state is a fold of them."""
        if isinstance(event, Candidate) and event.method == self.name:
            self.candidates[event.round] = event

    async def step(self, ctx: SearchContext, lane: str, round_: int) -> None:
        """Spend one round: ask the coder for a candidate (`generate`) and measure it (`finish`)."""
        raise NotImplementedError

    def where(self, lane: str, **tags: object) -> Where:
        return Where(method=self.name, lane=lane, tags=dict(tags))

    async def finish(self, ctx: SearchContext, attempt: Attempt) -> None:
        """Evaluate a candidate that has code."""
        await evaluate(ctx.run, ctx.evals, attempt, self.where(self.candidates[attempt.round].lane or ""))

    # --- the loop ----------------------------------------------------------------------------------

    async def run(self, ctx: SearchContext) -> str:
        pending = [a for a in self.attempts(ctx.run) if a.solution_id and a.result is None]
        if pending:
            ctx.run.set_phase(f"evaluating {len(pending)} candidate(s) left unmeasured by the last session")
            await asyncio.gather(*(self.finish(ctx, a) for a in pending))
        ctx.run.set_phase("searching")
        await asyncio.gather(*(self._lane(ctx, f"{self.lane_prefix}{i + 1}") for i in range(ctx.run.config.search.width)))
        return self.stopped or ctx.run.budget_left() or "done"

    async def _lane(self, ctx: SearchContext, lane: str) -> None:
        refused = 0
        try:
            while self.stopped is None:
                round_ = await ctx.run.take_round()
                if round_ is None:
                    return
                try:
                    await self.step(ctx, lane, round_)
                    refused = 0
                except Refused as exc:  # no round spent; the same prompt next time would be refused again
                    refused += 1
                    ctx.run.say(f"lane {lane}: {exc}")
                    if refused >= NO_CODE_LIMIT and self.stopped is None:
                        self.stopped = f"the provider refused the coder {refused} times in a row (last: {exc})"
        finally:
            ctx.run.working(lane, None)

    # --- one attempt -------------------------------------------------------------------------------

    def attempts(self, run: RunRecord) -> list[Attempt]:
        """This run's attempts outside cycles, oldest first (in flight included)."""
        return [run.view.attempts[r] for r in sorted(run.view.attempts)]

    def request(self, ctx: SearchContext, kind: CodeKind, *, current: Solution | None = None,
                current_speedup: float | None = None, base: Solution | None = None, base_speedup: float | None = None,
                action_text: str | None = None, inspirations: list[Inspiration] | None = None,
                failed: Attempt | None = None) -> CodeRequest:
        """A coder request; `failed`: the lane's last attempt when it failed, shown with its code and evidence
        (the best so far is shown beside it as the last code that passed)."""
        history = self.attempts(ctx.run)
        best = ctx.run.view.best
        result = ctx.run.view.results.get(current.id) if current else None
        base_result = ctx.run.view.results.get(base.id) if base else None
        return ctx.llm.code_request(
            kind, node_id=ROOT_ID, base=base, base_speedup=base_speedup,
            base_times=workload_times(base_result, None, ctx.evals.baseline_for(None)), current=current,
            current_result=result, current_speedup=current_speedup,
            current_times=self._times(ctx.evals, result, base_result),
            history=history, solutions={a.solution_id: ctx.evals.solution(a.solution_id) for a in history if a.solution_id},
            action_text=action_text, inspirations=inspirations or [], failure=failed_attempt(ctx.evals, failed),
            passed=ctx.evals.solution(best.solution_id) if best else None, passed_speedup=best.speedup if best else None,
        )

    @staticmethod
    def _times(evals: Evaluations, result: EvalResult | None, parent: EvalResult | None) -> list[WorkloadTime]:
        return workload_times(result, parent, evals.baseline_for(None)) if result is not None and result.passed else []

    async def generate(self, llm: LlmCalls, request: CodeRequest, lane: str, round_: int, **tags: object
                       ) -> Attempt | None:
        """Ask the coder (the candidate is logged with `tags`), and count replies without code. None: the
        budget ran out while the provider was failing (the round was given back)."""
        attempt = await llm.generate(request, round_, self.where(lane, **tags))
        if attempt is None:
            return None
        if attempt.solution_id is None:
            self._no_code += 1
            if self._no_code >= NO_CODE_LIMIT and self.stopped is None:
                self.stopped = (f"the coder returned no code {self._no_code} times in a row "
                                f"(last: {(attempt.error or '')[:160]})")
        else:
            self._no_code = 0
        return attempt
