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
CLOSE_TIMEOUT_S = 10.0


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
    """A role's PolicyActors (`cluster.policy_actors`), calls spread over them in turn; every one of them draws
    from the endpoint's shared rate limit (`limiter`, a LimiterActor; None for the offline policy)."""

    def __init__(self, role: str, config: RunConfig, store: RunStore, limiter: Any = None):
        self.role, self.config, self.store, self.limiter = role, config, store, limiter
        self.actors = [self._make() for _ in range(config.cluster.policy_actors)]
        self._turn = 0

    def _make(self) -> Any:
        from ksearch_ray.actors.policy_actor import PolicyActor

        return PolicyActor.options(max_concurrency=self.config.llm.concurrency, **pinned()).remote(
            self.role, self.config.llm.model_dump_json(), str(self.store.cache_dir), None, self.limiter
        )

    def _next(self) -> tuple[int, Any]:
        self._turn = (self._turn + 1) % len(self.actors)
        return self._turn, self.actors[self._turn]

    def _call(self, method: str, request: Any) -> Awaitable[Any]:
        index, actor = self._next()

        def replace() -> None:
            self.actors[index] = self._make()
        return _with_retry(lambda: getattr(self.actors[index], method).remote(request), self.role, replace)

    def release(self) -> None:
        for actor in self.actors:
            ray.kill(actor)

    async def name(self) -> str:
        index, actor = self._next()

        def replace() -> None:
            self.actors[index] = self._make()
        return str(await _with_retry(lambda: self.actors[index].name.remote(), self.role, replace))

    async def plan(self, request: PlanRequest) -> PlanReply:
        reply: PlanReply = await self._call("plan", request)
        return reply

    async def code(self, request: CodeRequest) -> CodeReply:
        reply: CodeReply = await self._call("code", request)
        return reply


def endpoint_limiter(config: RunConfig) -> Any:
    """The LimiterActor of the run's LLM endpoint (None without a model: the offline policy calls nothing)."""
    llm = config.llm
    if llm.model is None:
        return None
    from ksearch_ray.actors.limiter import limiter_actor

    return limiter_actor(llm.model, llm.api_base, llm.requests_per_min, llm.tokens_per_min, llm.limit_window_s,
                         **pinned())


def ray_search(config: RunConfig, task: Task, store: RunStore, *, pool_options: dict[str, Any] | None = None,
               **options: Any) -> Search:
    """A search whose world model, planner, coder and evaluators are Ray actors. `pool_options`: fields of the
    RayEvaluatorPool (a simulation's evaluator actor class)."""
    pool_options = pool_options or {}
    search: Search | None = None

    def lost(index: int, solution_id: str) -> None:
        assert search is not None
        search.record(EvaluatorLost(evaluator=index, solution_id=solution_id))

    pool = RayEvaluatorPool(config, store.root.name, on_lost=lost, secret=store.seed_secret(), **pool_options)
    limiter = endpoint_limiter(config)
    backends = Backends(
        world_model=lambda tree: RayWorldModel(store, tree),
        planner=RayPolicy("planner", config, store, limiter),
        coder=RayPolicy("coder", config, store, limiter),
        evaluators=pool,
    )
    search = Search(config, task, store, backends, method_for(config, store.load_solution), **options)
    return search
