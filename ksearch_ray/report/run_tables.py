"""A run directory as tables (polars): what `ksearch show`, `show --follow` and `ksearch report` read.

Everything comes from the run directory's manifest and the run's read model (`events.RunView`, the
same reducer the live run uses), and nothing is written to it, so a run in progress can be read
while its driver appends, and a view can never disagree with the run about its best, its outcome or
its time. A log or record that cannot be read is a `RunDirError` with one line, never a quiet gap.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import polars as pl
from pydantic import ValidationError

from ksearch_ray.events import Best, Event, RunView, Seed
from ksearch_ray.measure import Noise
from ksearch_ray.models import EvalResult, Solution
from ksearch_ray.store import RunDirError, RunStore, read_manifest
from ksearch_ray.worldmodel.tree import Tree

WORLD_MODEL_METHOD = "ksearch"
"""The search method that keeps a world model."""


class Origin:
    """What an evaluation was of (the `origin` column)."""

    BASELINE = "baseline"
    SEED = "seed"
    SEED_REPEAT = "seed repeat"
    BEST_REMEASURED = "best re-measured"
    BASELINE_REPEAT = "baseline repeat"
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
        for name in ("evaluations", "timeline", "best_progress", "llm_calls", "baseline"):
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
        rows = self.view.timeline
        return pl.DataFrame({"seq": [r.seq for r in rows], "t": [r.t for r in rows], "kind": [r.kind for r in rows],
                             "elapsed_s": [r.active_s for r in rows], "cost_usd": [r.cost_usd for r in rows]},
                            schema={"seq": pl.Int64, "t": pl.Float64, "kind": pl.Utf8, "elapsed_s": pl.Float64,
                                    "cost_usd": pl.Float64})

    @cached_property
    def evaluations(self) -> pl.DataFrame:
        """Every evaluation (baseline, seed, candidates, tuner variants) and every round that produced no code."""
        rows = [{
            "seq": r.seq, "origin": r.origin, "round": r.round, "cycle": r.cycle, "node": r.node, "lane": r.lane,
            "gpu": r.gpu, "solution_id": r.solution_id, "status": r.status, "speedup": r.speedup, "score": r.score,
            "seconds": r.seconds, "error": r.error, "elapsed_s": r.active_s,
        } for r in self.view.rows]
        schema = {
            "seq": pl.Int64, "origin": pl.Utf8, "round": pl.Int64, "cycle": pl.Utf8, "node": pl.Utf8, "lane": pl.Utf8,
            "gpu": pl.Utf8, "solution_id": pl.Utf8, "status": pl.Utf8, "speedup": pl.Float64, "score": pl.Float64,
            "seconds": pl.Float64, "error": pl.Utf8, "elapsed_s": pl.Float64,
        }
        return pl.DataFrame(rows, schema=schema)

    @cached_property
    def best_progress(self) -> pl.DataFrame:
        """Best-so-far speedup: one row per change of the run's best (the seed first, at round 0)."""
        rows = [{"seq": r.seq, "round": r.round, "speedup": r.speedup, "solution_id": r.solution_id, "node": r.node,
                 "why": r.why, "elapsed_s": r.active_s, "cost_usd": r.cost_usd} for r in self.view.best_rows]
        return pl.DataFrame(rows, schema={"seq": pl.Int64, "round": pl.Int64, "speedup": pl.Float64, "solution_id": pl.Utf8,
                                          "node": pl.Utf8, "why": pl.Utf8, "elapsed_s": pl.Float64, "cost_usd": pl.Float64})

    @cached_property
    def llm_calls(self) -> pl.DataFrame:
        rows = [{
            "seq": e.seq, "role": e.role, "kind": e.call.kind, "model": e.call.model,
            "prompt_tokens": e.call.prompt_tokens, "completion_tokens": e.call.completion_tokens,
            "cost_usd": e.call.cost_usd, "cost_known": e.call.cost_known, "cached": e.call.cached,
            "failed": e.call.error is not None, "latency_s": e.call.latency_s, "error": e.call.error,
        } for e in self.view.llm_calls]
        return pl.DataFrame(rows, schema={
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

    def ledger(self) -> pl.DataFrame:
        """LLM calls per role and call kind: calls, cached, failed, tokens, cost, mean latency."""
        return (
            self.llm_calls.group_by("role", "kind")
            .agg(
                calls=pl.len(), cached=pl.col("cached").sum(), failed=pl.col("failed").sum(),
                prompt_tokens=pl.col("prompt_tokens").sum(), completion_tokens=pl.col("completion_tokens").sum(),
                cost_usd=pl.col("cost_usd").sum(), mean_latency_s=pl.col("latency_s").mean(),
            )
            .sort("role", "kind")
        )

    def workload_comparison(self) -> pl.DataFrame:
        """Per-workload mean latency of the best solution against the baseline's (timed workloads only)."""
        # `speedup` is the objective's; both figures' speedups beside it (kernel: graph replay; call).
        schema = {"workload": pl.Utf8, "baseline_ms": pl.Float64, "best_ms": pl.Float64, "speedup": pl.Float64,
                  "kernel_speedup": pl.Float64, "call_speedup": pl.Float64}
        base, best = self.best_baseline(), self.best_result()
        if base is None or best is None:
            return pl.DataFrame([], schema=schema)

        def means(result: EvalResult, tag: str) -> pl.DataFrame:
            return pl.DataFrame(
                [{"workload": w.workload, f"{tag}_ms": w.timing.mean_ms if w.timing else None,
                  f"{tag}_kernel": w.kernel_ms, f"{tag}_call": w.call_ms} for w in result.workloads],
                schema={"workload": pl.Utf8, f"{tag}_ms": pl.Float64, f"{tag}_kernel": pl.Float64, f"{tag}_call": pl.Float64},
            )

        joined = means(base, "baseline").join(means(best, "best"), on="workload", how="full", coalesce=True)
        return joined.with_columns(
            speedup=pl.col("baseline_ms") / pl.col("best_ms"),
            kernel_speedup=pl.col("baseline_kernel") / pl.col("best_kernel"),
            call_speedup=pl.col("baseline_call") / pl.col("best_call"),
        ).select(list(schema))


def _first_error(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        return f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}"
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
