"""The refine method: the K-Search paper's ablation without a world model.

`width` lanes each ask the coder, round after round, to make the best kernel found so far faster
(the `improve` prompt, with a standing instruction in place of a planned action). When a lane's
last attempt failed, its next attempt debugs that one (the `debug` prompt), until it passes or
`stagnation_window` attempts in a row have failed; then the lane goes back to improving the best.
There is no plan and no tree of actions: the tree stays a root holding the seed and the measured best.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ksearch_ray.search.lanes import Lanes
from ksearch_ray.search.policy import Attempt

if TYPE_CHECKING:
    from ksearch_ray.search.engine import Search

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
        self.lanes: dict[str, list[Attempt]] = {}  # lane -> its attempts, oldest first

    def restore(self, s: Search, events: list[dict[str, Any]]) -> None:
        for round_, ev in sorted(self.candidates.items()):
            self.lanes.setdefault(ev["lane"], []).append(s.state.attempts[round_])

    async def step(self, s: Search, lane: str, round_: int) -> None:
        mine = self.lanes.setdefault(lane, [])
        last = mine[-1] if mine else None
        best = s.state.best
        if last is not None and last.result is not None and not last.passed and \
                failed_in_a_row(mine) < s.config.stagnation_window:
            assert last.solution_id is not None
            parent = self.candidates[last.round].get("parent")
            base = self.solution(s, parent) if parent else None
            s.in_flight[lane] = f"debugging round {last.round}"
            request = self.request(s, "debug", current=self.solution(s, last.solution_id), base=base,
                                   action_text=IMPROVE_BEST)
        elif best is not None:
            parent = best["solution_id"]
            s.in_flight[lane] = f"improving the best ({best['speedup']:.3g}x, round {best['round']})"
            current = self.solution(s, parent)
            request = self.request(s, "improve", current=current, current_speedup=best["speedup"], base=current,
                                   base_speedup=best["speedup"], action_text=IMPROVE_BEST)
        else:
            parent = None
            s.in_flight[lane] = "writing a first kernel from the specification"
            request = self.request(s, "generate_from_spec", action_text=IMPROVE_BEST)
        s.on_change(s)
        attempt = await self.generate(s, request, lane, round_, parent=parent)
        mine.append(attempt)
        if attempt.solution_id is not None:
            await self.finish(s, attempt)
