"""The search methods a run can use, by name (`ksearch run --method ...`).

All of them run on the same `Search` (budgets, evaluators, the event log, resume): what differs is
what they do with a round.

* `ksearch`: the world-model search (`methods/ksearch.py`, `methods/cycle.py`).
* `evolve`: an evolutionary program database with islands (`methods/evolve.py`, `methods/programs.py`).
* `refine`: improve or debug the best so far, without a world model (`methods/refine.py`).
"""

from __future__ import annotations

from collections.abc import Callable

from ksearch_ray.config import RunConfig
from ksearch_ray.methods.context import Method
from ksearch_ray.methods.evolve import Evolve
from ksearch_ray.methods.ksearch import KSearch
from ksearch_ray.methods.refine import Refine
from ksearch_ray.models import Solution

METHODS = ("ksearch", "evolve", "refine")


def method_for(config: RunConfig, load: Callable[[str], Solution]) -> Method:
    """The configured method; `load` reads a solution of the run by id (evolve's database needs code)."""
    name = config.search.method
    if name == "evolve":
        return Evolve(config.search.evolve.islands, load)
    if name == "refine":
        return Refine()
    return KSearch()
