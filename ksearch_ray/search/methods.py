"""The search methods a run can use, by name (`ksearch run --method ...`).

All of them run on the same `Search` (budgets, evaluators, the event log, resume): what differs is
what they do with a round.

* `ksearch`: the world-model search (`search/ksearch.py`, `search/cycle.py`).
* `evolve`: an evolutionary program database with islands (`search/evolve.py`, `search/programs.py`).
* `refine`: improve or debug the best so far, without a world model (`search/refine.py`).
"""

from __future__ import annotations

from ksearch_ray.config import RunConfig
from ksearch_ray.search.engine import Method
from ksearch_ray.search.evolve import Evolve
from ksearch_ray.search.ksearch import KSearch
from ksearch_ray.search.refine import Refine

METHODS: dict[str, type] = {"ksearch": KSearch, "evolve": Evolve, "refine": Refine}


def method_for(config: RunConfig) -> Method:
    method: Method = METHODS[config.method]()
    return method
