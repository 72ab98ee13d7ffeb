"""Rebuild a run's world model from its LLM response cache: the tree is a function of the replies.

Every planner batch in the event log names the cached reply its ops were read from (`source`) and
the node they were read against (`focus`). Replaying reads each of those replies again, with the
same lenient reader, and folds the log with the re-read ops in place of the logged ones: the tree
that comes out must be the run's tree, node for node.
"""

from __future__ import annotations

from pathlib import Path

from ksearch_ray.events import Event, RunView, WmCall
from ksearch_ray.policies.llm.parsing import read_plan
from ksearch_ray.policies.llm.reply_cache import ResponseCache
from ksearch_ray.store import RunDirError, RunStore
from ksearch_ray.worldmodel.api import ApplyOps
from ksearch_ray.worldmodel.tree import ROOT_ID, Tree


def replay_world_model(run_dir: Path) -> Tree:
    store = RunStore(Path(run_dir))
    cache = ResponseCache(store.cache_dir)
    events: list[Event] = []
    for event in store.read_events():
        if isinstance(event, WmCall) and isinstance(event.command, ApplyOps) and event.source:
            hit = cache.get(event.source[0], event.source[1])
            if hit is None:
                raise RunDirError(f"{run_dir}: the reply of planner batch {event.seq} is not in the response cache")
            ops, _ = read_plan(hit.text, event.focus or ROOT_ID)
            event = event.model_copy(update={"command": event.command.model_copy(update={"ops": ops})})
        events.append(event)
    tree = RunView.of(events, store.has_solution).tree
    if tree is None:
        raise RunDirError(f"{run_dir}: the log holds no world model")
    return tree
