"""The evolve method's program database: islands, each a MAP-Elites-like grid over a population.

Every passing program lives on one or more islands (its parent's, and any it migrated to). An
island keeps its whole population and, per cell of a small grid of features, the fastest program
in that cell: its elites. The features describe what a program is, not how fast it is, so the grid
keeps different kinds of programs alive beside the fastest one:

* size: the program's source length against the founder's, in half-octaves (-3 .. 3);
* distance: how many source lines differ from the founder's, in octaves (0, 1, 2-3, 4-7, ...).

A parent is usually (EXPLOIT of the time) the better of two elites drawn at random, otherwise any
program of the island; the inspirations shown beside it are the island's best, elites of other cells
and the bests of other islands. Now and then each island's best is copied to the next island (a
ring), so islands that drift apart still share what works.

Pure: the method feeds it events (`add`, `migrate`) and draws from it with a `random.Random` it
owns, so a resumed run rebuilds the same database by replaying its event log.
"""

from __future__ import annotations

import difflib
import math
import random
from dataclasses import dataclass, field
from typing import Any

EXPLOIT = 0.7
"""Share of parents drawn from the elites; the rest come from the whole island population."""
SIZE_BINS = 3
DISTANCE_BINS = 7

Cell = tuple[int, int]


@dataclass
class Program:
    solution_id: str
    name: str
    round: int  # the round that produced it (0: the seed)
    speedup: float  # over the baseline
    cell: Cell


@dataclass
class Island:
    population: list[str] = field(default_factory=list)  # solution ids, in arrival order
    grid: dict[Cell, str] = field(default_factory=dict)  # cell -> the fastest program in it


def source_text(sources: dict[str, str]) -> str:
    return "\n".join(sources[name] for name in sorted(sources))


def features(text: str, founder: str) -> Cell:
    size = math.log2(max(len(text), 1) / max(len(founder), 1))
    size_bin = max(-SIZE_BINS, min(SIZE_BINS, round(2 * size)))
    ours, theirs = text.splitlines(), founder.splitlines()
    ops = difflib.SequenceMatcher(None, theirs, ours, autojunk=False).get_opcodes()
    changed = sum(max(i2 - i1, j2 - j1) for tag, i1, i2, j1, j2 in ops if tag != "equal")
    return size_bin, min(int(math.log2(1 + changed)), DISTANCE_BINS)


class ProgramDatabase:
    def __init__(self, islands: int):
        self.islands = [Island() for _ in range(islands)]
        self.programs: dict[str, Program] = {}
        self.founder: str | None = None  # the source features are measured against: the seed's, else the first passing program's
        self.evaluated = 0  # children evaluated (passing or not): migrations are counted in these
        self.migrations = 0

    # --- filling ---------------------------------------------------------------------------------

    def add(self, solution_id: str, name: str, sources: dict[str, str], speedup: float | None, round_: int,
            island: int | None, *, counts: bool = True) -> None:
        """A measured program; `speedup` None when it failed. `island` None: every island (the seed).
        `counts`: an evaluated child (migrations are due every so many); a tuned variant is not one."""
        if round_ > 0 and counts:
            self.evaluated += 1
        if speedup is None:
            return
        text = source_text(sources)
        if self.founder is None:
            self.founder = text
        program = self.programs.get(solution_id)
        if program is None:  # a program met twice (the same code again) keeps its first measurement
            program = Program(solution_id, name, round_, speedup, features(text, self.founder))
            self.programs[solution_id] = program
        for index in range(len(self.islands)) if island is None else [island]:
            self._place(program, index)

    def _place(self, program: Program, island: int) -> None:
        home = self.islands[island]
        if program.solution_id in home.population:
            return
        home.population.append(program.solution_id)
        elite = home.grid.get(program.cell)
        if elite is None or program.speedup > self.programs[elite].speedup:
            home.grid[program.cell] = program.solution_id

    def migration_due(self, interval: int) -> bool:
        return len(self.islands) > 1 and self.evaluated // interval > self.migrations

    def plan_migration(self) -> list[dict[str, int | str]]:
        """Each island's best to the next island (a ring): the moves, for the log; `apply_migration` makes them."""
        moves: list[dict[str, int | str]] = []
        bests = [self.best(i) for i in range(len(self.islands))]
        for index, best in enumerate(bests):
            target = (index + 1) % len(self.islands)
            if best is not None and best.solution_id not in self.islands[target].population:
                moves.append({"solution_id": best.solution_id, "from": index, "to": target})
        return moves

    def migrate(self) -> list[dict[str, int | str]]:
        moves = self.plan_migration()
        self.apply_migration(moves)
        return moves

    def apply_migration(self, moves: list[dict[str, Any]]) -> None:
        for move in moves:
            self._place(self.programs[str(move["solution_id"])], int(move["to"]))
        self.migrations += 1

    # --- drawing ---------------------------------------------------------------------------------

    def best(self, island: int | None = None) -> Program | None:
        ids = self.programs if island is None else self.islands[island].population
        return max((self.programs[i] for i in ids), key=lambda p: p.speedup, default=None)

    def elites(self, island: int) -> list[Program]:
        cells = self.islands[island].grid.values()
        return sorted((self.programs[i] for i in cells), key=lambda p: -p.speedup)

    def sample(self, island: int, rng: random.Random, inspirations: int) -> tuple[Program | None, list[tuple[Program, str]]]:
        """A parent from `island` (any island while it is empty) and up to `inspirations` others, with why."""
        home = self.islands[island]
        if not home.population:
            fallback = self.best()
            return fallback, []
        elites = self.elites(island)
        if rng.random() < EXPLOIT:
            drawn = [rng.choice(elites) for _ in range(2)]
            parent = max(drawn, key=lambda p: p.speedup)
        else:
            parent = self.programs[rng.choice(home.population)]
        shown: list[tuple[Program, str]] = []

        def offer(program: Program | None, why: str) -> None:
            if program is not None and program is not parent and all(program is not p for p, _ in shown):
                shown.append((program, why))

        # The island's best, then one other island's best, then other kinds of program on this island.
        offer(self.best(island), "the best of this island")
        islands = [i for i in rng.sample(range(len(self.islands)), len(self.islands)) if i != island]
        for index in islands[:1]:
            offer(self.best(index), f"the best of island {index}")
        others = [e for e in elites if e.cell != parent.cell]
        rng.shuffle(others)
        for elite in others:
            offer(elite, f"the best of another kind on this island (size {elite.cell[0]:+d}, distance {elite.cell[1]})")
        for index in islands[1:]:
            offer(self.best(index), f"the best of island {index}")
        return parent, shown[:inspirations]
