"""A run directory as tables: what `ksearch show`, `show --follow` and `ksearch report` read.

Everything comes from the run directory's manifest and the run's read model (`events.RunView`, the
same reducer the live run uses), and nothing is written to it, so a run in progress can be read
while its driver appends, and a view can never disagree with the run about its best, its outcome or
its time. A log or record that cannot be read is a `RunDirError` with one line, never a quiet gap.

Each table is rows of plain records first (what `show` draws) and a polars frame of them second (what `report`
and the analysis compute with); polars is imported only when a frame is asked for, so `show` never pays its
import (a third of a second).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from ksearch_ray.events import Best, Event, RunView, Seed
from ksearch_ray.measure import Noise
from ksearch_ray.models import EvalResult, Solution
from ksearch_ray.store import RunDirError, RunStore, read_manifest
from ksearch_ray.worldmodel.tree import Tree

if TYPE_CHECKING:
    import polars as pl

WORLD_MODEL_METHOD = "ksearch"
"""The search method that keeps a world model."""


class Origin:
    """What an evaluation was of (the `origin` column)."""

    BASELINE = "baseline"
    SEED = "seed"
    SEED_REPEAT = "seed repeat"
    BEST_REMEASURED = "best re-measured"
    BASELINE_REPEAT = "baseline repeat"
    FULL_TIMING = "full timing of a screened candidate"
    CANDIDATE = "candidate"
    TUNE = "tune"


@dataclass
class Run:
    """One run directory, read once: its manifest and the read model of its events."""

    root: Path
    manifest: dict[str, Any]
    view: RunView = field(default_factory=RunView)
    torn: str | None = None
    """The torn last line of the log that was read without (store.RunStore.read_events), in one line."""

    @classmethod
    def load(cls, root: Path) -> Run:
        root = Path(root)
        manifest = read_manifest(root)
        store = RunStore(root)
        store.check_schema()
        run = cls(root, manifest, RunView.of(store.read_events(), store.has_solution))  # read only: repairs in memory
        run.torn = store.torn
        return run

    def extend(self, events: Iterable[Event]) -> Run:
        """The same run with more events applied (`show --follow`); tables are derived again."""
        for event in events:
            self.view.apply(event)
        for name, member in vars(type(self)).items():
            if isinstance(member, cached_property):
                self.__dict__.pop(name, None)
        return self

    # --- facts ---------------------------------------------------------------------------------

    @property
    def events(self) -> list[Event]:
        return self.view.events

    @property
    def config(self) -> dict[str, Any]:
        """The manifest's configuration, with the budget later sessions changed (`ksearch resume --rounds`)."""
        config = dict(self.manifest.get("config") or {})
        config["budget"] = {**(config.get("budget") or {}), **self.view.budget}
        return config

    @property
    def run_id(self) -> str:
        return str(self.manifest.get("run_id") or self.root.name)

    @property
    def method(self) -> str:
        return str((self.config.get("search") or {}).get("method") or WORLD_MODEL_METHOD)

    @property
    def keeps_world_model(self) -> bool:
        return self.method == WORLD_MODEL_METHOD

    @property
    def model(self) -> str | None:
        return (self.config.get("llm") or {}).get("model")

    @property
    def policy(self) -> str:
        """Who wrote the code: the model, or the offline policy."""
        return f"llm: {self.model}" if self.model else "offline policy (tunable search, no LLM)"

    @property
    def rounds_budget(self) -> int | None:
        return (self.config.get("budget") or {}).get("rounds")

    @property
    def finished(self) -> str | None:
        return self.view.finished

    @property
    def stopped(self) -> str | None:
        return None if self.view.finished is not None else self.view.stopped

    @property
    def over(self) -> bool:
        return self.view.over

    @property
    def resumes(self) -> int:
        return self.view.resumes

    @property
    def rounds_used(self) -> int:
        return self.view.rounds_used

    @property
    def wall_s(self) -> float:
        return self.view.active_s

    @property
    def last_event_t(self) -> float | None:
        return self.view.last_t

    @property
    def baseline(self) -> EvalResult | None:
        return self.view.baseline

    @property
    def seed(self) -> Seed | None:
        seed = self.view.seed
        return seed if seed is not None and seed.solution_id else None

    @property
    def best(self) -> Best | None:
        return self.view.best

    def noise(self, gpu: str | None = None) -> Noise | None:
        return self.view.noise(gpu)

    @property
    def confirms(self) -> dict[str, Any]:
        return self.view.confirms

    @property
    def tree(self) -> Tree | None:
        return self.view.tree

    @property
    def hardware(self) -> str:
        for result in self.view.results_at.values():
            if result.device_name:
                return result.device_name
        return str((self.config.get("evaluation") or {}).get("device") or "")

    @property
    def workload_set(self) -> str | None:
        """The workload set as it resolved on the device (e.g. benchmarks-cpu)."""
        return next((r.workload_set for r in self.view.results_at.values()), None)

    def solution(self, solution_id: str) -> Solution | None:
        store = RunStore(self.root)
        if not store.has_solution(solution_id):
            return None
        try:
            return store.load_solution(solution_id)
        except (ValueError, ValidationError) as exc:
            raise RunDirError(f"{store.solutions_dir / solution_id}.json: not a readable solution ({_first_error(exc)})") from None

    def best_result(self) -> EvalResult | None:
        found = self.view.best_measurement()
        return found[0] if found else None

    def best_baseline(self) -> EvalResult | None:
        """The baseline the best was compared with: measured on the same evaluator, in the same session."""
        found = self.view.best_measurement()
        return found[1] if found else self.view.baseline

    def status_counts(self) -> dict[str, int]:
        return self.view.status_counts()

    def cycles_in_flight(self) -> list[tuple[str, str]]:
        return self.view.cycles_in_flight()

    # --- tables ----------------------------------------------------------------------------------

    @cached_property
    def timeline(self) -> pl.DataFrame:
        """One row per event: seq, t, kind, elapsed_s (active running time) and cost_usd (LLM spend so far)."""
        import polars as pl

        rows = self.view.timeline
        return pl.DataFrame({"seq": [r.seq for r in rows], "t": [r.t for r in rows], "kind": [r.kind for r in rows],
                             "elapsed_s": [r.active_s for r in rows], "cost_usd": [r.cost_usd for r in rows]},
                            schema={"seq": pl.Int64, "t": pl.Float64, "kind": pl.Utf8, "elapsed_s": pl.Float64,
                                    "cost_usd": pl.Float64})

    @cached_property
    def evaluation_rows(self) -> list[dict[str, Any]]:
        """Every evaluation (baseline, seed, candidates, tuner variants) and every round that produced no code."""
        return [{
            "seq": r.seq, "origin": r.origin, "round": r.round, "cycle": r.cycle, "node": r.node, "lane": r.lane,
            "gpu": r.gpu, "solution_id": r.solution_id, "status": r.status, "speedup": r.speedup, "score": r.score,
            "seconds": r.seconds, "error": r.error, "elapsed_s": r.active_s,
        } for r in self.view.rows]

    @cached_property
    def evaluations(self) -> pl.DataFrame:
        """`evaluation_rows` as a frame."""
        import polars as pl

        schema = {
            "seq": pl.Int64, "origin": pl.Utf8, "round": pl.Int64, "cycle": pl.Utf8, "node": pl.Utf8, "lane": pl.Utf8,
            "gpu": pl.Utf8, "solution_id": pl.Utf8, "status": pl.Utf8, "speedup": pl.Float64, "score": pl.Float64,
            "seconds": pl.Float64, "error": pl.Utf8, "elapsed_s": pl.Float64,
        }
        return pl.DataFrame(self.evaluation_rows, schema=schema)

    @cached_property
    def best_progress_rows(self) -> list[dict[str, Any]]:
        """Best-so-far speedup: one row per change of the run's best (the seed first, at round 0)."""
        return [{"seq": r.seq, "round": r.round, "speedup": r.speedup, "solution_id": r.solution_id, "node": r.node,
                 "why": r.why, "elapsed_s": r.active_s, "cost_usd": r.cost_usd} for r in self.view.best_rows]

    @cached_property
    def best_progress(self) -> pl.DataFrame:
        """`best_progress_rows` as a frame."""
        import polars as pl

        return pl.DataFrame(self.best_progress_rows, schema={"seq": pl.Int64, "round": pl.Int64, "speedup": pl.Float64, "solution_id": pl.Utf8,
                                          "node": pl.Utf8, "why": pl.Utf8, "elapsed_s": pl.Float64, "cost_usd": pl.Float64})

    @cached_property
    def llm_call_rows(self) -> list[dict[str, Any]]:
        """One row per LLM call: role, kind, model, tokens, cost, cached, failed, latency, error."""
        return [{
            "seq": e.seq, "role": e.role, "kind": e.call.kind, "model": e.call.model,
            "prompt_tokens": e.call.prompt_tokens, "completion_tokens": e.call.completion_tokens,
            "cost_usd": e.call.cost_usd, "cost_known": e.call.cost_known, "cached": e.call.cached,
            "failed": e.call.error is not None, "latency_s": e.call.latency_s, "error": e.call.error,
        } for e in self.view.llm_calls]

    @cached_property
    def llm_calls(self) -> pl.DataFrame:
        """`llm_call_rows` as a frame."""
        import polars as pl

        return pl.DataFrame(self.llm_call_rows, schema={
            "seq": pl.Int64, "role": pl.Utf8, "kind": pl.Utf8, "model": pl.Utf8, "prompt_tokens": pl.Int64,
            "completion_tokens": pl.Int64, "cost_usd": pl.Float64, "cost_known": pl.Boolean, "cached": pl.Boolean,
            "failed": pl.Boolean, "latency_s": pl.Float64, "error": pl.Utf8,
        })

    @property
    def llm_tokens(self) -> int:
        return self.view.llm_tokens

    @property
    def llm_cost_usd(self) -> float:
        return self.view.llm_cost_usd

    @property
    def llm_cost_so_far(self) -> float:
        """The LLM spend at the last event (the timeline's last `cost_usd`)."""
        return self.view.timeline[-1].cost_usd if self.view.timeline else 0.0

    def ledger_rows(self) -> list[dict[str, Any]]:
        """LLM calls per role and call kind, sorted: calls, cached, failed, tokens, cost (an unknown price is
        0.0 in the call's record), mean latency."""
        groups: dict[tuple[str, str], list[Any]] = {}
        for event in self.view.llm_calls:
            groups.setdefault((event.role, event.call.kind), []).append(event.call)
        rows = []
        for (role, kind), calls in sorted(groups.items()):
            rows.append({
                "role": role, "kind": kind, "calls": len(calls), "cached": sum(c.cached for c in calls),
                "failed": sum(c.error is not None for c in calls), "prompt_tokens": sum(c.prompt_tokens for c in calls),
                "completion_tokens": sum(c.completion_tokens for c in calls), "cost_usd": sum(c.cost_usd for c in calls),
                "mean_latency_s": sum(c.latency_s for c in calls) / len(calls),
            })
        return rows

    def ledger(self) -> pl.DataFrame:
        """`ledger_rows` as a frame."""
        import polars as pl

        return pl.DataFrame(self.ledger_rows(), schema={
            "role": pl.Utf8, "kind": pl.Utf8, "calls": pl.UInt32, "cached": pl.UInt32, "failed": pl.UInt32,
            "prompt_tokens": pl.Int64, "completion_tokens": pl.Int64, "cost_usd": pl.Float64, "mean_latency_s": pl.Float64})

    def workload_rows(self) -> list[dict[str, Any]]:
        """Per-workload mean latency of the best solution against the baseline's (timed workloads only): the
        baseline's workloads in its order, then any only the best has. `speedup` is the objective's; both
        figures' speedups beside it (kernel: graph replay; call)."""
        base, best = self.best_baseline(), self.best_result()
        if base is None or best is None:
            return []

        def figures(result: EvalResult) -> dict[str, tuple[float | None, float | None, float | None]]:
            return {w.workload: (w.timing.mean_ms if w.timing else None, w.kernel_ms, w.call_ms) for w in result.workloads}

        def ratio(a: float | None, b: float | None) -> float | None:
            return a / b if a is not None and b is not None and b != 0 else None

        ours, theirs = figures(best), figures(base)
        rows = []
        for name in [*theirs, *(w for w in ours if w not in theirs)]:
            b, o = theirs.get(name, (None, None, None)), ours.get(name, (None, None, None))
            rows.append({"workload": name, "baseline_ms": b[0], "best_ms": o[0], "speedup": ratio(b[0], o[0]),
                         "kernel_speedup": ratio(b[1], o[1]), "call_speedup": ratio(b[2], o[2])})
        return rows

    def workload_comparison(self) -> pl.DataFrame:
        """`workload_rows` as a frame."""
        import polars as pl

        return pl.DataFrame(self.workload_rows(), schema={
            "workload": pl.Utf8, "baseline_ms": pl.Float64, "best_ms": pl.Float64, "speedup": pl.Float64,
            "kernel_speedup": pl.Float64, "call_speedup": pl.Float64})


def _first_error(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        return f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}"
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
