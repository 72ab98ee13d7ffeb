"""What a search method may use of the run it runs in: four narrow services, not the run's insides.

`SearchContext` holds them: `run` (the log, the live read model, the budget: `run.engine.Search`), `world`
(the world model: `run.mirror`), `llm` (planner and coder calls: `run.llm_calls`) and `evals` (measuring and
judging kernels: `run.evaluations`). A method reads the run's state through `run.view` (read only: it changes
only by `record`); everything it learns is an event it records, so a resumed run rebuilds it by replay.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ksearch_ray.worldmodel.api import Command, R

if TYPE_CHECKING:
    from ksearch_ray.config import RunConfig
    from ksearch_ray.events import Event, RunView
    from ksearch_ray.measure import Noise
    from ksearch_ray.models import EvalResult, Solution
    from ksearch_ray.policies.contract import Attempt, CodeRequest, PlanReply, PlanRequest
    from ksearch_ray.taskspec.task import Task
    from ksearch_ray.worldmodel.ops import ApplyReport
    from ksearch_ray.worldmodel.tree import Tree


class Refused(Exception):
    """The provider refused a coder call (a content policy, a request it rejects), again when asked again:
    no round was spent on it, and there is no attempt to judge. The message is one line."""


@dataclass(frozen=True)
class Where:
    """Which part of a method an attempt belongs to: a K-Search cycle on a node, or a lane."""

    cycle: str | None = None
    node: str | None = None
    method: str | None = None
    lane: str | None = None
    tags: dict[str, Any] = field(default_factory=dict, hash=False)
    """What else the method logs with its candidates (evolve: island, parent, inspirations)."""

    @property
    def key(self) -> str:
        """The name of this part in progress views and in LLM call records."""
        return self.cycle or self.lane or self.method or "search"

    def fields(self) -> dict[str, Any]:
        return {"cycle": self.cycle, "node": self.node, "method": self.method, "lane": self.lane}


class RunRecord(Protocol):
    """The run's log, its life and its budget: what every method uses."""

    config: RunConfig
    task: Task
    view: RunView
    """The run's read model, kept current by `record`; read only."""

    def record(self, event: Event) -> Event:
        """Append an event to the run's log and apply it to `view` (and the method's own state)."""
        ...

    def say(self, text: str) -> None:
        """One line for the user (live view, logs)."""
        ...

    def working(self, key: str, text: str | None) -> None:
        """What a cycle or lane is doing now, for the live view (None: it is done)."""
        ...

    def set_phase(self, text: str) -> None: ...

    def now(self) -> float:
        """The run's clock (the world model's leases use it)."""
        ...

    def budget_left(self) -> str | None:
        """None while the budget lasts, else why it ran out."""
        ...

    async def take_round(self) -> int | None:
        """A round to spend (its number), or None when the budget is spent."""
        ...

    def give_back_round(self, round_: int) -> None:
        """A round taken and not spent goes back to the budget."""
        ...


class WorldModel(Protocol):
    """The world model as a method sees it: the tree (the read model's) and one typed command at a time."""

    def tree(self) -> Tree: ...

    async def wm(self, command: Command[R], *, tag: dict[str, Any] | None = None) -> R:
        """One change of the world model (applied, mirrored and logged); what the command returns."""
        ...


class LlmCalls(Protocol):
    """The planner and the coder: requests with the run's facts, and calls that outlast the provider's failures."""

    def plan_request(self, kind: str, **fields: Any) -> PlanRequest: ...

    async def plan(self, request: PlanRequest, *, cycle: str | None = None) -> tuple[PlanReply, ApplyReport | None]:
        """Ask the planner and apply its ops; the reply and the apply report (None when nothing applied)."""
        ...

    def code_request(self, kind: str, **fields: Any) -> CodeRequest: ...

    async def generate(self, request: CodeRequest, round_: int, where: Where) -> Attempt | None:
        """Ask the coder for the round's candidate and record it (a `candidate` event). A call the provider
        failed is asked again until it answers (no round is spent on failures); None, with the round given
        back, when the budget ran out meanwhile; `Refused`, with the round given back, when the provider
        refuses the request however often it is asked."""
        ...


class Evaluations(Protocol):
    """Kernels measured and judged: the solutions by id, verdicts, the noise, the best."""

    def solution(self, solution_id: str) -> Solution: ...

    def save_solution(self, solution: Solution) -> str: ...

    def uncache(self, solution_ids: Iterable[str]) -> None:
        """These solutions' code leaves memory (a later need reads the store)."""
        ...

    async def judge(self, attempt: Attempt, where: Where) -> None:
        """Measure an attempt's code and record its `evaluation` event (the attempt in `view` carries it)."""
        ...

    async def measure(self, solution: Solution) -> tuple[EvalResult, int, float | None]:
        """A verdict from whichever evaluator is free, which one, and the speedup; nothing recorded."""
        ...

    async def note_best(self, solution_id: str, value: float | None, node: str, round_: int, evaluator: int) -> None:
        """A candidate becomes the best only beyond the noise and once an independent re-timing agrees."""
        ...

    def gpu_name(self, evaluator: int) -> str | None: ...

    def noise(self, evaluator: int | None = None) -> Noise | None: ...

    def baseline_for(self, evaluator: int | None) -> EvalResult | None: ...


@dataclass(frozen=True)
class SearchContext:
    """All a method sees of its run, as four services; a part of a method takes only those it uses
    (the tuner: `run` and `evals`)."""

    run: RunRecord
    world: WorldModel
    llm: LlmCalls
    evals: Evaluations


class Method(Protocol):
    """A search method: what it does with the rounds of a run (K-Search, evolve, refine)."""

    name: str

    def observe(self, event: Event) -> None:
        """Every event of the run, in log order: on replay when a session starts, then live."""
        ...

    async def run(self, ctx: SearchContext) -> str:
        """Search until the budget or the ideas run out; returns why it stopped."""
        ...
