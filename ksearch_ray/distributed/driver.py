"""The Ray plumbing of a search: actor-backed backends for `run.engine.Search`.

The driver-side actors (world model, planner, coder) are pinned to the driver's node, because they
read and write the run directory; evaluators go wherever Ray has a GPU (`distributed/pool.py`).
An actor that dies costs the call in flight: the call is retried on a fresh actor, which for the
world model is rebuilt from the event log (every change is logged after the actor applied it).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

from ksearch_ray.config import RunConfig
from ksearch_ray.distributed.cluster import pinned
from ksearch_ray.distributed.pool import RayEvaluatorPool
from ksearch_ray.events import EvaluatorLost, RunView
from ksearch_ray.methods.registry import method_for
from ksearch_ray.policies.contract import CodeReply, CodeRequest, PlanReply, PlanRequest
from ksearch_ray.run.backends import Backends
from ksearch_ray.run.engine import Search
from ksearch_ray.run.errors import SearchError
from ksearch_ray.store import RunStore
from ksearch_ray.taskspec.task import Task
from ksearch_ray.worldmodel.api import Command, R
from ksearch_ray.worldmodel.tree import Tree

log = logging.getLogger(__name__)
T = TypeVar("T")

ACTOR_RETRIES = 3
CLOSE_TIMEOUT_S = 60.0


async def _with_retry(make: Callable[[], Awaitable[T]], what: str, replace: Callable[[], None]) -> T:
    for attempt in range(1, ACTOR_RETRIES + 1):
        try:
            return await make()
        except RayActorError as exc:
            log.warning("%s actor died (%s); retrying on a fresh one (%d/%d)", what, type(exc).__name__, attempt, ACTOR_RETRIES)
            replace()
    raise SearchError(f"the {what} actor died {ACTOR_RETRIES} times in a row")


class RayWorldModel:
    def __init__(self, store: RunStore, tree: Tree):
        self.store = store
        self.actor = self._make(tree)

    def _make(self, tree: Tree) -> Any:
        from ksearch_ray.actors.world_model import WorldModelActor

        return WorldModelActor.options(**pinned()).remote(str(self.store.root), tree.model_dump_json())

    def _rebuild(self) -> None:
        # The log holds every change made so far: a new actor gets the exact tree by replay.
        tree = RunView.of(self.store.read_events(), self.store.has_solution).tree
        assert tree is not None
        self.actor = self._make(tree)

    async def run(self, command: Command[R]) -> R:
        result: R = await _with_retry(lambda: self.actor.run.remote(command), "world-model", self._rebuild)
        return result

    def release(self) -> None:
        # The record's last checkpoint, then the actor goes. Without it the record still holds every version (as
        # deltas): a dead actor or a checkpoint that could not be written is logged, not raised, as this runs
        # however the session ended.
        try:
            ray.get(self.actor.close.remote(), timeout=CLOSE_TIMEOUT_S)
        except (RayActorError, GetTimeoutError, RayTaskError) as exc:
            log.warning("the world model's last checkpoint was not written (%s); its deltas hold every version",
                        str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        ray.kill(self.actor)


class RayPolicy:
    def __init__(self, role: str, config: RunConfig, store: RunStore):
        self.role, self.config, self.store = role, config, store
        self.actor = self._make()

    def _make(self) -> Any:
        from ksearch_ray.actors.policy import PolicyActor

        return PolicyActor.options(max_concurrency=self.config.llm.concurrency, **pinned()).remote(
            self.role, self.config.llm.model_dump_json(), str(self.store.cache_dir), None
        )

    def _replace(self) -> None:
        self.actor = self._make()

    def release(self) -> None:
        ray.kill(self.actor)

    async def name(self) -> str:
        return str(await _with_retry(lambda: self.actor.name.remote(), self.role, self._replace))

    async def plan(self, request: PlanRequest) -> PlanReply:
        reply: PlanReply = await _with_retry(lambda: self.actor.plan.remote(request), self.role, self._replace)
        return reply

    async def code(self, request: CodeRequest) -> CodeReply:
        reply: CodeReply = await _with_retry(lambda: self.actor.code.remote(request), self.role, self._replace)
        return reply


def ray_search(config: RunConfig, task: Task, store: RunStore, **options: Any) -> Search:
    """A search whose world model, planner, coder and evaluators are Ray actors."""
    search: Search | None = None

    def lost(index: int, solution_id: str) -> None:
        assert search is not None
        search.record(EvaluatorLost(evaluator=index, solution_id=solution_id))

    pool = RayEvaluatorPool(config, store.root.name, on_lost=lost, secret=store.seed_secret())
    backends = Backends(
        world_model=lambda tree: RayWorldModel(store, tree),
        planner=RayPolicy("planner", config, store),
        coder=RayPolicy("coder", config, store),
        evaluators=pool,
    )
    search = Search(config, task, store, backends, method_for(config, store.load_solution), **options)
    return search
