"""The evolve method: an evolutionary baseline in the style of OpenEvolve.

A program database (`search/programs.py`: islands, each a MAP-Elites-like grid over its
population) starts with the seed on every island. Each round, a lane draws a parent and a few
inspirations from one island (round-robin over the islands), asks the coder for one variant (the
`evolve` prompt; the offline policy mutates or recombines tunables instead), evaluates the child and
inserts it into the parent's island. Every `evolve_migration_interval` evaluated children, each
island's best is copied to the next island. There is no world model: the tree stays a root holding
the seed and the measured best.

Random draws come from `random.Random("<random_seed>:<round>")`, so a round draws the same whatever
the lanes did before it; the database is rebuilt from the event log on resume (`candidate` events
carry the island, parent and inspirations; `evolve_migrate` events the moves).
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

from ksearch_ray.search.lanes import Lanes
from ksearch_ray.search.policy import Attempt, Inspiration
from ksearch_ray.search.programs import ProgramDatabase

if TYPE_CHECKING:
    from ksearch_ray.search.engine import Search


class Evolve(Lanes):
    name = "evolve"
    lane_prefix = "e"

    def __init__(self) -> None:
        super().__init__()
        self.db = ProgramDatabase(1)

    def restore(self, s: Search, events: list[dict[str, Any]]) -> None:
        self.db = ProgramDatabase(s.config.evolve_islands)
        for ev in events:
            if ev["kind"] == "seed" and ev.get("solution_id") and ev.get("speedup") is not None:
                seed = self.solution(s, ev["solution_id"])
                self.db.add(seed.id, "the seed", seed.sources, ev["speedup"], 0, None)
            elif ev["kind"] == "evaluation" and ev.get("method") == self.name and ev["round"] in self.candidates:
                self._insert(s, s.state.attempts[ev["round"]])
            elif ev["kind"] == "evolve_migrate":
                self.db.apply_migration(ev["moves"])

    def _insert(self, s: Search, attempt: Attempt) -> None:
        assert attempt.solution_id is not None
        solution = self.solution(s, attempt.solution_id)
        speedup = attempt.speedup if attempt.passed else None
        self.db.add(solution.id, solution.name, solution.sources, speedup, attempt.round, self.candidates[attempt.round]["island"])

    async def step(self, s: Search, lane: str, round_: int) -> None:
        island = (round_ - 1) % len(self.db.islands)
        rng = random.Random(f"{s.config.random_seed}:{round_}")
        parent, shown = self.db.sample(island, rng, s.config.evolve_inspirations)
        current = self.solution(s, parent.solution_id) if parent else None
        inspirations = [Inspiration(self.solution(s, p.solution_id), p.speedup, "PASSED", why) for p, why in shown]
        s.in_flight[lane] = f"a child of {parent.name if parent else 'nothing yet'} on island {island}"
        s.on_change(s)
        request = self.request(s, "evolve", current=current, current_speedup=parent.speedup if parent else None,
                               base=current, base_speedup=parent.speedup if parent else None, inspirations=inspirations)
        attempt = await self.generate(s, request, lane, round_, island=island, parent=parent.solution_id if parent else None,
                                      inspirations=[p.solution_id for p, _ in shown])
        if attempt.solution_id is not None:
            await self.finish(s, attempt)

    async def finish(self, s: Search, attempt: Attempt) -> None:
        await self.evaluate(s, attempt, node=f"island {self.candidates[attempt.round]['island']}")

    def measured(self, s: Search, attempt: Attempt) -> None:
        self._insert(s, attempt)
        while self.db.migration_due(s.config.evolve_migration_interval):
            moves = self.db.migrate()
            s.store.append("evolve_migrate", moves=moves)
            if moves:
                s.on_line("migration: " + ", ".join(f"island {m['from']}'s best to island {m['to']}" for m in moves))
