"""Rebuild a run's world model from its LLM response cache: the tree is a function of the replies.

Every planner batch in the event log names the cached reply its ops were read from (`source`) and
the node they were read against (`focus`). Replaying reads each of those replies again, with the
same lenient reader, and folds the log with the re-read ops in place of the logged ones: the tree
that comes out must be the run's tree, node for node.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ksearch_ray.llm.parsing import read_plan
from ksearch_ray.llm.store import ResponseCache
from ksearch_ray.search.runstate import fold
from ksearch_ray.search.store import RunDirError, RunStore
from ksearch_ray.worldmodel.tree import ROOT_ID, Tree


def replay_world_model(run_dir: Path) -> Tree:
    store = RunStore(Path(run_dir))
    cache = ResponseCache(store.cache_dir)
    events: list[dict[str, Any]] = []
    for event in store.read_events():
        source = event.get("source") if event["kind"] == "wm" and event["call"] == "apply" else None
        if source:
            hit = cache.get(source[0], source[1])
            if hit is None:
                raise RunDirError(f"{run_dir}: the reply of planner batch {event['seq']} is not in the response cache")
            ops, _ = read_plan(hit.text, event.get("focus") or ROOT_ID)
            event = {**event, "args": {**event["args"], "ops": ops}}
        events.append(event)
    tree = fold(events, store.has_solution).tree
    if tree is None:
        raise RunDirError(f"{run_dir}: the log holds no world model")
    return tree
