"""The evaluator pool: GPU-pinned EvaluatorActors, one measurement at a time each, and CPU builds.

The driver asks the pool for verdicts and never talks to an evaluator actor itself, either from
whichever evaluator is free first (`evaluate`) or from one evaluator in particular
(`evaluate_on`: baselines and re-timing are measured on each GPU itself).

* **Builds ahead of time.** A CUDA/C++ candidate is handed to a build task (CPUs only, any
  node; ksearch_ray.actors.build_task) the moment it is submitted, before it waits for a GPU. A
  compile error comes back as a COMPILE_ERROR verdict without an evaluator (index `BUILDER`);
  a library that built is passed to the evaluator through the object store (its node fetches
  the bytes) and only loaded and measured there. Each node also keeps a build cache.
* **An idle queue**, so evaluations in flight never exceed the evaluators, and a lock per
  evaluator, so an addressed evaluation never runs beside another on the same GPU. An evaluator that
  would idle is lent to spare work (`take_spare`, `evaluate_spare`: idle tuning) only while no
  evaluation waits for one.
* **Losses.** When an evaluator dies mid-evaluation (its process, or its whole node), the loss is
  reported through `on_lost` (so the run log says which evaluations a failure cost) and a
  replacement actor is started in the background; it takes the dead one's place only once it
  runs, and is given up after `evaluator_replace_timeout_s` (on a lost node it may never be
  placed). An evaluation from the queue goes straight back to the queue and runs on whichever
  evaluator is free next; an addressed one runs on another evaluator with the same GPU, or
  waits for its evaluator's replacement if there is none. If every
  evaluator is lost and none can be replaced, the pool says so instead of waiting forever.
* **Busy time** per evaluator, so reports can say how much of the GPUs' time went to measuring.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import RayActorError, RayError

from ksearch_ray.config import RunConfig
from ksearch_ray.evaluation.buildcache import BuildRecord, BuildTarget
from ksearch_ray.evaluation.describe import EvaluatorInfo, gpu_facts
from ksearch_ray.evaluation.profiling import ProfileResult
from ksearch_ray.evaluation.retime import RetimeResult
from ksearch_ray.evaluation.sandbox.build import arch_for
from ksearch_ray.models import EvalResult, Solution, Status
from ksearch_ray.run.backends import BUILDER, IdleEvaluators, in_flight_on, slots
from ksearch_ray.run.errors import SearchError

log = logging.getLogger(__name__)

ACTOR_RETRIES = 3
CLOSE_GRACE_S = 10.0
BUILD_CHECK_S = 2.0
"""How often a build that has not come back checks that a node could take it at all."""
__all__ = ["EvaluatorPoolError", "RayEvaluatorPool", "evaluator_count"]


class EvaluatorPoolError(SearchError):
    """The pool cannot evaluate (no resources, or evaluators keep dying); one line for the user."""


def evaluator_count(config: RunConfig) -> int:
    """--evaluators, or one per GPU the cluster has now (GPU evaluators), or one on the CPU."""
    if config.evaluation.evaluators:
        return config.evaluation.evaluators
    if config.evaluation.device == "cuda" or config.evaluation.evaluator_gpus:
        gpus = int(ray.cluster_resources().get("GPU", 0))
        if gpus == 0:
            raise EvaluatorPoolError(
                "no evaluator resources: Ray sees no GPUs (use --device cpu, or --evaluators N on an autoscaling cluster)"
            )
        return gpus
    return 1


@dataclass
class _Build:
    record: Any
    """ObjectRef of the BuildRecord."""
    library: Any
    """ObjectRef of the library bytes (None for a failed build); stays in the object store."""
    counted: bool = False
    ahead: bool = False
    """Started by `build_ahead`: the evaluation that joins it first is no cache hit."""


@dataclass
class RayEvaluatorPool:
    config: RunConfig
    run_name: str
    on_lost: Callable[[int, str], object] = lambda _index, _solution_id: None
    """Called with (evaluator index, solution id) when an evaluator dies mid-evaluation."""
    secret: int | None = None
    """The run's input secret (RunStore.seed_secret), the same for every evaluator: one input set per seed."""
    busy_s: dict[int, float] = field(default_factory=dict)
    """Evaluator index -> seconds spent evaluating in this session."""
    done: int = 0
    """Evaluations finished in this session (compile errors from builds included)."""
    in_flight: dict[int, tuple[str, float]] = field(default_factory=dict)
    """Evaluator index -> (solution name, monotonic start) of the evaluation it runs now."""
    in_flight_next: dict[int, tuple[str, float]] = field(default_factory=dict)
    """The same for a second evaluation beside it (evaluation.overlap)."""
    building: dict[str, float] = field(default_factory=dict)
    """Solution id -> monotonic start of its build, while the candidate waits for it."""
    builds: int = 0
    """Builds compiled for this session (cache hits not included)."""
    build_hits: int = 0
    """Builds answered from a node's build cache or from this run's earlier builds."""
    build_s: float = 0.0
    """Seconds of compiling (on CPU workers) for this session's builds."""
    lost: int = 0
    """Evaluations lost to dead evaluators (and run again)."""
    actor_class: Any = None
    """The evaluator actor class (default `actors.evaluator.EvaluatorActor`); a simulation's stands in for it
    (`distributed.simcluster`) with the same methods."""

    def __post_init__(self) -> None:
        self.device = self.config.evaluation.device or "cpu"
        self.size = evaluator_count(self.config)
        self.actors = [self._make(i) for i in range(self.size)]
        self.idle = IdleEvaluators()
        self.slots = slots(self.config.evaluation.overlap)
        for _ in range(self.slots):
            for i in range(self.size):
                self.idle.put(i)
        # One measurement at a time per evaluator (two with evaluation.overlap, whose evaluator gives each its
        # turn on the device), whether it came through the idle queue or was addressed to that evaluator
        # (baselines and re-timing are measured on each GPU itself).
        self._locks = [asyncio.Semaphore(self.slots) for _ in range(self.size)]
        self.infos: dict[int, EvaluatorInfo] = {}
        self._replacing: dict[int, asyncio.Task[None]] = {}
        # Evaluator index -> its slots out of the idle queue until its replacement runs (two with overlap).
        self._parked: Counter[int] = Counter()
        self._given_up: set[int] = set()
        self._builds: dict[tuple[str, BuildTarget, str | None], _Build] = {}
        self._fit_checked: tuple[float, bool] = (-BUILD_CHECK_S, True)  # (when, whether a node could take a build)
        self.warming: list[Any] | None = None
        """The build workers' warm-ups (warm_builder refs), decided with the session's first build (None before)."""
        self._task: Any = None

    # --- evaluator actors ------------------------------------------------------------------------

    def _make(self, index: int) -> Any:
        from ksearch_ray.actors.evaluator_actor import EvaluatorActor

        gpus = 1 if self.device == "cuda" or self.config.evaluation.evaluator_gpus else 0
        return (self.actor_class or EvaluatorActor).options(
            num_cpus=self.config.evaluation.evaluator_cpus, num_gpus=gpus, name=f"ksearch-eval-{self.run_name}-{index}-{time.time_ns()}",
            max_concurrency=slots(self.config.evaluation.overlap),
        ).remote(self.device, self.config.evaluation.model_dump_json(), scratch_dir=self.config.cluster.scratch_dir,
                 secret_names=[self.config.llm.api_key_env], secret=self.secret)
        # (the sandbox is the actor's own, in a private folder of its node, outside the run directory)

    async def describe(self, index: int = 0) -> EvaluatorInfo:
        """An evaluator's hardware, as prompts and reports name it."""
        for attempt in range(1, ACTOR_RETRIES + 1):
            try:
                info: EvaluatorInfo = await self.actors[index].describe.remote()
                self.infos[index] = info
                return info
            except RayActorError:
                log.warning("evaluator %d died before it described itself; starting a new one (%d/%d)", index, attempt, ACTOR_RETRIES)
                self.actors[index] = self._make(index)
        raise EvaluatorPoolError(f"evaluator {index} died {ACTOR_RETRIES} times in a row while starting")

    async def describe_all(self) -> list[EvaluatorInfo]:
        return list(await asyncio.gather(*(self.describe(i) for i in range(self.size))))

    def _lose(self, index: int, solution: Solution) -> None:
        """Evaluator `index` died while it measured `solution`: report it, start its replacement."""
        self.lost += 1
        self.on_lost(index, solution.id)
        if index in self._replacing:
            return
        with contextlib.suppress(RayError):  # an actor that is only unreachable must not keep its GPU
            ray.kill(self.actors[index], no_restart=True)
        self.actors[index] = self._make(index)
        self._replacing[index] = asyncio.create_task(self._await_replacement(index))

    async def _await_replacement(self, index: int) -> None:
        actor = self.actors[index]
        try:
            self.infos[index] = await asyncio.wait_for(actor.describe.remote(), self.config.evaluation.replace_timeout_s)
        except (RayActorError, TimeoutError):
            log.warning("the replacement for evaluator %d did not start within %.0f s; continuing without it",
                        index, self.config.evaluation.replace_timeout_s)
            with contextlib.suppress(RayError):
                ray.kill(actor)
            self._given_up.add(index)
        else:
            for _ in range(self._parked.pop(index, 0)):
                self.idle.put(index)
        finally:
            self._replacing.pop(index, None)

    async def _acquire(self) -> int:
        """The next idle evaluator that runs; an error once every evaluator is lost for good."""
        while True:
            getter = asyncio.ensure_future(self.idle.get())
            while not getter.done():
                await asyncio.wait({getter}, timeout=1.0)
                if not getter.done() and len(self._given_up) == self.size:
                    getter.cancel()
                    raise EvaluatorPoolError(f"all {self.size} evaluators were lost and none could be replaced")
            index = getter.result()
            if index in self._replacing or index in self._given_up:
                self._parked[index] += 1  # its replacement puts it back once it runs
                continue
            return index

    # --- builds ---------------------------------------------------------------------------------

    def _target(self) -> BuildTarget:
        """The architectures of the evaluators described so far: one library runs on each of them."""
        if self.device != "cuda":
            return BuildTarget()
        archs = {arch_for(*map(int, info.compute_capability.split("."))) for info in self.infos.values()
                 if info.compute_capability}
        return BuildTarget(archs=tuple(sorted(archs)))

    def _start_build(self, solution: Solution, target: BuildTarget, triton_set: str | None, ahead: bool = False) -> _Build:
        """`triton_set`: compile the Triton kernels of a Python candidate as that workload set launches them."""
        key = (solution.id, target, triton_set)
        if key in self._builds:
            build = self._builds[key]
            if build.ahead and not ahead:
                build.ahead = False  # the evaluation it was built ahead for
            else:
                self.build_hits += 1
            return build
        from ksearch_ray.actors.build_task import build_extension, build_triton

        options = self._build_options()
        cluster, isolation = self.config.cluster, self.config.evaluation.isolation
        jobs = max(1, round(cluster.build_cpus))
        if triton_set is not None:
            record, library = build_triton.options(**options).remote(
                solution, target, self.config.task, self.config.task_dirs, triton_set, cluster.scratch_dir,
                cluster.build_timeout_s, jobs, isolation=isolation, gpu=gpu_facts(list(self.infos.values())))
        else:
            record, library = build_extension.options(**options).remote(
                solution, target, cluster.scratch_dir, cluster.build_timeout_s, jobs, isolation=isolation)
        self._builds[key] = _Build(record, library, ahead=ahead)
        if self.warming is None:  # after the build: Ray starts tasks of one shape in the order they came
            self._warm_builders(jobs)
        return self._builds[key]

    def _build_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"num_cpus": self.config.cluster.build_cpus}
        if self.config.cluster.build_resource:
            options["resources"] = {self.config.cluster.build_resource: 0.01}
        return options

    def _warm_builders(self, jobs: int) -> None:
        """With the session's first build, start as many more build workers' sandboxes as the search has cycles
        besides (cluster.warm_builders): a cold worker spends seconds on its zygote's imports before its first
        build, and a search's first candidates come together. Only as many as can run beside the evaluators and
        that first build now: a warm-up that has to queue would hold up the candidates' builds behind it."""
        from ksearch_ray.actors.build_task import warm_builder

        cluster = self.config.cluster
        spare = ray.cluster_resources().get("CPU", 0) - self.size * self.config.evaluation.evaluator_cpus
        fits = int(spare // cluster.build_cpus) - 1
        count = max(0, min(self.config.search.width - 1, fits)) if cluster.warm_builders else 0
        self.warming = [warm_builder.options(**self._build_options()).remote(
            cluster.scratch_dir, cluster.build_timeout_s, jobs, isolation=self.config.evaluation.isolation)
            for _ in range(count)]

    def _builds_triton(self, solution: Solution) -> bool:
        """Whether `solution` (Python or Triton: any but CUDA/C++, and only code that names Triton: a PyTorch
        baseline has no kernels to build) gets a Triton build ahead of its evaluation."""
        return (solution.language != "cuda" and self._gpus_compile_triton() and self.config.cluster.triton_builds
                and self.config.cluster.build_pool and solution.names_triton)

    def _gpus_compile_triton(self) -> bool:
        """GPU evaluators compile Triton kernels; the CPU path's interpret them, and a build is of no use there."""
        return self.device == "cuda"

    async def build_ahead(self, solution: Solution, workload_set: str) -> None:
        """Build `solution` now, holding no evaluator, and wait for the build: its evaluation later joins the build
        instead of starting it (a session's starting kernel, built while the baselines are measured). A failed
        build's verdict waits for that evaluation."""
        await self._built(solution, workload_set, ahead=True)

    async def _built(self, solution: Solution, workload_set: str, ahead: bool = False) -> tuple[BuildRecord | None, Any]:
        """For a CUDA/C++ candidate (and, with cluster.triton_builds, a Python one's Triton kernels): start (or
        join) its build now and wait for it, holding no evaluator.

        A failed build stays known for the run (its verdict is the source's); a library is let go
        of once evaluated, so the object store does not keep every library of a long run: a later
        evaluation of the same solution finds it in a node's cache instead. A Triton build's only verdict is
        a compile error: any other failure leaves the kernels to the evaluation's worker, as without one.
        """
        triton = self._builds_triton(solution)
        if not triton and (solution.language != "cuda" or not self.config.cluster.build_pool):
            return None, None
        if self.device == "cuda" and not self.infos:
            await self.describe()
        target = self._target()
        if triton and not target.archs:  # no evaluator reported its GPU's compute capability: nothing to build for
            return None, None
        key = (solution.id, target, workload_set if triton else None)
        build = self._start_build(solution, target, key[2], ahead)
        self.building[solution.id] = time.monotonic()
        try:
            record: BuildRecord = await self._await_build(build.record, solution)
        except RayError as exc:
            self._builds.pop(key, None)
            if triton:
                log.warning("the Triton build of %s failed in Ray (%s); its worker compiles the kernels", solution.name,
                            type(exc).__name__)
                return None, None
            raise EvaluatorPoolError(f"the build task for {solution.name} failed in Ray: {type(exc).__name__}") from None
        finally:
            self.building.pop(solution.id, None)
        if record.cached:
            self.build_hits += 1
        elif not build.counted:
            self.builds += 1
            self.build_s += record.seconds
            build.counted = True
        if record.status not in (Status.PASSED, Status.COMPILE_ERROR):
            self._builds.pop(key, None)  # a timeout or crash is not the source's verdict: retry later
            if triton:
                log.warning("the Triton build of %s ended %s (%s); its worker compiles the kernels", solution.name,
                            record.status.value, record.message)
                return None, None
        return record, build.library

    def _build_node_exists(self) -> bool:
        """cluster.build_fits, asked of Ray at most once per BUILD_CHECK_S for all the builds waiting (a blocking call
        on the driver's loop, and a large cluster's node list is long)."""
        from ksearch_ray.distributed.cluster import build_fits

        now = time.monotonic()
        if now - self._fit_checked[0] >= BUILD_CHECK_S:
            self._fit_checked = (now, build_fits(self.config.cluster.build_cpus, self.config.cluster.build_resource))
        return self._fit_checked[1]

    async def _await_build(self, ref: Any, solution: Solution) -> BuildRecord:
        """`ref`'s record; an error once no node could ever take the build for cluster.build_wait_s (at once on a
        local Ray started by this run, which nothing can grow), instead of waiting for ever."""
        from ksearch_ray.distributed.cluster import started_here

        cluster, local = self.config.cluster, started_here()
        future = asyncio.ensure_future(ref)
        unfit_since: float | None = None
        while True:
            done, _ = await asyncio.wait({future}, timeout=BUILD_CHECK_S)
            if done:
                return future.result()
            if self._build_node_exists():
                unfit_since = None
                continue
            if unfit_since is None:
                unfit_since = time.monotonic()
            if not local and (cluster.build_wait_s == 0 or time.monotonic() - unfit_since < cluster.build_wait_s):
                continue
            future.cancel()
            with contextlib.suppress(RayError, TypeError, ValueError):
                ray.cancel(ref)
            wanted = f"{cluster.build_cpus:g} CPUs (cluster.build_cpus)" + (
                f" and the resource {cluster.build_resource} (cluster.build_resource)" if cluster.build_resource else "")
            remedy = (f"give a node the resource {cluster.build_resource} or unset cluster.build_resource"
                      if cluster.build_resource else "lower cluster.build_cpus or add a node with that many CPUs")
            raise EvaluatorPoolError(
                f"no node of the cluster can take the build of {solution.name}: it asks for {wanted}"
                f"{'' if local else f', and no such node came in {cluster.build_wait_s:.0f} s'}; {remedy}, or set "
                "cluster.build_pool: false")

    def _build_verdict(self, solution: Solution, workload_set: str, record: BuildRecord) -> EvalResult:
        from ksearch_ray.taskspec.task import find_task

        if self._task is None:
            self._task = find_task(self.config.task, self.config.task_dirs)
        info = self.infos.get(0)
        self.done += 1
        return EvalResult(
            solution_id=solution.id, solution_name=solution.name, task=self._task.name, status=record.status,
            message=record.message or "build failed", log=record.log,
            workload_set=self._task.workload_set_name(workload_set, self.device), mode=self.config.evaluation.mode,
            device=self.device, device_name=info.name if info else "", build_seconds=record.seconds,
        )

    # --- evaluation -----------------------------------------------------------------------------

    async def evaluate(self, solution: Solution, workload_set: str, *, screen: bool = False) -> tuple[EvalResult, int]:
        """The verdict on `solution` from whichever evaluator is free first, and which one it was
        (`BUILDER` for a compile error). `screen`: timed by the run's screening rule, if it has one."""
        record, library = await self._built(solution, workload_set)
        if record is not None and not record.passed:
            return self._build_verdict(solution, workload_set, record), BUILDER
        losses = 0
        while True:
            index = await self._acquire()
            try:
                result = await self._on(index, solution, workload_set, record, library, screen)
            except RayActorError:
                losses += 1
                log.warning("evaluator %d died mid-evaluation of %s; it goes back to the queue (%d/%d)",
                            index, solution.name, losses, ACTOR_RETRIES)
                self._parked[index] += 1
                self._lose(index, solution)
                if losses >= ACTOR_RETRIES:
                    raise EvaluatorPoolError(f"{solution.name}: its evaluator died {ACTOR_RETRIES} times in a row") from None
                continue
            except BaseException:
                self.idle.put(index)  # the actor is alive; the error is ours to raise
                raise
            self.idle.put(index)
            return result, index

    def take_spare(self) -> int | None:
        while (index := self.idle.spare()) is not None:
            if index not in self._replacing and index not in self._given_up:
                return index
            self._parked[index] += 1  # its replacement puts it back once it runs
        return None

    async def prepare(self, solution: Solution, workload_set: str) -> tuple[EvalResult | None, Any]:
        record, library = await self._built(solution, workload_set)
        if record is not None and not record.passed:
            return self._build_verdict(solution, workload_set, record), None
        return None, (record, library)

    async def evaluate_spare(self, index: int, solution: Solution, workload_set: str, prepared: Any, *,
                             screen: bool = False) -> EvalResult | None:
        record, library = prepared
        try:
            result = await self._on(index, solution, workload_set, record, library, screen)
        except RayActorError:
            log.warning("evaluator %d died mid-evaluation of %s (spare work: not run again)", index, solution.name)
            self._parked[index] += 1
            self._lose(index, solution)
            return None
        except BaseException:
            self.idle.put(index)
            raise
        self.idle.put(index)
        return result

    async def evaluate_on(self, index: int, solution: Solution, workload_set: str) -> EvalResult:
        """The verdict of evaluator `index` (waits until it is free; if it dies, until its replacement runs)."""
        record, library = await self._built(solution, workload_set)
        if record is not None and not record.passed:
            return self._build_verdict(solution, workload_set, record)
        for attempt in range(1, ACTOR_RETRIES + 1):
            target = self._stand_in(index)
            if target in self._replacing:
                await asyncio.shield(self._replacing[target])
            if target in self._given_up:
                raise EvaluatorPoolError(f"evaluator {index} was lost and could not be replaced")
            try:
                return await self._on(target, solution, workload_set, record, library)
            except RayActorError:
                log.warning("evaluator %d died mid-evaluation (%d/%d)", target, attempt, ACTOR_RETRIES)
                self._lose(target, solution)
        raise EvaluatorPoolError(f"evaluator {index} died {ACTOR_RETRIES} times in a row")

    async def retime_on(self, index: int, solution: Solution, primary: EvalResult) -> RetimeResult:
        """A second, independent measurement of `primary` on evaluator `index` (or its stand-in)."""
        target = self._stand_in(index)
        async with self._locks[target]:
            with in_flight_on(self.in_flight, self.in_flight_next, target, f"{solution.name} (re-timing)"):
                result: RetimeResult = await self.actors[target].retime.remote(
                    self.config.task, self.config.task_dirs, solution, primary)
                return result

    async def profile_on(self, index: int, solution: Solution, measured: EvalResult, timeout_s: float) -> ProfileResult:
        """One call of `solution` profiled by evaluator `index` (or its stand-in), between its measurements."""
        target = self._stand_in(index)
        async with self._locks[target]:
            with in_flight_on(self.in_flight, self.in_flight_next, target, f"{solution.name} (profiling)"):
                try:
                    result: ProfileResult = await self.actors[target].profile.remote(
                        self.config.task, self.config.task_dirs, solution, measured, timeout_s)
                except RayActorError:
                    raise EvaluatorPoolError(f"evaluator {target} died while it profiled {solution.name}") from None
                return result

    def _stand_in(self, index: int) -> int:
        """`index`; while it is lost, a running evaluator with the same GPU, if there is one (an addressed
        evaluation is about the GPU type: baselines, re-timing), rather than waiting for a replacement that a
        lost node may never get."""
        if index not in self._replacing and index not in self._given_up:
            return index
        gpu = self.infos[index].name if index in self.infos else None
        for other in range(self.size):
            running = other not in self._replacing and other not in self._given_up
            if running and other != index and gpu is not None and other in self.infos and self.infos[other].name == gpu:
                return other
        return index

    async def _on(self, index: int, solution: Solution, workload_set: str, record: BuildRecord | None,
                  library: Any, screen: bool = False) -> EvalResult:
        """One evaluation on evaluator `index`; RayActorError if it dies meanwhile."""
        async with self._locks[index]:
            with in_flight_on(self.in_flight, self.in_flight_next, index, solution.name):
                result: EvalResult = await self.actors[index].evaluate.remote(
                    self.config.task, self.config.task_dirs, solution, workload_set, self.config.evaluation.mode, record, library,
                    screen,
                )
        self.done += 1
        # Overlapping evaluations (evaluation.overlap) count once: each adds what the one begun before it did not cover.
        busy = result.device_seconds if result.device_seconds is not None else result.seconds
        self.busy_s[index] = self.busy_s.get(index, 0.0) + busy
        if record is not None:
            self._builds.pop((solution.id, record.target, workload_set if record.kind == "triton" else None), None)
        return result

    def release(self) -> None:
        """Close this pool's evaluators (their sandboxes), then kill the actors: their GPUs go back to the
        cluster. An evaluator still busy gets a few seconds; its sandbox dies with it (the zygote exits
        when its evaluator's end of the control socket closes)."""
        for task in self._replacing.values():
            task.cancel()
        closing = []
        for actor in self.actors:
            with contextlib.suppress(RayError):
                closing.append(actor.close.remote())
        if closing:
            ray.wait(closing, num_returns=len(closing), timeout=CLOSE_GRACE_S)
        for actor in self.actors:
            with contextlib.suppress(RayError):  # already dead with its node
                ray.kill(actor, no_restart=True)
