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


@dataclass
class RunState:
    tree: Tree | None = None
    baseline: EvalResult | None = None
    seeded: bool = False
    rounds_used: int = 0
    evaluations: int = 0
    cycles: dict[str, CycleRecord] = field(default_factory=dict)
    best: dict[str, Any] | None = None
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
            state.baseline = EvalResult.model_validate(ev["result"])
        elif kind == "seed":
            state.seeded = True
        elif kind == "llm_call":
            call = ev["call"]
            state.llm_calls += 1
            state.llm_failed_calls += call.get("error") is not None
            state.llm_cost_usd += float(call.get("cost_usd") or 0.0)
            state.llm_tokens += int(call.get("prompt_tokens") or 0) + int(call.get("completion_tokens") or 0)
        elif kind == "cycle_start":
            state.cycles[ev["cycle"]] = CycleRecord(ev["cycle"], ev["node"])
        elif kind == "candidate":
            state.rounds_used += 1
            state.cycles[ev["cycle"]].attempts.append(
                Attempt(round=ev["round"], kind=ev["attempt_kind"], solution_id=ev.get("solution_id"), error=ev.get("error"))
            )
        elif kind == "evaluation":
            state.evaluations += 1
            cycle = state.cycles.get(ev.get("cycle", ""))
            if cycle is not None:
                attempt = next(a for a in cycle.attempts if a.round == ev["round"])
                attempt.result = EvalResult.model_validate(ev["result"])
                attempt.speedup = ev.get("speedup")
        elif kind == "cycle_step":
            state.cycles[ev["cycle"]].steps.add(ev["step"])
        elif kind == "cycle_end":
            state.cycles[ev["cycle"]].ended = True
        elif kind == "best":
            state.best = {k: ev[k] for k in ("solution_id", "speedup", "node", "round")}
        elif kind == "run_end":
            state.finished = ev["reason"]
        elif kind == "resume":
            state.resumes += 1
    state.tree = wm.tree if wm else None
    state.wall_s = _active_wall_s(events)
    return state


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
