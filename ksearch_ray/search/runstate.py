"""Folding a run's events back into its state: what `ksearch resume` and `ksearch show` start from.

The world model is rebuilt by replaying every logged world-model call through the same pure
functions the actor used; counters are counted from the events themselves, so a run resumed
after SIGKILL counts nothing twice and loses nothing that reached the log.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ksearch_ray.models import EvalResult
from ksearch_ray.search.measure import relative_spread
from ksearch_ray.search.policy import Attempt
from ksearch_ray.worldmodel.state import WorldModelState
from ksearch_ray.worldmodel.tree import Tree


@dataclass
class CycleRecord:
    cycle_id: str
    node_id: str
    attempts: list[Attempt] = field(default_factory=list)
    steps: set[str] = field(default_factory=set)  # end-of-cycle steps already done
    ended: bool = False
    stop_reason: str | None = None  # why its attempts stopped: stagnation, cannot beat the parent, budget


@dataclass
class RunState:
    tree: Tree | None = None
    baseline: EvalResult | None = None  # the first baseline measurement (of evaluator 0)
    repeat_scores: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    """GPU name -> solution id -> every score measured for it: repeated measurements give the noise."""
    seeded: bool = False
    seed: dict[str, Any] | None = None  # {"solution_id", "speedup"} of the seed, once evaluated
    rounds_used: int = 0
    evaluations: int = 0
    tune_evaluations: int = 0  # variants measured by the tuner (search/tuner.py), beside `evaluations`
    cycles: dict[str, CycleRecord] = field(default_factory=dict)
    attempts: dict[int, Attempt] = field(default_factory=dict)
    """Attempts made outside K-Search cycles (the evolve and refine methods), by round."""
    best: dict[str, Any] | None = None  # the best over all GPU types (each against its own baseline)
    best_by_gpu: dict[str, dict[str, Any]] = field(default_factory=dict)
    confirms: dict[str, dict[str, Any]] = field(default_factory=dict)  # GPU name -> its last `confirm` event
    budget: dict[str, Any] = field(default_factory=dict)  # budget settings changed by `ksearch resume`
    stopped: str | None = None  # why the last session stopped early (an error, or an interrupt)
    results: dict[str, EvalResult] = field(default_factory=dict)  # solution id -> its latest evaluation
    llm_calls: int = 0
    llm_failed_calls: int = 0
    llm_cost_usd: float = 0.0
    llm_tokens: int = 0
    finished: str | None = None
    resumes: int = 0
    wall_s: float = 0.0  # wall time spent running, summed over the sessions of this run

    @property
    def open_cycles(self) -> list[CycleRecord]:
        return [c for c in self.cycles.values() if not c.ended]

    def note_score(self, gpu: str, solution_id: str, score: float | None) -> None:
        if score is not None:
            self.repeat_scores.setdefault(gpu, {}).setdefault(solution_id, []).append(score)

    def noise(self, gpu: str) -> float | None:
        """The largest relative spread among kernels measured more than once on this GPU type:
        a speedup difference smaller than this is not evidence of anything."""
        spreads = [s for scores in self.repeat_scores.get(gpu, {}).values() if (s := relative_spread(scores)) is not None]
        return max(spreads, default=None)

    def note_llm_call(self, call: dict[str, Any]) -> None:
        """Spend is counted from the logged calls, the one source of the budget."""
        self.llm_calls += 1
        self.llm_failed_calls += call.get("error") is not None
        self.llm_cost_usd += float(call.get("cost_usd") or 0.0)
        self.llm_tokens += int(call.get("prompt_tokens") or 0) + int(call.get("completion_tokens") or 0)

    def note_best(self, best: dict[str, Any]) -> None:
        self.best_by_gpu[best.get("gpu", "")] = best
        if self.best is None or best["speedup"] > self.best["speedup"]:
            self.best = best


def fold(events: list[dict[str, Any]], solution_exists: Callable[[str], bool]) -> RunState:
    state = RunState()
    wm: WorldModelState | None = None
    for ev in events:
        kind = ev["kind"]
        if kind == "wm_init":
            wm = WorldModelState(Tree.model_validate(ev["tree"]), solution_exists)
        elif kind == "wm":
            assert wm is not None, "world-model call before wm_init"
            wm.call(ev["call"], ev["args"])
        elif kind == "baseline":
            result = EvalResult.model_validate(ev["result"])
            state.baseline = state.baseline or result
            state.note_score(ev.get("gpu", ""), ev["solution_id"], result.score)
        elif kind == "seed":
            state.seeded = True
            if ev.get("solution_id"):
                state.seed = {"solution_id": ev["solution_id"], "speedup": ev.get("speedup")}
                state.note_score(ev.get("gpu", ""), ev["solution_id"], ev["result"].get("score"))
                state.results[ev["solution_id"]] = EvalResult.model_validate(ev["result"])
        elif kind == "seed_repeat":
            state.note_score(ev.get("gpu", ""), ev["solution_id"], ev.get("score"))
        elif kind == "llm_call":
            state.note_llm_call(ev["call"])
        elif kind == "cycle_start":
            state.cycles[ev["cycle"]] = CycleRecord(ev["cycle"], ev["node"])
        elif kind == "candidate":
            state.rounds_used += 1
            attempt = Attempt(round=ev["round"], kind=ev["attempt_kind"], solution_id=ev.get("solution_id"), error=ev.get("error"))
            if ev.get("cycle") in state.cycles:
                state.cycles[ev["cycle"]].attempts.append(attempt)
            else:  # a method without cycles (evolve, refine): its own events say what the attempt belongs to
                state.attempts[ev["round"]] = attempt
        elif kind == "evaluation":
            state.evaluations += 1
            result = EvalResult.model_validate(ev["result"])
            state.results[ev["solution_id"]] = result
            if result.passed:
                state.note_score(ev.get("gpu", ""), ev["solution_id"], result.score)
            evaluated = _attempt_of(state, ev)
            if evaluated is not None:
                evaluated.result = result
                evaluated.speedup = ev.get("speedup")
                evaluated.evaluator = ev.get("evaluator")
        elif kind == "tune":  # a variant the tuner measured (search/tuner.py): not a round, not a candidate
            state.tune_evaluations += 1
            result = EvalResult.model_validate(ev["result"])
            state.results[ev["solution_id"]] = result
            if result.passed:
                state.note_score(ev.get("gpu", ""), ev["solution_id"], result.score)
        elif kind == "tuned" and ev["solution_id"] != ev["original"]:
            tuned = _attempt_of(state, ev)
            if tuned is not None:
                tuned.solution_id, tuned.result = ev["solution_id"], state.results[ev["solution_id"]]
                tuned.speedup, tuned.evaluator = ev.get("speedup"), ev.get("evaluator")
        elif kind == "cycle_stop":
            state.cycles[ev["cycle"]].stop_reason = ev["reason"]
        elif kind == "cycle_step":
            state.cycles[ev["cycle"]].steps.add(ev["step"])
        elif kind == "cycle_end":
            state.cycles[ev["cycle"]].ended = True
        elif kind == "best":
            state.note_best({k: ev[k] for k in ("solution_id", "speedup", "node", "round", "gpu") if k in ev})
        elif kind == "confirm":
            state.confirms[ev.get("gpu", "")] = ev
            for row in ev.get("repeats", []):
                for role, solution_id in row.get("ids", {}).items():
                    state.note_score(ev.get("gpu", ""), solution_id, row.get(role))
        elif kind == "run_end":
            state.finished = ev["reason"]
        elif kind == "stopped":
            state.stopped = ev["reason"]
        elif kind == "resume":
            state.resumes += 1
            state.stopped = None
            state.budget.update(ev.get("budget") or {})
    state.tree = wm.tree if wm else None
    state.wall_s = _active_wall_s(events)
    return state


def _attempt_of(state: RunState, ev: dict[str, Any]) -> Attempt | None:
    """The attempt an event speaks of: by round, in its cycle, or among the cycle-less attempts."""
    cycle = state.cycles.get(ev.get("cycle") or "")
    if cycle is not None:
        return next(a for a in cycle.attempts if a.round == ev["round"])
    return state.attempts.get(ev["round"])


def _active_wall_s(events: list[dict[str, Any]]) -> float:
    """Wall time spent running, summed over sessions (a gap before a `resume` is not counted)."""
    total, start, last = 0.0, None, None
    for ev in events:
        if ev["kind"] == "resume" and start is not None and last is not None:
            total += last - start
            start = None
        if start is None:
            start = ev["t"]
        last = ev["t"]
    if start is not None and last is not None:
        total += last - start
    return total
