"""The refine method: the K-Search paper's ablation without a world model.

`width` lanes each ask the coder, round after round, to make the best kernel found so far faster
(the `improve` prompt, with a standing instruction in place of a planned action). When a lane's
last attempt failed, its next attempt debugs that one (the `debug` prompt), until it passes or
`stagnation_window` attempts in a row have failed; then the lane goes back to improving the best.
There is no plan and no tree of actions: the tree stays a root holding the seed and the measured best.
"""

from __future__ import annotations

from ksearch_ray.events import Candidate, Event
from ksearch_ray.methods.context import SearchContext
from ksearch_ray.methods.lanes import Lanes
from ksearch_ray.policies.contract import Attempt

IMPROVE_BEST = (
    "Make the best kernel found so far faster. This search keeps no plan: every attempt starts from the best "
    "kernel so far (or fixes the last attempt when it failed), so choose the change you expect to pay most."
)


def failed_in_a_row(attempts: list[Attempt]) -> int:
    count = 0
    for attempt in reversed(attempts):
        if attempt.passed or attempt.solution_id is None:
            break
        count += 1
    return count


class Refine(Lanes):
    name = "refine"
    lane_prefix = "r"

    def __init__(self) -> None:
        super().__init__()
        self.lanes: dict[str, list[int]] = {}  # lane -> the rounds of its attempts, oldest first

    def observe(self, event: Event) -> None:
        super().observe(event)
        if isinstance(event, Candidate) and event.method == self.name and event.lane:
            self.lanes.setdefault(event.lane, []).append(event.round)

    async def step(self, ctx: SearchContext, lane: str, round_: int) -> None:
        mine = [ctx.run.view.attempts[r] for r in self.lanes.get(lane, [])]
        last = mine[-1] if mine else None
        best = ctx.run.view.best
        if last is not None and last.result is not None and not last.passed and \
                failed_in_a_row(mine) < ctx.run.config.search.refine.debug_window:
            assert last.solution_id is not None
            parent = self.candidates[last.round].parent
            base = ctx.evals.solution(parent) if parent else None
            ctx.run.working(lane, f"debugging round {last.round}")
            request = self.request(ctx, "debug", current=ctx.evals.solution(last.solution_id), base=base,
                                   action_text=IMPROVE_BEST, failed=last)
        elif best is not None:
            parent = best.solution_id
            ctx.run.working(lane, f"improving the best ({best.speedup:.3g}x, round {best.round})")
            current = ctx.evals.solution(parent)
            request = self.request(ctx, "improve", current=current, current_speedup=best.speedup, base=current,
                                   base_speedup=best.speedup, action_text=IMPROVE_BEST, failed=last)
        else:
            parent = None
            ctx.run.working(lane, "writing a first kernel from the specification")
            request = self.request(ctx, "generate_from_spec", action_text=IMPROVE_BEST)
        attempt = await self.generate(ctx.llm, request, lane, round_, parent=parent)
        if attempt is not None and attempt.solution_id is not None:
            await self.finish(ctx, attempt)
