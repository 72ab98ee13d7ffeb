"""Search methods without action cycles (evolve, refine): `width` lanes, one candidate at a time each.

A lane takes a round, asks the coder for one candidate, evaluates it and starts again, until the
budget runs out, or the coder has answered without code NO_CODE_LIMIT times in a row (the offline
policy has then tried everything it can reach; a model keeps failing the format). Each attempt is logged twice, and the log is all a resumed run needs:

* `candidate` when the coder answers: method, lane, round, kind, solution id or error, and what the
  method needs to rebuild its state (evolve: the island, the parent, the inspirations);
* `evaluation` when it is measured (no `cycle`: `runstate.fold` files it under `state.attempts`).

A candidate logged without its evaluation (the driver died meanwhile) is evaluated first on
resume, without taking a new round, so nothing is lost and nothing is counted twice.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from ksearch_ray.models import Solution
from ksearch_ray.search.evidence import workload_times
from ksearch_ray.search.measure import with_noise
from ksearch_ray.search.policy import Attempt, CodeKind, CodeRequest, Inspiration, WorkloadTime
from ksearch_ray.search.tuner import autotune
from ksearch_ray.worldmodel.tree import ROOT_ID

if TYPE_CHECKING:
    from ksearch_ray.search.engine import Search

NO_CODE_LIMIT = 5


class Lanes:
    """What evolve and refine share; a subclass says how a lane chooses its next candidate."""

    name = ""
    lane_prefix = ""

    def __init__(self) -> None:
        self.candidates: dict[int, dict[str, Any]] = {}  # round -> its `candidate` event (this method's)
        self._solutions: dict[str, Solution] = {}
        self._no_code = 0
        self.stopped: str | None = None

    # --- what a method provides ------------------------------------------------------------------

    def restore(self, s: Search, events: list[dict[str, Any]]) -> None:
        """Rebuild the method's state from the run's events (a new run has only the seed's)."""

    async def step(self, s: Search, lane: str, round_: int) -> None:
        """Spend one round: ask the coder for a candidate (`generate`) and measure it (`finish`)."""
        raise NotImplementedError

    async def finish(self, s: Search, attempt: Attempt) -> None:
        """Evaluate a candidate that has code."""
        await self.evaluate(s, attempt)

    def measured(self, s: Search, attempt: Attempt) -> None:
        """Learn from an evaluation, right after its event is logged and before anything else can
        happen: the state changes in the order of the log, so a replay of the log rebuilds it."""

    # --- the loop ----------------------------------------------------------------------------------

    async def run(self, s: Search) -> str:
        events = s.store.read_events()
        self.candidates = {ev["round"]: ev for ev in events if ev["kind"] == "candidate" and ev.get("method") == self.name}
        self.restore(s, events)
        pending = [a for a in self.attempts(s) if a.solution_id and a.result is None]
        if pending:
            s.set_phase(f"evaluating {len(pending)} candidate(s) left unmeasured by the last session")
            await asyncio.gather(*(self.finish(s, a) for a in pending))
        s.set_phase("searching")
        await asyncio.gather(*(self._lane(s, f"{self.lane_prefix}{i + 1}") for i in range(s.config.width)))
        return self.stopped or s.budget_left() or "done"

    async def _lane(self, s: Search, lane: str) -> None:
        try:
            while self.stopped is None:
                round_ = await s.take_round()
                if round_ is None:
                    return
                await self.step(s, lane, round_)
        finally:
            s.in_flight.pop(lane, None)
            s.on_change(s)

    # --- one attempt -------------------------------------------------------------------------------

    def attempts(self, s: Search) -> list[Attempt]:
        """This run's attempts outside cycles, oldest first (in flight included)."""
        return [s.state.attempts[r] for r in sorted(s.state.attempts)]

    def solution(self, s: Search, solution_id: str) -> Solution:
        if solution_id not in self._solutions:
            self._solutions[solution_id] = s.store.load_solution(solution_id)
        return self._solutions[solution_id]

    def request(self, s: Search, kind: CodeKind, *, current: Solution | None = None, current_speedup: float | None = None,
                base: Solution | None = None, base_speedup: float | None = None, action_text: str | None = None,
                inspirations: list[Inspiration] | None = None) -> CodeRequest:
        history = self.attempts(s)
        result = s.results.get(current.id) if current else None
        base_result = s.results.get(base.id) if base else None
        return CodeRequest(
            kind=kind, task=s.task.definition, tree=s.tree(), node_id=ROOT_ID, hardware=s.hardware,
            language=s.config.language, base=base, base_speedup=base_speedup,
            base_times=workload_times(base_result, None, s.baseline_for(None)), current=current,
            current_result=result, current_speedup=current_speedup, current_times=self._times(s, result, base_result),
            history=history, solutions={a.solution_id: self.solution(s, a.solution_id) for a in history if a.solution_id},
            seeds=s.seeds(), noise=s.noise(), prompt_budget_tokens=s.config.prompt_budget_tokens,
            action_text=action_text, inspirations=inspirations or [],
        )

    @staticmethod
    def _times(s: Search, result: Any, parent: Any) -> list[WorkloadTime]:
        return workload_times(result, parent, s.baseline_for(None)) if result is not None and result.passed else []

    async def generate(self, s: Search, request: CodeRequest, lane: str, round_: int, **tags: Any) -> Attempt:
        """Ask the coder; log the candidate with `tags`, and count a reply without code."""
        reply = await s.code(request, lane)
        attempt = Attempt(round=round_, kind=request.kind, error=reply.error if reply.solution is None else None)
        if reply.solution is not None:
            attempt.solution_id = s.store.save_solution(reply.solution)
            self._solutions[reply.solution.id] = reply.solution
        elif attempt.error is None:
            attempt.error = "the coder returned no code"
        self.candidates[round_] = s.store.append(
            "candidate", method=self.name, lane=lane, round=round_, attempt_kind=request.kind,
            solution_id=attempt.solution_id, error=attempt.error, **tags,
        )
        s.state.attempts[round_] = attempt
        if attempt.solution_id is None:
            self._no_code += 1
            s.on_line(f"round {round_} ({lane}, {request.kind}): no code: {(attempt.error or '')[:120]}")
            if self._no_code >= NO_CODE_LIMIT and self.stopped is None:
                self.stopped = (f"the coder returned no code {self._no_code} times in a row "
                                f"(last: {(attempt.error or '')[:160]})")
        else:
            self._no_code = 0
        return attempt

    async def evaluate(self, s: Search, attempt: Attempt, node: str | None = None) -> None:
        assert attempt.solution_id is not None
        lane = self.candidates[attempt.round]["lane"]
        result, evaluator = await s.evaluate(self.solution(s, attempt.solution_id))
        attempt.result, attempt.evaluator = result, evaluator
        attempt.speedup = s.speedup_of(result, evaluator)
        s.state.evaluations += 1
        s.store.append("evaluation", method=self.name, lane=lane, round=attempt.round, evaluator=evaluator,
                       gpu=s.gpu_of[evaluator], solution_id=attempt.solution_id, result=result.model_dump(mode="json"),
                       speedup=attempt.speedup)
        if result.passed:
            s.state.note_score(s.gpu_of[evaluator], attempt.solution_id, result.score)
        shown = with_noise(attempt.speedup, s.noise(evaluator)) if result.passed else result.message[:120]
        s.on_line(f"round {attempt.round} ({lane}, {attempt.kind}): {result.status.value} {shown}")
        await autotune(s, attempt, {"method": self.name, "lane": lane})
        evaluator = attempt.evaluator if attempt.evaluator is not None else evaluator
        self.measured(s, attempt)
        await s.note_best(attempt.solution_id, attempt.speedup, node or self.name, attempt.round, evaluator)
        s.on_change(s)
