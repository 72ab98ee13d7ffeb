"""A run directory as tables (polars): what `ksearch show`, `show --follow` and `ksearch report` read.

Everything comes from the run directory and nothing is written to it, so a run in progress can
be read while its driver appends. Search methods write different subsets of the events, and
events gain fields over time: a missing key means "not recorded" and every view says so. A
log or record that cannot be read is a `RunDirError` with one line, never a quiet gap.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import polars as pl
from pydantic import ValidationError

from ksearch_ray.models import EvalResult, Solution, Status
from ksearch_ray.search.store import RunDirError, RunStore
from ksearch_ray.worldmodel.tree import Tree

NO_CODE = "NO_CODE"
"""The status column's value for a round whose generation returned no code (nothing was evaluated)."""

ERROR_LINES = 4
"""Lines of an evaluation's error kept in the tables: enough to recognise it, short enough to scan."""


WORLD_MODEL_METHOD = "ksearch"
"""The search method that keeps a world model; runs made before methods were named are this one."""


class Origin:
    """What an evaluation was of (the `origin` column)."""

    BASELINE = "baseline"
    SEED = "seed"
    SEED_REPEAT = "seed repeat"
    CANDIDATE = "candidate"


ORIGINS = {"baseline": Origin.BASELINE, "seed": Origin.SEED, "seed_failed": Origin.SEED, "evaluation": Origin.CANDIDATE}
"""Events that carry a full evaluation result, and what it was of."""


def first_lines(text: str | None, n: int = ERROR_LINES) -> str:
    lines = [line.rstrip() for line in (text or "").strip().splitlines() if line.strip()]
    return "\n".join(lines[:n] + (["..."] if len(lines) > n else []))


def read_manifest(root: Path) -> dict[str, Any]:
    path = root / "manifest.json"
    if root.exists() and not root.is_dir():
        raise RunDirError(f"{root} is a file, not a run directory")
    if not path.is_file():
        raise RunDirError(f"{root} is not a run directory (no manifest.json)")
    try:
        manifest = json.loads(path.read_text())
    except ValueError:
        raise RunDirError(f"{path}: not valid JSON") from None
    if not isinstance(manifest, dict):
        raise RunDirError(f"{path}: expected a JSON object")
    return manifest


@dataclass
class Run:
    """One run directory, read once: its manifest and events, and tables derived from them."""

    root: Path
    manifest: dict[str, Any]
    events: list[dict[str, Any]]

    @classmethod
    def load(cls, root: Path) -> Run:
        root = Path(root)
        manifest = read_manifest(root)
        return cls(root, manifest, RunStore(root).read_events())  # read only: never repairs the log

    # --- facts from the manifest and single events ---------------------------------------------

    @property
    def config(self) -> dict[str, Any]:
        """The manifest's configuration, with the budgets later sessions changed (`ksearch resume --rounds`)."""
        config = dict(self.manifest.get("config") or {})
        for ev in self.events:
            if ev.get("kind") == "resume":
                config.update(ev.get("budget") or {})
        return config

    @property
    def run_id(self) -> str:
        return str(self.manifest.get("run_id") or self.root.name)

    @property
    def method(self) -> str:
        return str(self.config.get("method") or WORLD_MODEL_METHOD)

    @property
    def keeps_world_model(self) -> bool:
        return self.method == WORLD_MODEL_METHOD

    @property
    def policy(self) -> str:
        """Who wrote the code: the model, or the offline policy."""
        model = self.config.get("model")
        return f"llm: {model}" if model else "offline-policy (tunable search, no LLM)"

    def _last(self, kind: str) -> dict[str, Any] | None:
        return next((ev for ev in reversed(self.events) if ev.get("kind") == kind), None)

    def _since_last_resume(self, kind: str) -> dict[str, Any] | None:
        """The last `kind` event of the current session (none if a `resume` came after it)."""
        for ev in reversed(self.events):
            if ev.get("kind") == "resume":
                return None
            if ev.get("kind") == kind:
                return ev
        return None

    @property
    def finished(self) -> str | None:
        """Why the run ended, or None while it runs (or after its session stopped early)."""
        end = self._since_last_resume("run_end")
        return None if end is None else str(end.get("reason") or "ended")

    @property
    def stopped(self) -> str | None:
        """Why the last session stopped before the run ended (an error, Ctrl-C); it can be resumed."""
        if self.finished is not None:
            return None
        ev = self._since_last_resume("stopped")
        return None if ev is None else str(ev.get("reason") or "stopped")

    @property
    def over(self) -> bool:
        """Nothing more will be written unless someone resumes the run."""
        return self.finished is not None or self.stopped is not None

    @property
    def resumes(self) -> int:
        return sum(ev.get("kind") == "resume" for ev in self.events)

    @property
    def rounds_used(self) -> int:
        return sum(ev.get("kind") == "candidate" for ev in self.events)

    @property
    def wall_s(self) -> float:
        frame = self.timeline
        return float(frame["elapsed_s"][-1]) if frame.height else 0.0

    @property
    def last_event_t(self) -> float | None:
        return float(self.events[-1]["t"]) if self.events else None

    @cached_property
    def baseline(self) -> EvalResult | None:
        """The run's first baseline measurement (every session measures it again on every evaluator)."""
        ev = next((e for e in self.events if e.get("kind") == "baseline" and e.get("result")), None)
        return self._result(ev) if ev else None

    @cached_property
    def seed(self) -> dict[str, Any] | None:
        """The seed event when the run started from a solution: solution_id, result, speedup."""
        ev = self._last("seed")
        return ev if ev and ev.get("solution_id") else None

    @cached_property
    def best(self) -> dict[str, Any] | None:
        """The best so far: of the `best` events (one per improvement on each GPU type, the seed
        first), the fastest; an equal one later does not replace it. Keys as written:
        solution_id, speedup, node, round, gpu."""
        best: dict[str, Any] | None = None
        for ev in self.events:
            if ev.get("kind") == "best" and ev.get("speedup") is not None and (best is None or ev["speedup"] > best["speedup"]):
                best = ev
        return best

    def _best_evaluation(self) -> dict[str, Any] | None:
        """The event that measured the best solution (its latest one, if it was measured twice)."""
        best = self.best
        if best is None:
            return None
        for ev in reversed(self.events):
            if ev.get("kind") in ("evaluation", "tune", "seed") and ev.get("solution_id") == best.get("solution_id") and ev.get("result"):
                return ev
        return None

    def best_result(self) -> EvalResult | None:
        ev = self._best_evaluation()
        return self._result(ev) if ev else None

    def best_baseline(self) -> EvalResult | None:
        """The baseline the best was compared with: measured on the same evaluator, in the same session."""
        ev = self._best_evaluation()
        if ev is None:
            return self.baseline
        for base in reversed(self.events[: self.events.index(ev)]):
            if base.get("kind") == "baseline" and base.get("result") and base.get("evaluator") == ev.get("evaluator"):
                return self._result(base)
        return self.baseline

    @cached_property
    def repeat_scores(self) -> pl.DataFrame:
        """Every passing score measured, per GPU type and solution: kernels measured more than once
        (the baseline each session, the seed's repeats, the final re-timing) give the noise."""
        rows: list[dict[str, Any]] = []

        def add(ev: dict[str, Any], solution_id: str | None, score: Any) -> None:
            if solution_id and isinstance(score, int | float):
                rows.append({"gpu": str(ev.get("gpu") or ""), "solution_id": solution_id, "score": float(score)})

        for ev in self.events:
            kind, result = ev.get("kind"), ev.get("result") or {}
            if kind in ("baseline", "seed", "evaluation", "tune") and result.get("status") == Status.PASSED.value:
                add(ev, ev.get("solution_id"), result.get("score"))
            elif kind == "seed_repeat" and ev.get("status") == Status.PASSED.value:
                add(ev, ev.get("solution_id"), ev.get("score"))
            elif kind == "confirm":
                for row in ev.get("repeats") or []:
                    for role, solution_id in (row.get("ids") or {}).items():
                        add(ev, solution_id, row.get(role))
        return pl.DataFrame(rows, schema={"gpu": pl.Utf8, "solution_id": pl.Utf8, "score": pl.Float64})

    def noise(self, gpu: str | None = None) -> float | None:
        """The largest relative spread (max - min over median) among kernels measured more than once
        on this GPU type (default: the best's): a smaller difference is not evidence of anything."""
        from ksearch_ray.search.measure import relative_spread

        gpu = (self.best or {}).get("gpu", "") if gpu is None else gpu
        scores = self.repeat_scores.filter(pl.col("gpu") == (gpu or ""))
        grouped = scores.group_by("solution_id").agg(pl.col("score"))
        spreads = [s for values in grouped["score"].to_list() if (s := relative_spread(values)) is not None]
        return max(spreads, default=None)

    @property
    def confirms(self) -> dict[str, dict[str, Any]]:
        """GPU type -> the last `confirm` event: the best re-timed against the baseline, interleaved."""
        return {str(ev.get("gpu") or ""): ev for ev in self.events if ev.get("kind") == "confirm"}

    def solution(self, solution_id: str) -> Solution | None:
        store = RunStore(self.root)
        if not store.has_solution(solution_id):
            return None
        try:
            return store.load_solution(solution_id)
        except (ValueError, ValidationError) as exc:
            raise RunDirError(f"{store.solutions_dir / solution_id}.json: not a readable solution ({_first_error(exc)})") from None

    @cached_property
    def hardware(self) -> str:
        for ev in self.events:
            if ev.get("result"):
                name = self._result(ev).device_name
                if name:
                    return name
        return str(self.config.get("device") or "")

    @cached_property
    def tree(self) -> Tree | None:
        """The world model, replayed from its logged calls; None for methods that keep none."""
        from ksearch_ray.worldmodel.state import WorldModelState

        store = RunStore(self.root)
        state: WorldModelState | None = None
        for ev in self.events:
            kind = ev.get("kind")
            if kind == "wm_init":
                state = WorldModelState(Tree.model_validate(ev["tree"]), store.has_solution)
            elif kind == "wm":
                if state is None:
                    raise RunDirError(f"{store.events_path}: world-model call at event {ev.get('seq')} before wm_init")
                state.call(ev["call"], ev["args"])
        return state.tree if state else None

    def _result(self, ev: dict[str, Any]) -> EvalResult:
        try:
            return EvalResult.model_validate(ev["result"])
        except ValidationError as exc:
            raise RunDirError(
                f"{self.root / 'events.jsonl'}: event {ev.get('seq')} ({ev.get('kind')}) has an unreadable result: {_first_error(exc)}"
            ) from None

    # --- tables ----------------------------------------------------------------------------------

    @cached_property
    def timeline(self) -> pl.DataFrame:
        """One row per event: seq, t, kind, elapsed_s (running time, gaps before a resume not
        counted, as the wall-clock budget counts it) and cost_usd (LLM spend so far)."""
        rows = [
            {"seq": int(ev["seq"]), "t": float(ev["t"]), "kind": str(ev.get("kind")),
             "cost": float((ev.get("call") or {}).get("cost_usd") or 0.0) if ev.get("kind") == "llm_call" else 0.0}
            for ev in self.events
        ]
        frame = pl.DataFrame(rows, schema={"seq": pl.Int64, "t": pl.Float64, "kind": pl.Utf8, "cost": pl.Float64})
        step = pl.when(pl.col("kind") == "resume").then(0.0).otherwise(pl.col("t").diff().fill_null(0.0))
        return frame.with_columns(
            elapsed_s=step.cum_sum(), cost_usd=pl.col("cost").cum_sum()
        ).drop("cost")

    @cached_property
    def evaluations(self) -> pl.DataFrame:
        """Every evaluation (baseline, seed, candidates) and every round that produced no code."""
        rows: list[dict[str, Any]] = []
        for ev in self.events:
            kind = ev.get("kind")
            origin = ORIGINS.get(str(kind))
            if origin is not None and ev.get("result"):
                result = self._result(ev)
                error = "" if result.passed else first_lines(f"{result.message}\n{result.log}")
                rows.append({
                    "seq": ev["seq"], "origin": origin, "round": ev.get("round"), "cycle": ev.get("cycle"),
                    "node": ev.get("node"), "gpu": ev.get("gpu"), "solution_id": ev.get("solution_id") or result.solution_id,
                    "status": result.status.value, "speedup": ev.get("speedup"), "score": result.score,
                    "seconds": result.seconds, "error": error,
                })
            elif kind == "seed_repeat":  # a repeat for the noise: only its status and score are kept
                rows.append({
                    "seq": ev["seq"], "origin": Origin.SEED_REPEAT, "round": None, "cycle": None, "node": None,
                    "gpu": ev.get("gpu"), "solution_id": ev.get("solution_id"), "status": ev.get("status") or "?",
                    "speedup": None, "score": ev.get("score"), "seconds": None, "error": "",
                })
            elif kind == "candidate" and not ev.get("solution_id"):
                rows.append({
                    "seq": ev["seq"], "origin": Origin.CANDIDATE, "round": ev.get("round"), "cycle": ev.get("cycle"),
                    "node": ev.get("node"), "gpu": None, "solution_id": None, "status": NO_CODE, "speedup": None,
                    "score": None, "seconds": None, "error": first_lines(ev.get("error") or "no code came back"),
                })
        schema = {
            "seq": pl.Int64, "origin": pl.Utf8, "round": pl.Int64, "cycle": pl.Utf8, "node": pl.Utf8, "gpu": pl.Utf8,
            "solution_id": pl.Utf8, "status": pl.Utf8, "speedup": pl.Float64, "score": pl.Float64,
            "seconds": pl.Float64, "error": pl.Utf8,
        }
        frame = pl.DataFrame(rows, schema=schema)
        return frame.join(self.timeline.select("seq", "elapsed_s"), on="seq", how="left")

    def status_counts(self) -> dict[str, int]:
        """Candidate outcomes per status (NO_CODE included), in the order of the Status enum."""
        frame = self.evaluations.filter(pl.col("origin") == Origin.CANDIDATE).group_by("status").len()
        counts = dict(zip(frame["status"].to_list(), frame["len"].to_list(), strict=True))
        order = [s.value for s in Status] + [NO_CODE]
        return {s: int(counts[s]) for s in order if s in counts}

    @cached_property
    def best_progress(self) -> pl.DataFrame:
        """Best-so-far speedup: one row per improvement of the run's best (the seed first, at round
        0), with the round, running time and LLM spend at which it was found."""
        rows: list[dict[str, Any]] = []
        seed = self.seed
        seed_is_logged_best = seed is not None and any(
            ev.get("kind") == "best" and ev.get("solution_id") == seed["solution_id"] for ev in self.events
        )
        if seed and seed.get("speedup") and (seed.get("result") or {}).get("status") == Status.PASSED.value and not seed_is_logged_best:
            rows.append({"seq": seed["seq"], "round": 0, "speedup": float(seed["speedup"]), "solution_id": seed["solution_id"],
                         "node": "root"})
        for ev in self.events:
            if ev.get("kind") == "best" and ev.get("speedup") is not None:
                rows.append({"seq": ev["seq"], "round": ev.get("round"), "speedup": float(ev["speedup"]),
                             "solution_id": ev.get("solution_id"), "node": ev.get("node")})
        frame = pl.DataFrame(rows, schema={"seq": pl.Int64, "round": pl.Int64, "speedup": pl.Float64,
                                           "solution_id": pl.Utf8, "node": pl.Utf8}).sort("seq")
        # Only what raised the run's best (a GPU type's own best can stay below another type's).
        frame = frame.filter(pl.col("speedup") > pl.col("speedup").cum_max().shift(1).fill_null(0.0))
        return frame.join(self.timeline.select("seq", "elapsed_s", "cost_usd"), on="seq", how="left").sort("seq")

    @cached_property
    def llm_calls(self) -> pl.DataFrame:
        rows = []
        for ev in self.events:
            if ev.get("kind") != "llm_call":
                continue
            call = ev.get("call") or {}
            rows.append({
                "seq": ev["seq"], "role": ev.get("role") or "?", "kind": call.get("kind") or "?", "model": call.get("model"),
                "prompt_tokens": int(call.get("prompt_tokens") or 0), "completion_tokens": int(call.get("completion_tokens") or 0),
                "cost_usd": float(call.get("cost_usd") or 0.0), "cost_known": bool(call.get("cost_known")),
                "cached": bool(call.get("cached")), "failed": call.get("error") is not None,
                "latency_s": float(call.get("latency_s") or 0.0), "error": call.get("error"),
            })
        return pl.DataFrame(rows, schema={
            "seq": pl.Int64, "role": pl.Utf8, "kind": pl.Utf8, "model": pl.Utf8, "prompt_tokens": pl.Int64,
            "completion_tokens": pl.Int64, "cost_usd": pl.Float64, "cost_known": pl.Boolean, "cached": pl.Boolean,
            "failed": pl.Boolean, "latency_s": pl.Float64, "error": pl.Utf8,
        })

    @property
    def llm_tokens(self) -> int:
        calls = self.llm_calls
        return int(calls["prompt_tokens"].sum() or 0) + int(calls["completion_tokens"].sum() or 0)

    @property
    def llm_cost_usd(self) -> float:
        return float(self.llm_calls["cost_usd"].sum() or 0.0)

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
        schema = {"workload": pl.Utf8, "baseline_ms": pl.Float64, "best_ms": pl.Float64, "speedup": pl.Float64}
        base, best = self.best_baseline(), self.best_result()
        if base is None or best is None:
            return pl.DataFrame([], schema=schema)

        def means(result: EvalResult) -> pl.DataFrame:
            return pl.DataFrame(
                [{"workload": w.workload, "ms": w.timing.mean_ms if w.timing else None} for w in result.workloads],
                schema={"workload": pl.Utf8, "ms": pl.Float64},
            )

        joined = means(base).rename({"ms": "baseline_ms"}).join(means(best).rename({"ms": "best_ms"}), on="workload", how="full",
                                                                 coalesce=True)
        return joined.with_columns(speedup=pl.col("baseline_ms") / pl.col("best_ms")).select(list(schema))

    def cycles_in_flight(self) -> list[tuple[str, str]]:
        """(cycle, node) of cycles started and not ended: what a live run is working on."""
        open_: dict[str, str] = {}
        for ev in self.events:
            if ev.get("kind") == "cycle_start":
                open_[str(ev.get("cycle"))] = str(ev.get("node"))
            elif ev.get("kind") == "cycle_end":
                open_.pop(str(ev.get("cycle")), None)
            elif ev.get("kind") == "run_end":
                open_.clear()
        return sorted(open_.items())


def _first_error(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        return f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}"
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
