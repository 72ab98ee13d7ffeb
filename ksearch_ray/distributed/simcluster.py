"""A simulated GPU cluster and LLM provider, and one search at a width against them (issue 42).

What is simulated, and only that:

* **The cluster**: Ray's `cluster_utils.Cluster`, a head and worker nodes (real raylets) declaring fake
  GPUs, so evaluator actors are placed one per GPU across nodes as on a real cluster.
* **The GPUs**: evaluator actors (`sim_evaluator_class`) with the EvaluatorActor's methods whose
  evaluation sleeps a time drawn from `EvalLatency` (log-normal; the defaults from the H200 figures in
  docs/benchmarks.md, "Evaluation throughput": TriMul's seed 2.09 s, its baseline 1.60 s, a first
  evaluation with its Triton compile 4.87 s, the decode references 5.9 to 6.8 s) and ends, for a
  small share, in a failure; its verdict's score is drawn from the kernel's id.
* **The provider**: the stand-in (`policies.standin`) with a reply latency and request and token limits
  per window that it enforces with 429s and a Retry-After (`Habits.requests_per_min` ...).

Everything else is the product's own: the engine, the K-Search method, the world-model actor, the
planner and coder actors with litellm over HTTP to the loopback provider, the shared rate limiter, the
evaluator pool. `time_factor` scales every simulated duration (LLM latency, evaluations, the limit's
window) so a test can run the same shape in seconds; figures are reported in simulated seconds too.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import random
import resource
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ksearch_ray.run.engine import Search

HERE = Path(__file__).resolve().parent
TOY_TASKS = HERE.parents[1] / "tests" / "data"  # in a checkout; an installed package has none: pass task_dirs


@dataclass(frozen=True)
class EvalLatency:
    """Seconds one simulated evaluation takes: log-normal around `median_s`, at most `cap_s`; `fail_share`
    of evaluations end in a runtime error after half their time."""

    median_s: float = 2.1
    sigma: float = 0.55
    """ln-spread: with 2.1 s, the 95th percentile is 5.2 s and the 99.9th 11.4 s (the long tail)."""
    cap_s: float = 30.0
    fail_share: float = 0.03
    time_factor: float = 1.0

    def draw(self, rng: random.Random) -> tuple[float, bool]:
        seconds = min(self.cap_s, self.median_s * math.exp(rng.gauss(0.0, self.sigma)))
        failed = rng.random() < self.fail_share
        return (seconds / 2 if failed else seconds) * self.time_factor, failed


def sim_evaluator_class(latency: EvalLatency) -> Any:
    """A Ray actor class with the EvaluatorActor's methods whose evaluations only take time."""
    import ray

    class SimEvaluator:
        def __init__(self, device: str, settings_json: str, *, scratch_dir: str | None = None,
                     secret_names: list[str | None] | None = None, secret: int | None = None):
            self.node = ray.get_runtime_context().get_node_id()
            self.rng = random.Random(f"{self.node}:{time.time_ns()}")
            self.busy: list[tuple[float, float]] = []  # (start, end), time.time

        def describe(self) -> Any:
            from ksearch_ray.evaluation.describe import EvaluatorInfo

            return EvaluatorInfo(device="cpu", name="Simulated H200", hardware="a simulated GPU", node=self.node)

        async def evaluate(self, task_name: str, task_dirs: list[str], solution: Any, workload_set: str, mode: str,
                           build: Any = None, library: Any = None, screen: bool = False) -> Any:
            from ksearch_ray.models import EvalResult, Status, Timing, WorkloadResult

            seconds, failed = latency.draw(self.rng)
            start = time.time()
            await asyncio.sleep(seconds)
            self.busy.append((start, time.time()))
            base = solution.name in ("baseline", "reference", "good", "triton_seed")
            ms = 1.0 if base else 0.5 + (zlib.crc32(solution.id.encode()) % 1000) / 500
            common = dict(solution_id=solution.id, solution_name=solution.name, task=solution.task,
                          workload_set=workload_set, mode=mode, device="cpu", device_name="Simulated H200",
                          seconds=seconds)
            if failed and not base:
                return EvalResult(status=Status.RUNTIME_ERROR, message="simulated failure", **common)
            timing = Timing(mean_ms=ms, median_ms=ms, min_ms=ms, std_ms=0.0, count=3, wall_median_ms=ms,
                            clock="host_wall")
            return EvalResult(status=Status.PASSED, timed=True, score=ms, score_kind="geomean of mean latency (ms)",
                              workloads=[WorkloadResult(workload="w", status=Status.PASSED, timing=timing)], **common)

        def retime(self, task_name: str, task_dirs: list[str], solution: Any, primary: Any) -> Any:
            from ksearch_ray.evaluation.retime import RetimeResult
            from ksearch_ray.models import Status

            return RetimeResult(agreed=True, status=Status.PASSED, message="")

        def profile(self, *args: Any) -> Any:
            raise RuntimeError("profiling is not simulated")

        def busy_intervals(self) -> list[tuple[float, float]]:
            return list(self.busy)

        def close(self) -> None:
            pass

    return ray.remote(max_restarts=0)(SimEvaluator)  # (async methods: the actor is async)


@dataclass
class SimSettings:
    width: int = 1024
    gpus: int = 128
    nodes: int = 4
    rounds: int = 10_000
    time_factor: float = 1.0
    llm_latency_s: tuple[float, float] = (20.0, 60.0)
    requests_per_min: int = 3_000
    tokens_per_min: int = 20_000_000
    tell_limits: bool = True
    """Give the run the provider's limits (llm.requests_per_min ...); False: it learns them from 429s."""
    policy_actors: int = 4
    max_parallel_attempts: int | None = None
    """search.ksearch.max_parallel_attempts (1: every cycle sequential, as before issue 42)."""
    eval_latency: EvalLatency = field(default_factory=EvalLatency)
    distinct_code: bool = True
    """The simulated model writes a file no other reply has (the stand-in's `distinct_code`), as a model sampling at a
    temperature mostly does; False: the stand-in's own changes, which the toy task's ~100 kernels soon exhaust (the
    solution cache then answers most candidates, and the GPUs idle for want of new code, not of machinery)."""
    autotune_variants: int = 0
    """search.autotune_variants: evaluations of each passed candidate's tunables, beside the coder's candidates."""
    tune_when_idle: bool = False
    """search.tune_when_idle: evaluators that would idle tune the fastest passed candidates (`run.idle_tuning`)."""
    sample_s: float = 1.0
    """Simulated seconds between samples of the busy share and the cycles at work."""
    task_dirs: tuple[str, ...] = (str(TOY_TASKS),)
    """Where the toy task is (the checkout's tests/data by default)."""


@dataclass
class Sample:
    t: float  # simulated seconds since the search started
    evaluators_busy: int
    cycles: int
    attempts: int  # coder calls in flight, and candidates with the evaluators (waiting for one, or measured)
    rounds: int
    taken: int = 0  # rounds handed out: recorded, or held by an attempt in flight


def run_config(s: SimSettings, api_base: str, run_dir: Path) -> Any:
    from ksearch_ray.config import validate_config

    f = s.time_factor
    llm: dict[str, Any] = {"model": "hosted_vllm/standin", "api_base": api_base, "concurrency": max(8, s.width),
                           "stream": False, "timeout_s": 200 * f + 5, "backoff_base_s": 2 * f, "backoff_max_s": 60 * f,
                           "limit_window_s": 60 * f}
    if s.tell_limits:
        llm |= {"requests_per_min": s.requests_per_min, "tokens_per_min": s.tokens_per_min}
    return validate_config({
        "task": "toy_axpy", "task_dirs": list(s.task_dirs), "run_dir": str(run_dir), "progress": False,
        "llm": llm,
        "evaluation": {"device": "cpu", "evaluators": s.gpus, "evaluator_cpus": 0.0001, "evaluator_gpus": True},
        "search": {"width": s.width, "noise_repeats": 1, "confirm_repeats": 0, "warmup": False,
                   "retime_best": False, "ksearch": {"max_parallel_attempts": s.max_parallel_attempts},
                   "autotune_variants": s.autotune_variants, "tune_when_idle": s.tune_when_idle},
        "budget": {"rounds": s.rounds},
        "cluster": {"policy_actors": s.policy_actors},
    })


def standin_habits(s: SimSettings) -> Any:
    from ksearch_ray.policies.standin.habits import Habits

    f = s.time_factor
    # A provider without format troubles: what is measured here is the machinery, not the parsing.
    return Habits(other_shape=0, prose_only=0, broken_json=0, missing_fields=0, coder_prose_only=0, code_drift=0,
                  distinct_code=s.distinct_code,
                  rate_limit_every=0, latency_s=(s.llm_latency_s[0] * f, s.llm_latency_s[1] * f),
                  requests_per_min=s.requests_per_min, tokens_per_min=s.tokens_per_min, limit_window_s=60 * f)


def start_cluster(s: SimSettings) -> Any:
    """A head without GPUs (the driver's actors) and `nodes` workers sharing the GPUs."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 4, "num_gpus": 0})
    per_node = [s.gpus // s.nodes + (1 if i < s.gpus % s.nodes else 0) for i in range(s.nodes)]
    for gpus in per_node:
        cluster.add_node(num_cpus=max(2, gpus), num_gpus=gpus)
    cluster.wait_for_nodes()
    return cluster


async def _search(search: Search, s: SimSettings) -> list[Sample]:
    samples: list[Sample] = []
    t0 = time.monotonic()

    async def sample() -> None:
        while True:
            await asyncio.sleep(s.sample_s * s.time_factor)
            cycles = sum(1 for key in search.working_on if key.startswith("c"))
            coder = sum(1 for role, _k, _t in search.llm.in_flight.values() if role == "coder")
            samples.append(Sample(t=(time.monotonic() - t0) / s.time_factor, evaluators_busy=len(search.evals.pool.in_flight),
                                  cycles=cycles, attempts=coder + search.evals.measuring,
                                  rounds=search.view.rounds_used,
                                  taken=search.view.rounds_used + len(search.budget.outstanding)))

    sampler = asyncio.create_task(sample())
    try:
        await search.run()
    finally:
        sampler.cancel()
    return samples


def simulate(s: SimSettings, run_dir: Path) -> dict[str, Any]:
    """One search on the simulated cluster; its figures (see `experiments/sim_cluster.py`)."""
    import ray

    from ksearch_ray.distributed.ray_backends import ray_search
    from ksearch_ray.policies.standin.server import StandIn
    from ksearch_ray.store import RunStore
    from ksearch_ray.taskspec.task import find_task

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    cluster = start_cluster(s)
    try:
        ray.init(address=cluster.address, logging_level=logging.WARNING, log_to_driver=False)
        with StandIn(habits=standin_habits(s)) as provider:
            config = run_config(s, provider.api_base, run_dir)
            store = RunStore.create(run_dir, {"run_id": run_dir.name, "config": config.model_dump(mode="json")})
            task = find_task(config.task, config.task_dirs)
            search = ray_search(config, task, store, pool_options={"actor_class": sim_evaluator_class(s.eval_latency)})
            cpu0 = resource.getrusage(resource.RUSAGE_SELF)
            t0 = time.monotonic()
            try:
                samples = asyncio.run(_search(search, s))
            finally:
                store.close()
            wall = time.monotonic() - t0
            cpu1 = resource.getrusage(resource.RUSAGE_SELF)
            statuses = [e.status for e in provider.exchanges]
        result = figures(s, run_dir, samples, wall, (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime),
                         statuses)
        result["evaluator_nodes"] = len({info.node for info in search.evals.infos})
        return result
    finally:
        ray.shutdown()
        cluster.shutdown()


def warm_window(samples: list[Sample], s: SimSettings) -> list[Sample]:
    """The samples once warmed up and before the budget ran out: from one longest LLM reply after the first
    evaluation of a candidate (every cycle has had its first reply by then) to the last round handed out (past it
    the attempts in flight drain, as the budget, not the machinery, says)."""
    first = next((x.t for x in samples if x.rounds > 0), None)
    if first is None:
        return []
    last = next((x.t for x in samples if x.taken >= s.rounds), samples[-1].t)
    start = first + s.llm_latency_s[1]
    return [x for x in samples if start <= x.t <= last]


def figures(s: SimSettings, run_dir: Path, samples: list[Sample], wall_s: float, driver_cpu_s: float,
            statuses: list[int]) -> dict[str, Any]:
    import json

    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    end: dict[str, Any] = next((e for e in reversed(events) if e["kind"] == "run_end"), {})
    rounds = int(end.get("rounds") or 0)
    warm = warm_window(samples, s)
    busy = sum(x.evaluators_busy for x in warm) / (len(warm) * s.gpus) if warm else None
    slots = sum(min(x.attempts, s.width) for x in warm) / (len(warm) * s.width) if warm else None
    all_bytes = sum(p.stat().st_size for p in run_dir.rglob("*") if p.is_file())
    seconds = {"candidates": 0.0, "tuning": 0.0, "idle tuning": 0.0}
    for e in events:
        if e["kind"] == "evaluation" or e["kind"] == "tune":
            part = "candidates" if e["kind"] == "evaluation" else "idle tuning" if e.get("idle") else "tuning"
            seconds[part] += e["result"].get("seconds") or 0.0
    measured = sum(seconds.values())
    sim_wall = wall_s / s.time_factor
    return {
        "width": s.width, "gpus": s.gpus, "nodes": s.nodes, "rounds": rounds, "time_factor": s.time_factor,
        "wall_s": wall_s, "sim_wall_s": sim_wall, "rounds_per_sim_s": rounds / sim_wall if sim_wall else 0.0,
        "warm_s": (warm[-1].t - warm[0].t) if len(warm) > 1 else 0.0,
        "busy_share": busy, "slot_share": slots,
        "measured_shares": {k: v / measured for k, v in seconds.items()} if measured else {},
        "peak_cycles": max((x.cycles for x in samples), default=0),
        "mean_cycles_warm": sum(x.cycles for x in warm) / len(warm) if warm else None,
        "driver_cpu_share": driver_cpu_s / wall_s if wall_s else None,
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "run_dir_kb_per_round": all_bytes / 1e3 / max(rounds, 1),
        "provider_requests": len(statuses), "provider_429s": sum(1 for x in statuses if x == 429),
        "end": end.get("reason"),
        "samples": [x.__dict__ for x in samples],
    }
