"""The evolve method: an evolutionary baseline in the style of OpenEvolve.

A program database (`methods/programs.py`: islands, each a MAP-Elites-like grid over its
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
from collections.abc import Callable

from ksearch_ray.events import Evaluation, Event, EvolveMigrate, Seed, Tuned
from ksearch_ray.methods.attempts import evaluate
from ksearch_ray.methods.context import SearchContext
from ksearch_ray.methods.lanes import Lanes
from ksearch_ray.methods.programs import ProgramDatabase
from ksearch_ray.models import Solution
from ksearch_ray.policies.contract import Attempt, Inspiration


class Evolve(Lanes):
    name = "evolve"
    lane_prefix = "e"

    def __init__(self, islands: int, load: Callable[[str], Solution]) -> None:
        super().__init__()
        self.db = ProgramDatabase(islands)
        self.load = load  # a solution by id (from the run directory)

    def observe(self, event: Event) -> None:
        """The program database is a fold of the run's events, live and on replay alike."""
        super().observe(event)
        if isinstance(event, Seed) and event.solution_id and event.speedup is not None:
            seed = self.load(event.solution_id)
            self.db.add(seed.id, "the seed", seed.sources, event.speedup, 0, None)
        elif isinstance(event, Evaluation) and event.method == self.name and event.round in self.candidates:
            solution = self.load(event.solution_id)
            self.db.add(solution.id, solution.name, solution.sources, event.speedup if event.result.passed else None,
                        event.round, self.candidates[event.round].island)
        elif isinstance(event, Tuned) and event.method == self.name and event.solution_id != event.original:
            tuned = self.load(event.solution_id)  # the tuned variant joins its original's island, uncounted
            self.db.add(tuned.id, tuned.name, tuned.sources, event.speedup, event.round,
                        self.candidates[event.round].island, counts=False)
        elif isinstance(event, EvolveMigrate):
            self.db.apply_migration(event.moves)

    async def step(self, ctx: SearchContext, lane: str, round_: int) -> None:
        island = (round_ - 1) % len(self.db.islands)
        rng = random.Random(f"{ctx.run.config.search.random_seed}:{round_}")
        parent, shown = self.db.sample(island, rng, ctx.run.config.search.evolve.inspirations)
        current = ctx.evals.solution(parent.solution_id) if parent else None
        inspirations = [Inspiration(ctx.evals.solution(p.solution_id), p.speedup, "PASSED", why) for p, why in shown]
        ctx.run.working(lane, f"a child of {parent.name if parent else 'nothing yet'} on island {island}")
        request = self.request(ctx, "evolve", current=current, current_speedup=parent.speedup if parent else None,
                               base=current, base_speedup=parent.speedup if parent else None, inspirations=inspirations)
        attempt = await self.generate(ctx.llm, request, lane, round_, island=island,
                                      parent=parent.solution_id if parent else None,
                                      inspirations=[p.solution_id for p, _ in shown])
        if attempt is not None and attempt.solution_id is not None:
            await self.finish(ctx, attempt)

    async def finish(self, ctx: SearchContext, attempt: Attempt) -> None:
        candidate = self.candidates[attempt.round]
        await evaluate(ctx.run, ctx.evals, attempt, self.where(candidate.lane or "", node=f"island {candidate.island}"))
        while self.db.migration_due(ctx.run.config.search.evolve.migration_interval):
            moves = self.db.plan_migration()
            ctx.run.record(EvolveMigrate(moves=moves))  # applied to the database by `observe`
            if moves:
                ctx.run.say("migration: " + ", ".join(f"island {m['from']}'s best to island {m['to']}" for m in moves))
