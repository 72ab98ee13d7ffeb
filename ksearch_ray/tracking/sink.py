"""What a run tells a tracker, from its events and its read model, and what a failing tracker costs.

`TrackingSink` is an observer of `Search.record`: it hears each event after the read model
(`events.RunView`) applied it and turns it into a tracker's vocabulary (`Tracker`): per-round metrics
(best-so-far speedup, active time, dollars, tokens, each evaluation's status), and at each session's
end the evaluations table, the LLM ledger by role and the best kernel's sources. Replayed events
are not sent again: a resumed session reopens the tracked run it started, whose id is kept in
`tracking.json` in the run directory, and goes on from there.

A tracker is someone else's library writing to someone else's store: whatever it raises is caught
here, at its one boundary, said in one warning line (and written to `tracking.json`), and the
tracker is left out for the rest of the session. The search never stops for it.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from ksearch_ray.config import RunConfig, flat_settings
from ksearch_ray.events import (
    Best,
    Candidate,
    Evaluation,
    Event,
    LlmCallEvent,
    Resume,
    RunEnd,
    RunView,
    Stopped,
    Tune,
)
from ksearch_ray.store import RunStore
from ksearch_ray.text import clip

log = logging.getLogger(__name__)

STATE_FILE = "tracking.json"
"""In the run directory: each tracker's run id (and where it lives), so `ksearch resume` reopens it."""

EVALUATION_COLUMNS = ["round", "origin", "session", "solution_id", "status", "speedup", "seconds", "active_s",
                      "cost_usd", "error"]


class Tracker(Protocol):
    """One tracking library, seen through what a run has to say."""

    name: str

    def state(self) -> dict[str, Any]:
        """What reopens this tracked run later (its id, where it is)."""
        ...

    def params(self, values: dict[str, Any], *, first: bool) -> None:
        """The run's configuration (on resume, `first` is false: only the budget can have changed)."""
        ...

    def log(self, metrics: dict[str, float], *, round_: int, seq: int, text: dict[str, str]) -> None:
        """Figures at a round (MLflow's step), in log order (`seq`: W&B's step, monotonic over sessions)."""
        ...

    def session_end(self, *, seq: int, summary: dict[str, Any], evaluations: list[list[Any]],
                    ledger: dict[str, dict[str, float]], best: dict[str, str] | None) -> None:
        """The evaluations table, the LLM ledger, the best kernel's sources (file name -> text)."""
        ...

    def finish(self, *, ok: bool) -> None: ...


class TrackerFactory(Protocol):
    def __call__(self, config: RunConfig, root: Path, previous: dict[str, Any] | None) -> Tracker: ...


def read_state(root: Path) -> dict[str, Any]:
    path = root / STATE_FILE
    if not path.is_file():
        return {}
    try:
        state = json.loads(path.read_text())
    except ValueError:
        return {}
    return state if isinstance(state, dict) else {}


def _write_state(root: Path, state: dict[str, Any]) -> None:
    path = root / STATE_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(state, indent=2))
    os.replace(tmp, path)


def ledger(view: RunView) -> dict[str, dict[str, float]]:
    """The LLM calls by role: how many, failed, from the cache, tokens, dollars."""
    return {role: dict(row) for role, row in view.llm_ledger.items()}


def evaluation_rows(view: RunView) -> list[list[Any]]:
    return [[r.round, r.origin, r.session, r.solution_id, r.status, r.speedup, r.seconds, round(r.active_s, 3),
             r.cost_usd, clip(r.error.replace("\n", " "), 200)]
            for r in view.rows if r.origin in ("candidate", "tune")]


class TrackingSink:
    """Feeds one tracker from the run's events; on its first failure, says so once and stops feeding it."""

    def __init__(self, tracker: Tracker | None, store: RunStore, say: Callable[[str], None], name: str):
        self.tracker = tracker
        self.store = store
        self.say = say
        self.name = name
        self.failed: str | None = None

    @classmethod
    def open(cls, name: str, factory: TrackerFactory, config: RunConfig, store: RunStore,
             say: Callable[[str], None]) -> TrackingSink:
        state = read_state(store.root)
        previous = state.get(name)
        sink = cls(None, store, say, name)
        try:
            tracker = factory(config, store.root, previous if isinstance(previous, dict) else None)
            tracker.params(flat_settings(config.model_dump(mode="json")), first=not previous)
        except Exception as exc:  # noqa: BLE001  (the tracker's library is the boundary: anything it raises)
            sink._fail("could not start", exc)
            return sink
        sink.tracker = tracker
        state[name] = tracker.state()
        state.pop(f"{name}_failed", None)
        _write_state(store.root, state)
        say(f"tracking in {name}: {sink.where()}")
        return sink

    def where(self) -> str:
        state = self.tracker.state() if self.tracker else {}
        return ", ".join(f"{k} {v}" for k, v in state.items() if k in ("run_id", "id", "tracking_uri", "dir"))

    def __call__(self, event: Event, view: RunView) -> None:
        if self.tracker is None:
            return
        try:
            self._send(self.tracker, event, view)
        except Exception as exc:  # noqa: BLE001  (the tracker's library is the boundary: anything it raises)
            self._fail(f"failed at event {event.seq} ({event.kind})", exc)

    def close(self, *, ok: bool) -> None:
        if self.tracker is None:
            return
        try:
            self.tracker.finish(ok=ok)
        except Exception as exc:  # noqa: BLE001  (the tracker's library is the boundary: anything it raises)
            self._fail("failed to finish", exc)
        self.tracker = None

    def _fail(self, what: str, exc: BaseException) -> None:
        reason = clip(f"{type(exc).__name__}: {exc}".splitlines()[0] if str(exc) else type(exc).__name__, 300)
        self.failed = f"{what}: {reason}"
        log.warning("tracking in %s %s", self.name, self.failed, exc_info=exc)
        self.say(f"WARNING: tracking in {self.name} {self.failed}; the search goes on untracked there "
                 f"(events.jsonl has everything; details in driver.log)")
        self.tracker = None
        try:
            state = read_state(self.store.root)
            state[f"{self.name}_failed"] = self.failed
            _write_state(self.store.root, state)
        except OSError as write_error:  # a full disk fails this too: the warning line above has said it
            log.warning("could not note the tracker's failure in %s: %s", STATE_FILE, write_error)

    def _send(self, tracker: Tracker, event: Event, view: RunView) -> None:
        best = view.best.speedup if view.best is not None else None
        figures: dict[str, float] = {"active_s": view.active_s, "cost_usd": view.llm_cost_usd,
                                     "llm_tokens": float(view.llm_tokens), "rounds": float(view.rounds_used)}
        if best is not None:
            figures["best_speedup"] = best
        if isinstance(event, Evaluation | Tune):
            row = view.rows[-1]
            figures |= {"eval/passed": float(event.result.passed)}
            if row.speedup is not None:
                figures["eval/speedup"] = row.speedup
            for which in ("kernel", "call"):  # both figures, whichever the objective (eval/objective)
                ms = event.result.figure_ms(which)
                if ms is not None:
                    figures[f"eval/{which}_ms"] = ms
            tracker.log(figures, round_=event.round, seq=event.seq,
                        text={"eval/status": event.result.status.value, "eval/origin": row.origin,
                              "eval/solution_id": event.solution_id, "eval/objective": event.result.objective})
        elif isinstance(event, Candidate) and event.solution_id is None:
            tracker.log(figures | {"eval/passed": 0.0}, round_=event.round, seq=event.seq,
                        text={"eval/status": view.rows[-1].status, "eval/origin": "candidate"})
        elif isinstance(event, Best):
            tracker.log(figures, round_=event.round, seq=event.seq, text={"best/solution_id": event.solution_id})
        elif isinstance(event, LlmCallEvent):
            tracker.log(figures | {"llm_calls": float(view.llm_call_count)}, round_=view.rounds_used, seq=event.seq,
                        text={})
        elif isinstance(event, Resume):
            tracker.log(figures | {"session": float(view.session)}, round_=view.rounds_used, seq=event.seq, text={})
        elif isinstance(event, RunEnd | Stopped):
            self._session_end(tracker, event, view)

    def _session_end(self, tracker: Tracker, event: RunEnd | Stopped, view: RunView) -> None:
        best_files: dict[str, str] | None = None
        if view.best is not None and self.store.has_solution(view.best.solution_id):
            solution = self.store.load_solution(view.best.solution_id)
            best_files = {**solution.sources, "solution.json": solution.model_dump_json(indent=1)}
        summary: dict[str, Any] = {
            "outcome": event.reason, "finished": isinstance(event, RunEnd), "rounds": view.rounds_used,
            "sessions": view.session + 1, "active_s": view.active_s, "cost_usd": view.llm_cost_usd,
            "llm_tokens": view.llm_tokens, "evaluations": view.evaluations,
            "best_speedup": view.best.speedup if view.best else None,
            "best_solution_id": view.best.solution_id if view.best else None,
            "status_counts": view.status_counts(),
        }
        tracker.session_end(seq=event.seq, summary=summary, evaluations=evaluation_rows(view), ledger=ledger(view),
                            best=best_files)
