"""A run's story: the typed events of its log, and the one reducer that reads them.

Every line of `events.jsonl` is one of the models below (a union keyed on `kind`). The driver writes
them through `Search.record`, which appends the event and applies it to the run's `RunView` with
`RunView.apply`; `ksearch resume`, `show`, `show --follow`, `report`, the experiment tables and the
evolve method's database all build the same `RunView` by applying the same events in order. So a
live run and any reader of its directory can never disagree on the rounds spent, the evaluations,
the best, the outcome or the running time.

Definitions that every reader shares, here and nowhere else:

* **rounds** are `candidate` events (a code generation that returned code or a reason why not);
* **the best** is the last `best` event of each GPU type; a `best` is written only for a kernel that
  was measured beside this session's baseline and, for a candidate, confirmed by an independent
  re-timing and faster than the best so far by more than the measured noise; the run's best is the
  fastest of its GPU types' bests;
* **finished** is the reason of a `run_end` with no `resume` after it; **stopped** is the reason of a
  `stopped` with no `resume` after it;
* **active time** is the wall time of the log with the gaps before each `resume` left out.
"""

from __future__ import annotations

import gc
import json
import math
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    TypeAdapter,
    ValidationError,
    model_serializer,
    model_validator,
)

from ksearch_ray.evaluation.profiling import ProfileResult
from ksearch_ray.measure import Noise, Spread, noise_of, resolution_of, score_error
from ksearch_ray.models import EvalResult, Status
from ksearch_ray.policies.contract import Attempt, CodeKind
from ksearch_ray.policies.llm_call import LLMCall, error_class
from ksearch_ray.text import clip
from ksearch_ray.worldmodel.api import ApplyOps, WmCommand
from ksearch_ray.worldmodel.state import WorldModelState
from ksearch_ray.worldmodel.tree import Tree

SCHEMA = 2
"""Version of the event schema, written into every run's manifest. Schema 1 (untyped events) is not read."""


class EventError(ValueError):
    """An event log that does not follow the schema; the message is one line."""


class _Event(BaseModel):
    model_config = ConfigDict(extra="forbid")

    seq: int = Field(default=0, description="Position in the log, from 1; set when appended.")
    t: float = Field(default=0.0, description="Unix time it was appended.")


class _Where(_Event):
    """Which attempt an event speaks of: a round, in a K-Search cycle or in a lane of evolve/refine."""

    round: int
    cycle: str | None = None
    node: str | None = None
    method: str | None = None
    lane: str | None = None


# --- the world model --------------------------------------------------------------------------------


class WmInit(_Event):
    kind: Literal["wm_init"] = "wm_init"
    tree: Tree


class WmCall(_Event):
    """One change of the world model: a typed command (the clock included).

    On disk it keeps schema 2's shape, the command's name beside the other fields and its arguments
    under `args` (`{"kind": "wm", "call": "renew", "args": {"ids": ["n3"], ...}}`), so a run written
    before the commands were typed reads the same.
    """

    kind: Literal["wm"] = "wm"
    command: WmCommand
    cycle: str | None = None
    plan_kind: str | None = Field(default=None, description="The planner call whose ops these are.")
    focus: str | None = None
    source: tuple[str, int] | None = Field(default=None, description="(request hash, sample) of the cached reply.")
    version: int | None = Field(default=None, description="Tree version the planner's batch was written against.")
    notes: list[str] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _from_disk(cls, data: Any) -> Any:
        if isinstance(data, dict) and "call" in data:
            data = dict(data)
            data["command"] = {"call": data.pop("call"), **data.pop("args", {})}
        return data

    @model_serializer(mode="wrap")
    def _to_disk(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        del data["command"]
        # The arguments the command was given, as schema 2 wrote them: kind, call, args, then the rest.
        args = self.command.model_dump(mode="json", exclude_unset=True, exclude={"call"})
        out: dict[str, Any] = {}
        for name, value in data.items():
            out[name] = value
            if name == "kind":
                out["call"], out["args"] = self.command.call, args
        return out


# --- sessions ----------------------------------------------------------------------------------------


class Resume(_Event):
    kind: Literal["resume"] = "resume"
    open_cycles: list[str] = Field(default_factory=list)
    budget: dict[str, Any] = Field(default_factory=dict, description="Budget settings this session changes.")


class IsolationWarning(_Event):
    kind: Literal["isolation_warning"] = "isolation_warning"
    evaluator: int
    warning: str


class Baseline(_Event):
    """The task's baseline, measured on one evaluator this session."""

    kind: Literal["baseline"] = "baseline"
    solution_id: str
    evaluator: int
    gpu: str
    result: EvalResult


class Seed(_Event):
    """The solution the run starts from, measured beside the baseline (or none: from the specification)."""

    kind: Literal["seed"] = "seed"
    solution_id: str | None = None
    result: EvalResult | None = None
    speedup: float | None = None
    evaluator: int | None = None
    gpu: str | None = None
    start: Literal["seed", "spec"] = "seed"


class SeedFailed(_Event):
    kind: Literal["seed_failed"] = "seed_failed"
    solution_id: str
    result: EvalResult


class Remeasure(_Event):
    """A known kernel measured again beside this session's baseline: the seed's repeats for the
    noise; in every later session, the best so far, so that this session's candidates are
    compared with numbers measured side by side; and the baseline itself, now and then through the
    session, for the noise only (the session's baseline, that speedups are against, stays the one
    measured at its start); and (`full`) a candidate whose screened figure (`evaluation.screen`) would
    make it a new best, measured again by the full timing rule: its speedup is the one that counts."""

    kind: Literal["remeasure"] = "remeasure"
    role: Literal["seed", "best", "baseline", "full"]
    solution_id: str
    evaluator: int
    gpu: str
    result: EvalResult
    speedup: float | None = None


class Stopped(_Event):
    kind: Literal["stopped"] = "stopped"
    reason: str


class RunEnd(_Event):
    kind: Literal["run_end"] = "run_end"
    reason: str
    rounds: int
    best: dict[str, Any] | None = None
    session_wall_s: float = 0.0
    wm_s: float = 0.0
    evaluator_busy_s: dict[str, float] = Field(default_factory=dict)


# --- LLM calls and plans -------------------------------------------------------------------------------


class LlmCallEvent(_Event):
    kind: Literal["llm_call"] = "llm_call"
    role: str
    cycle: str | None = None
    call: LLMCall


class PlanFailed(_Event):
    kind: Literal["plan_failed"] = "plan_failed"
    plan_kind: str
    cycle: str | None = None
    error: str
    notes: list[str] = Field(default_factory=list)


class PlanEmpty(_Event):
    kind: Literal["plan_empty"] = "plan_empty"
    plan_kind: str
    cycle: str | None = None
    notes: list[str] = Field(default_factory=list)


class Outage(_Event):
    """The LLM provider failing for reasons that pass (5xx, 429, timeouts, a cut connection): the calls
    wait and are retried, spending no round, until it answers again or the outage allowance is spent."""

    kind: Literal["outage"] = "outage"
    state: Literal["began", "ended", "gave_up"]
    error: str = Field(default="", description="The failure that began it, or the last one.")
    failed_calls: int = Field(default=0, description="Calls that failed during the outage (ended, gave_up).")
    waited_s: float = Field(default=0.0, description="How long it lasted (ended, gave_up).")


class NoStream(_Event):
    """The endpoint answered a streaming request without a usable stream (a plain JSON body, no content delta, a
    stream that ended or broke before its finish) and the same request, unstreamed, was answered: the run streams
    to it no more, a resumed run included (`llm.stream` off)."""

    kind: Literal["no_stream"] = "no_stream"
    reason: str = Field(description="What the first streamed reply without an answer looked like.")


class PolicyFault(_Event):
    """A planner or coder that broke its contract: it raised, or replied with something that is not its
    reply type. Not a round (the call is asked again); a bug report is written to `report`."""

    kind: Literal["policy_fault"] = "policy_fault"
    role: str
    call_kind: str
    cycle: str | None = None
    error: str = Field(description="One line: the exception's type and message, or what was wrong with the reply.")
    report: str = Field(default="", description="The bug report's path, relative to the run directory.")
    in_a_row: int = Field(default=1, description="Faults of this role in a row, this one included.")


# --- cycles, candidates, evaluations ------------------------------------------------------------------


class CycleStart(_Event):
    kind: Literal["cycle_start"] = "cycle_start"
    cycle: str
    node: str


class CycleStop(_Event):
    """Why a cycle's attempts stopped: stagnation, cannot beat the parent, budget."""

    kind: Literal["cycle_stop"] = "cycle_stop"
    cycle: str
    reason: str


class CycleStep(_Event):
    """An end-of-cycle step done (recorded, attached, marked, released, planned): never repeated."""

    kind: Literal["cycle_step"] = "cycle_step"
    cycle: str
    step: str


class CycleEnd(_Event):
    kind: Literal["cycle_end"] = "cycle_end"
    cycle: str
    node: str
    passed: bool
    attempts: int
    budget_cut: bool = False
    abandoned: str | None = None


class Candidate(_Where):
    """One round: the coder's answer, with code (a solution id) or the reason it has none."""

    kind: Literal["candidate"] = "candidate"
    attempt_kind: CodeKind
    solution_id: str | None = None
    error: str | None = None
    reply_start: str = Field(default="", description="The start of a reply that held no code, as the model wrote it.")
    island: int | None = None
    parent: str | None = None
    inspirations: list[str] = Field(default_factory=list)


class Evaluation(_Where):
    kind: Literal["evaluation"] = "evaluation"
    evaluator: int
    gpu: str | None = None
    solution_id: str
    result: EvalResult
    speedup: float | None = None


class Tune(_Where):
    """A variant the tuner measured: an evaluation, not a round."""

    kind: Literal["tune"] = "tune"
    original: str
    solution_id: str
    values: dict[str, Any]
    evaluator: int
    gpu: str | None = None
    result: EvalResult
    speedup: float | None = None
    idle: bool = False
    """Measured by an evaluator that would otherwise have idled (`search.tune_when_idle`), after the method saw the
    candidate: it changes no attempt; a variant beyond the noise may become a best."""


class Tuned(_Where):
    """Which solution an attempt keeps after tuning (its own, when nothing was faster)."""

    kind: Literal["tuned"] = "tuned"
    original: str
    solution_id: str
    values: dict[str, Any]
    variants: int
    speedup_before: float | None = None
    speedup: float | None = None
    evaluator: int


class Retime(_Event):
    kind: Literal["retime"] = "retime"
    solution_id: str
    evaluator: int
    agreed: bool
    status: Status
    message: str = ""
    workloads: list[dict[str, Any]] = Field(default_factory=list)
    seconds: float | None = Field(default=None, description="The re-timing's wall time on its evaluator, its wait "
                                  "for the device not included; None in records before 2026-12-06.")


class Best(_Event):
    kind: Literal["best"] = "best"
    solution_id: str
    speedup: float
    node: str
    round: int
    gpu: str
    why: str = Field(default="new best", description="new best, the seed, re-measured this session, or back to the seed.")


class ProfilerNote(_Event):
    """Profiling was asked for (--profile-bests): which profiler the evaluators have, or why none can profile."""

    kind: Literal["profiler"] = "profiler"
    tool: str | None = None
    evaluators: list[int] = Field(default_factory=list, description="The evaluators that can profile.")
    problem: str | None = Field(default=None, description="Why no evaluator can profile.")


class Profile(_Event):
    """A best profiled once, outside its timed measurement: evidence for the planner and the report, never a score."""

    kind: Literal["profile"] = "profile"
    solution_id: str
    evaluator: int
    gpu: str
    result: ProfileResult


class EvaluatorLost(_Event):
    kind: Literal["evaluator_lost"] = "evaluator_lost"
    evaluator: int
    solution_id: str


class EvolveMigrate(_Event):
    kind: Literal["evolve_migrate"] = "evolve_migrate"
    moves: list[dict[str, Any]]


class ConfirmRow(BaseModel):
    """One interleaved repeat of the final re-timing: scores and speedups of each kernel."""

    model_config = ConfigDict(extra="forbid")

    ids: dict[str, str] = Field(description="role (baseline, best, seed) -> solution id.")
    scores: dict[str, float | None] = Field(default_factory=dict)
    speedups: dict[str, float | None] = Field(default_factory=dict, description="role -> speedup over this repeat's baseline.")


class Confirm(_Event):
    kind: Literal["confirm"] = "confirm"
    gpu: str
    evaluator: int
    solution_id: str
    repeats: list[ConfirmRow]
    verdict: str
    best_speedup: Spread | None = None
    over_seed: Spread | None = None
    beats_seed: bool | None = Field(default=None, description="The best was faster than the seed in every repeat.")
    cut_short: str | None = Field(default=None, description="Why it stopped before its repeats: decisive, or the budget.")


Event = Annotated[
    WmInit | WmCall | Resume | IsolationWarning | Baseline | Seed | SeedFailed | Remeasure | Stopped | RunEnd
    | LlmCallEvent | PlanFailed | PlanEmpty | Outage | NoStream | PolicyFault | CycleStart | CycleStop | CycleStep | CycleEnd | Candidate | Evaluation
    | Tune | Tuned | Retime | Best | EvaluatorLost | EvolveMigrate | Confirm | ProfilerNote | Profile,
    Field(discriminator="kind"),
]
_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)


def parse_event(line: str | bytes | dict[str, Any]) -> Event:
    """One event from a log line (or its JSON object); EventError with one line if it is not one."""
    try:
        return _ADAPTER.validate_json(line) if isinstance(line, str | bytes) else _ADAPTER.validate_python(line)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise EventError(f"{where}: {first['msg']}") from None


@contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic collector off while a whole log is parsed or reduced, on again after: a long log makes tens of
    thousands of objects that all live on, and every collection on the way walks them all again."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def dump_event(event: Event) -> str:
    return json.dumps(event.model_dump(mode="json", exclude_defaults=False), default=str)


# ------------------------------------------------------------------------------------- the read model


@dataclass(slots=True)
class CycleRecord:
    cycle_id: str
    node_id: str
    attempts: list[Attempt] = field(default_factory=list)
    by_round: dict[int, Attempt] = field(default_factory=dict, repr=False)  # the first attempt of each round
    steps: set[str] = field(default_factory=set)
    ended: bool = False
    stop_reason: str | None = None
    solution_ids: list[str] = field(default_factory=list, repr=False)
    """Every solution its rounds and its tuner produced (a live view forgets the unreferenced ones at its end)."""


@dataclass(slots=True)
class EvalRow:
    """One evaluation of the run (baseline, seed, candidates, tuner variants) or a round without code."""

    seq: int
    origin: str  # baseline, seed, seed repeat, best re-measured, candidate, tune
    round: int | None
    cycle: str | None
    node: str | None
    lane: str | None
    gpu: str | None
    evaluator: int | None
    solution_id: str | None
    attempt_kind: str | None
    status: str  # a Status value, or NO_CODE
    speedup: float | None
    score: float | None
    seconds: float | None
    error: str
    active_s: float
    cost_usd: float
    llm_tokens: int
    session: int


LEDGER_FIELDS = ["calls", "failed", "cached", "prompt_tokens", "completion_tokens", "cost_usd"]
"""What the LLM ledger counts per role."""

VERDICT_CHARS = 200
"""How much of a forgotten result's message a live view keeps."""

NO_CODE = "NO_CODE"
"""The status of a round whose generation returned no code (nothing was evaluated)."""

ERROR_LINES = 4


def first_lines(text: str | None, n: int = ERROR_LINES) -> str:
    lines = [line.rstrip() for line in (text or "").strip().splitlines() if line.strip()]
    return "\n".join(lines[:n] + (["..."] if len(lines) > n else []))


@dataclass(slots=True)
class TimelineRow:
    seq: int
    t: float
    kind: str
    active_s: float
    cost_usd: float


@dataclass(slots=True)
class BestRow:
    """One improvement of the run's best (over every GPU type), as it happened."""

    seq: int
    round: int
    speedup: float
    solution_id: str
    node: str
    gpu: str
    why: str
    active_s: float
    cost_usd: float


@dataclass
class RunView:
    """Everything a run's events say, folded in order; `apply` is the only way it changes."""

    solution_exists: Callable[[str], bool] = lambda _solution_id: True
    live: bool = False
    """True in a live search: what only a reader needs stays in events.jsonl, so the driver's memory grows with
    the open work and the tree, not with the rounds. A live view keeps no event, no timeline row and no result
    by sequence number; when a K-Search cycle ends it forgets the cycle's attempts and candidates, and the
    results of its solutions that nothing refers to any more (not its node's, a best's or the seed's), keeping
    of each a verdict (`verdict`). Readers (reports, analysis, `show`) keep everything."""
    events: list[Event] = field(default_factory=list)
    wm: WorldModelState | None = None
    session: int = 0
    """The current session: 0 for the first, one more for each `resume`."""
    baseline: EvalResult | None = None
    """The run's first baseline measurement."""
    session_baselines: dict[int, EvalResult] = field(default_factory=dict)
    """Evaluator -> its baseline measured in the current session (the median measurement; of two, the faster)."""
    _session_baseline_runs: dict[int, list[EvalResult]] = field(default_factory=dict)
    gpu_of: dict[int, str] = field(default_factory=dict)
    seed: Seed | None = None
    start: Literal["seed", "spec"] | None = None
    rounds_used: int = 0
    round_numbers: set[int] = field(default_factory=set)
    """The round number of every candidate (rounds given back leave holes)."""
    candidates_with_code: int = 0
    first_candidate_error: str | None = None
    """The first candidate without code: why."""
    evaluations: int = 0
    tune_evaluations: int = 0
    cycles: dict[str, CycleRecord] = field(default_factory=dict)
    attempts: dict[int, Attempt] = field(default_factory=dict)
    """Attempts made outside K-Search cycles (evolve and refine), by round."""
    candidates: dict[int, Candidate] = field(default_factory=dict)
    best_by_gpu: dict[str, Best] = field(default_factory=dict)
    confirms: dict[str, Confirm] = field(default_factory=dict)
    budget: dict[str, Any] = field(default_factory=dict)
    stopped: str | None = None
    finished: str | None = None
    resumes: int = 0
    results: dict[str, EvalResult] = field(default_factory=dict)
    forgotten: dict[str, tuple[Status, str]] = field(default_factory=dict)
    """A live view: solution id -> the status and message of a result it forgot (see `live`)."""
    llm_calls: list[LlmCallEvent] = field(default_factory=list)
    """Every LLM call (a reader's view; a live view keeps the counts below only)."""
    llm_replies: int = 0
    """Calls that came back with a reply, usable or not."""
    llm_last_error: str | None = None
    llm_ledger: dict[str, dict[str, float]] = field(default_factory=dict)
    """Role -> its calls' LEDGER_FIELDS: how many, failed, from the cache, tokens, dollars."""
    llm_cost_usd: float = 0.0
    llm_tokens: int = 0
    scores: dict[tuple[int, str], dict[str, list[float]]] = field(default_factory=dict)
    """(session, GPU name) -> solution id -> every passing score measured for it in that session."""
    score_errors: dict[tuple[int, str], list[float]] = field(default_factory=dict)
    """(session, GPU name) -> the relative standard error of every passing score measured in that session
    (from its timed calls): the noise's floor."""
    rows: list[EvalRow] = field(default_factory=list)
    timeline: list[TimelineRow] = field(default_factory=list)
    best_rows: list[BestRow] = field(default_factory=list)
    lost: list[EvaluatorLost] = field(default_factory=list)
    retimes: list[Retime] = field(default_factory=list)
    profiler: ProfilerNote | None = None
    """What the last session found when profiling was asked for."""
    profiles: dict[tuple[str, str], Profile] = field(default_factory=dict)
    """(solution id, GPU name) -> its profile (the last one, ok or not)."""
    run_ends: list[RunEnd] = field(default_factory=list)
    outages: list[Outage] = field(default_factory=list)
    no_stream: str | None = None
    """Why the endpoint is not streamed to (a `no_stream` event), for the rest of the run and every resume."""
    policy_faults: list[PolicyFault] = field(default_factory=list)
    plan_rejections: list[tuple[int, str]] = field(default_factory=list)
    """(seq, line) for every planner op not applied (or only in part), as its batch's report said: what the
    planner is told in its next call."""
    first_plan_failure: str | None = None
    """The first `plan_failed` event's error (what a run that never reached a coder reply says)."""
    session_measured: dict[str, int] = field(default_factory=dict)
    """What the current session measured at its start, by what: baseline, seed, best (see run/outcome.py)."""
    session_measured_t: float | None = None
    """The time of the current session's last baseline, seed or re-measurement."""
    active_s: float = 0.0
    _offset: float = 0.0
    _session_start: float | None = None
    last_t: float | None = None

    @classmethod
    def of(cls, events: Iterable[Event], solution_exists: Callable[[str], bool] = lambda _s: True) -> RunView:
        view = cls(solution_exists=solution_exists)
        with gc_paused():
            for event in events:
                view.apply(event)
        return view

    # --- derived facts -----------------------------------------------------------------------------

    @property
    def llm_call_count(self) -> int:
        return int(sum(row["calls"] for row in self.llm_ledger.values()))

    @property
    def llm_failed_calls(self) -> int:
        return int(sum(row["failed"] for row in self.llm_ledger.values()))

    @property
    def session_start_t(self) -> float | None:
        """The time of the current session's first event (its `resume`, or the run's first event)."""
        return self._session_start

    @property
    def tree(self) -> Tree | None:
        return self.wm.tree if self.wm is not None else None

    @property
    def best(self) -> Best | None:
        """The run's best: the fastest of its GPU types' current bests."""
        return max(self.best_by_gpu.values(), key=lambda b: b.speedup, default=None)

    @property
    def over(self) -> bool:
        """Nothing more will be written unless someone resumes the run."""
        return self.finished is not None or self.stopped is not None

    @property
    def open_cycles(self) -> list[CycleRecord]:
        return [c for c in self.cycles.values() if not c.ended]

    def noise(self, gpu: str | None = None) -> Noise | None:
        """How far repeated measurements of one unchanged kernel disagree on this GPU type in the
        current session (measure.noise_of); default: the best's GPU type."""
        if gpu is None:
            gpu = self.best.gpu if self.best else next(iter(self.gpu_of.values()), "")
        key = (self.session, gpu)
        return noise_of(self.scores.get(key, {}), floor=resolution_of(self.score_errors.get(key, [])))

    def candidate_rows(self) -> list[EvalRow]:
        return [r for r in self.rows if r.origin == "candidate"]

    def status_counts(self) -> dict[str, int]:
        """Candidate outcomes per status (NO_CODE included), in the order of the Status enum."""
        counts: dict[str, int] = {}
        for r in self.candidate_rows():
            counts[r.status] = counts.get(r.status, 0) + 1
        order = [s.value for s in Status] + [NO_CODE]
        return {s: counts[s] for s in order if s in counts}

    def best_profiles(self) -> dict[str, Profile]:
        """What the planner is shown of the profiles, by role: the best's and, when the best is not the seed,
        the seed's, on the best's GPU type (those that succeeded)."""
        best = self.best
        if best is None:
            return {}
        seed = self.seed.solution_id if self.seed else None
        roles = {"the best kernel so far" if best.solution_id != seed else "the seed, the best kernel so far": best.solution_id}
        if seed and seed != best.solution_id:
            roles["the seed, the kernel the search started from"] = seed
        return {role: p for role, sid in roles.items()
                if (p := self.profiles.get((sid, best.gpu))) is not None and p.result.ok}

    def best_measurement(self) -> tuple[EvalResult, EvalResult | None] | None:
        """The measurement the best's speedup comes from (else its latest) and the baseline measured beside it
        (same evaluator, session): what a report shows per workload agrees with the speedup it headlines."""
        best = self.best
        if best is None:
            return None
        passed = [row for row in self.rows if row.solution_id == best.solution_id and row.status == Status.PASSED.value]
        if not passed:
            return None
        row = next((r for r in reversed(passed) if r.speedup is not None and math.isclose(r.speedup, best.speedup)),
                   passed[-1])
        return self.results_at[row.seq], self._baseline_beside(row)

    def _baseline_beside(self, row: EvalRow) -> EvalResult | None:
        for other in reversed(self.rows):
            if other.seq < row.seq and other.origin == "baseline" and other.evaluator == row.evaluator \
                    and other.session == row.session:
                return self.results_at[other.seq]
        return self.baseline

    def cycles_in_flight(self) -> list[tuple[str, str]]:
        if self.finished is not None:
            return []
        return sorted((c.cycle_id, c.node_id) for c in self.open_cycles)

    def lost_phrases(self) -> list[str]:
        """One phrase per evaluation an evaluator (or its node) took down with it."""
        out = []
        for lost in self.lost:
            again = any(r.solution_id == lost.solution_id and r.seq > lost.seq for r in self.rows)
            out.append(f"{lost.solution_id} on evaluator {lost.evaluator}, "
                       + ("evaluated again" if again else "not evaluated since"))
        return out

    # --- the reducer ----------------------------------------------------------------------------------

    results_at: dict[int, EvalResult] = field(default_factory=dict)
    """seq -> the result an evaluation event carried (for the rows)."""

    def apply(self, event: Event) -> None:  # noqa: C901  (one branch per kind, in one place on purpose)
        if not self.live:
            self.events.append(event)
        self._clock(event)
        e = event
        if isinstance(e, WmInit):
            self.wm = WorldModelState(e.tree, self.solution_exists)
        elif isinstance(e, WmCall):
            if self.wm is None:
                raise EventError(f"event {e.seq}: a world-model call before wm_init")
            if isinstance(e.command, ApplyOps):
                report = self.wm.run(e.command)
                if e.plan_kind is not None:
                    self.plan_rejections += [(e.seq, f"{e.plan_kind}: {line}") for line in report.problems()]
            else:
                self.wm.run(e.command)
        elif isinstance(e, Resume):
            self.resumes += 1
            self.session += 1
            self.stopped = self.finished = None
            self.session_baselines = {}
            self._session_baseline_runs = {}
            self.session_measured, self.session_measured_t = {}, None
            self.budget.update(e.budget)
        elif isinstance(e, PlanFailed):
            self.first_plan_failure = self.first_plan_failure if self.first_plan_failure is not None else e.error
        elif isinstance(e, Baseline):
            self._measured("baseline", e.t)
            self.baseline = self.baseline or e.result
            # Of this session's measurements on the evaluator, the median (the faster of two): one slow
            # measurement does not inflate every speedup of the session.
            runs = self._session_baseline_runs.setdefault(e.evaluator, [])
            runs.append(e.result)
            ranked = sorted(runs, key=lambda r: r.score if r.score is not None else math.inf)
            self.session_baselines[e.evaluator] = ranked[(len(ranked) - 1) // 2]
            self.gpu_of[e.evaluator] = e.gpu
            self._score(e.gpu, e.solution_id, e.result)
            self._row(e, "baseline", e.result, e.solution_id, evaluator=e.evaluator, gpu=e.gpu)
        elif isinstance(e, Seed):
            self.seed, self.start = e, e.start
            self._measured("seed" if e.result is not None else None, e.t)
            if e.solution_id and e.result is not None:
                self.results[e.solution_id] = e.result
                self._score(e.gpu or "", e.solution_id, e.result)
                self._row(e, "seed", e.result, e.solution_id, evaluator=e.evaluator, gpu=e.gpu, speedup=e.speedup, round_=0)
        elif isinstance(e, SeedFailed):
            self._row(e, "seed", e.result, e.solution_id)
        elif isinstance(e, Remeasure):
            self._measured(e.role if e.role in ("seed", "best") else None, e.t)
            self._score(e.gpu, e.solution_id, e.result)
            origin = {"seed": "seed repeat", "best": "best re-measured", "baseline": "baseline repeat",
                      "full": "full timing of a screened candidate"}[e.role]
            self._row(e, origin, e.result, e.solution_id,
                      evaluator=e.evaluator, gpu=e.gpu, speedup=e.speedup)
        elif isinstance(e, LlmCallEvent):
            if not self.live:
                self.llm_calls.append(e)
            call = e.call
            self.llm_replies += call.error is None or error_class(call.error_kind) == "unusable"
            self.llm_last_error = call.error or self.llm_last_error
            ledger = self.llm_ledger.setdefault(e.role, dict.fromkeys(LEDGER_FIELDS, 0.0))
            for name, value in (("calls", 1), ("failed", call.error is not None), ("cached", call.cached),
                                ("prompt_tokens", call.prompt_tokens), ("completion_tokens", call.completion_tokens),
                                ("cost_usd", call.cost_usd)):
                ledger[name] += value
            self.llm_cost_usd += e.call.cost_usd
            self.llm_tokens += e.call.prompt_tokens + e.call.completion_tokens
        elif isinstance(e, CycleStart):
            self.cycles[e.cycle] = CycleRecord(e.cycle, e.node)
        elif isinstance(e, Candidate):
            self.rounds_used += 1
            self.candidates[e.round] = e
            self.round_numbers.add(e.round)
            if e.solution_id:
                self.candidates_with_code += 1
            elif self.first_candidate_error is None and e.error:
                self.first_candidate_error = e.error
            new = Attempt(round=e.round, kind=e.attempt_kind, solution_id=e.solution_id, error=e.error,
                          reply_start=e.reply_start)
            if e.cycle is not None and e.cycle in self.cycles:
                record = self.cycles[e.cycle]
                record.attempts.append(new)
                record.by_round.setdefault(e.round, new)
                if e.solution_id:
                    record.solution_ids.append(e.solution_id)
            else:
                self.attempts[e.round] = new
            if e.solution_id is None:
                said = f"\nthe reply began: {e.reply_start}" if e.reply_start else ""
                self._row(e, "candidate", None, None, round_=e.round, cycle=e.cycle, node=e.node, lane=e.lane,
                          attempt_kind=e.attempt_kind, error=first_lines((e.error or "no code came back") + said))
        elif isinstance(e, Evaluation):
            self.evaluations += 1
            self.results[e.solution_id] = e.result
            self._score(e.gpu or "", e.solution_id, e.result)
            measured = self.attempt(e)
            if measured is not None:
                measured.result, measured.speedup, measured.evaluator = e.result, e.speedup, e.evaluator
            kind = self.candidates[e.round].attempt_kind if e.round in self.candidates else None
            self._row(e, "candidate", e.result, e.solution_id, evaluator=e.evaluator, gpu=e.gpu, speedup=e.speedup,
                      round_=e.round, cycle=e.cycle, node=e.node, lane=e.lane, attempt_kind=kind)
        elif isinstance(e, Tune):
            self.tune_evaluations += 1
            self.results[e.solution_id] = e.result
            if e.cycle is not None and e.cycle in self.cycles:
                self.cycles[e.cycle].solution_ids.append(e.solution_id)
            self._score(e.gpu or "", e.solution_id, e.result)
            self._row(e, "tune", e.result, e.solution_id, evaluator=e.evaluator, gpu=e.gpu, speedup=e.speedup,
                      round_=e.round, cycle=e.cycle, node=e.node, lane=e.lane, attempt_kind="tune")
        elif isinstance(e, Tuned):
            tuned = self.attempt(e)
            if tuned is not None and e.solution_id != e.original:
                tuned.solution_id, tuned.result = e.solution_id, self.results[e.solution_id]
                tuned.speedup, tuned.evaluator = e.speedup, e.evaluator
        elif isinstance(e, CycleStop):
            self.cycles[e.cycle].stop_reason = e.reason
        elif isinstance(e, CycleStep):
            self.cycles[e.cycle].steps.add(e.step)
        elif isinstance(e, CycleEnd):
            self.cycles[e.cycle].ended = True
            if self.live:
                self._forget(self.cycles[e.cycle])
        elif isinstance(e, Best):
            before = self.best
            self.best_by_gpu[e.gpu] = e
            now = self.best
            if now is e and (before is None or before.solution_id != e.solution_id or before.speedup != e.speedup):
                cost = self.llm_cost_usd
                self.best_rows.append(BestRow(e.seq, e.round, e.speedup, e.solution_id, e.node, e.gpu, e.why,
                                              self.active_s, cost))
        elif isinstance(e, Retime):
            self.retimes.append(e)
        elif isinstance(e, ProfilerNote):
            self.profiler = e
        elif isinstance(e, Profile):
            self.profiles[(e.solution_id, e.gpu)] = e
        elif isinstance(e, Confirm):
            self.confirms[e.gpu] = e
            for row in e.repeats:
                for role, solution_id in row.ids.items():
                    score = row.scores.get(role)
                    if score is not None:
                        self.scores.setdefault((self.session, e.gpu), {}).setdefault(solution_id, []).append(score)
        elif isinstance(e, EvaluatorLost):
            self.lost.append(e)
        elif isinstance(e, RunEnd):
            self.finished = e.reason
            self.run_ends.append(e)
        elif isinstance(e, Stopped):
            self.stopped = e.reason
        elif isinstance(e, Outage):
            self.outages.append(e)
        elif isinstance(e, NoStream):
            self.no_stream = self.no_stream or e.reason
        elif isinstance(e, PolicyFault):
            self.policy_faults.append(e)

    def verdict(self, solution_id: str) -> tuple[Status, str] | None:
        """How a solution judged in this run fared: its status and message (None: not judged)."""
        result = self.results.get(solution_id)
        if result is not None:
            return result.status, result.message
        return self.forgotten.get(solution_id)

    def let_go(self, solution_ids: Iterable[str], keep: Iterable[str] = ()) -> None:
        """A live view forgets these results unless something refers to them (a best, the seed, `keep`); their
        verdicts stay (`verdict`). A reader keeps everything."""
        if not self.live:
            return
        kept = {b.solution_id for b in self.best_by_gpu.values()} | set(keep)
        if self.seed is not None and self.seed.solution_id:
            kept.add(self.seed.solution_id)
        for solution_id in solution_ids:
            result = self.results.get(solution_id)
            if result is not None and solution_id not in kept:
                self.forgotten[solution_id] = (result.status, clip(result.message, VERDICT_CHARS))
                del self.results[solution_id]

    def _forget(self, record: CycleRecord) -> None:
        """A live view at the end of a cycle: its attempts and candidates, and the results nothing refers to."""
        node = self.wm.tree.nodes.get(record.node_id) if self.wm is not None else None
        attached = [node.solution.solution_id] if node is not None and node.solution is not None else []
        self.let_go(record.solution_ids, keep=attached)
        for attempt in record.attempts:
            self.candidates.pop(attempt.round, None)
        record.attempts, record.by_round, record.solution_ids = [], {}, []

    def attempt(self, e: _Where) -> Attempt | None:
        """The attempt an event speaks of."""
        return self.attempt_at(e.round, e.cycle)

    def attempt_at(self, round_: int, cycle: str | None) -> Attempt | None:
        """The attempt of a round: in its cycle, or among the cycle-less attempts."""
        record = self.cycles.get(cycle or "")
        if record is not None:
            return record.by_round.get(round_)
        return self.attempts.get(round_)

    def _clock(self, e: _Event) -> None:
        if isinstance(e, Resume) and self._session_start is not None and self.last_t is not None:
            self._offset = self.active_s
            self._session_start = None
        if self._session_start is None:
            self._session_start = e.t
        self.active_s = self._offset + (e.t - self._session_start)
        self.last_t = e.t
        if not self.live:  # the cost so far: this event's call, which `apply` adds to llm_cost_usd after this
            cost = self.llm_cost_usd + (e.call.cost_usd if isinstance(e, LlmCallEvent) else 0.0)
            self.timeline.append(TimelineRow(e.seq, e.t, e.kind, self.active_s, cost))  # type: ignore[attr-defined]

    def _measured(self, what: str | None, t: float) -> None:
        if what is not None:
            self.session_measured[what] = self.session_measured.get(what, 0) + 1
        self.session_measured_t = t

    def _score(self, gpu: str, solution_id: str, result: EvalResult) -> None:
        if result.passed and result.score is not None:
            self.scores.setdefault((self.session, gpu), {}).setdefault(solution_id, []).append(result.score)
            error = score_error([w.timing.rel_err if w.timing else None for w in result.workloads])
            if error is not None:
                self.score_errors.setdefault((self.session, gpu), []).append(error)

    def _row(self, e: _Event, origin: str, result: EvalResult | None, solution_id: str | None, *,
             evaluator: int | None = None, gpu: str | None = None, speedup: float | None = None, round_: int | None = None,
             cycle: str | None = None, node: str | None = None, lane: str | None = None, attempt_kind: str | None = None,
             error: str = "") -> None:
        if result is not None:
            if not self.live:
                self.results_at[e.seq] = result
            if not result.passed:
                error = first_lines(f"{result.message}\n{result.log}")
        self.rows.append(EvalRow(
            seq=e.seq, origin=origin, round=round_, cycle=cycle, node=node, lane=lane, gpu=gpu, evaluator=evaluator,
            solution_id=solution_id, attempt_kind=attempt_kind,
            status=result.status.value if result is not None else NO_CODE,
            speedup=speedup if result is not None and result.passed else None,
            score=result.score if result is not None else None, seconds=result.seconds if result is not None else None,
            error=error, active_s=self.active_s, cost_usd=self.llm_cost_usd, llm_tokens=self.llm_tokens, session=self.session,
        ))
