"""The search methods a run can use, by name (`ksearch run --method ...`)."""

from __future__ import annotations

from ksearch_ray.config import RunConfig
from ksearch_ray.search.engine import Method
from ksearch_ray.search.ksearch import KSearch

METHODS: dict[str, type] = {"ksearch": KSearch}


def method_for(config: RunConfig) -> Method:
    method: Method = METHODS[config.method]()
    return method
