"""One run's state in a record: what `ksearch show --json` prints and what `show` and `--follow` draw."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from ksearch_ray.report.tables import Origin, Run


class LedgerRow(BaseModel):
    """LLM calls of one role and call kind."""

    role: str = Field(description="planner or coder (or another method's role).")
    kind: str = Field(description="Call kind, e.g. initialize_tree, generate_from_spec, debug.")
    calls: int
    cached: int = Field(description="Served from the response cache: no request sent, no cost.")
    failed: int = Field(description="Calls that produced no reply after their retries.")
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float


class RunSummary(BaseModel):
    """A run as its event log tells it, at the moment it was read."""

    run_id: str
    run_dir: str = Field(description="Absolute path of the run directory.")
    task: str | None
    method: str = Field(description="Search method; 'ksearch' is the world-model search.")
    policy: str = Field(description="'llm: <model>' or the offline policy.")
    hardware: str = Field(description="Device name the evaluators reported.")
    finished: str | None = Field(description="Why the run ended; null while it runs or after a session stopped early.")
    stopped: str | None = Field(description="Why the last session stopped before the run ended (it can be resumed).")
    rounds_used: int = Field(description="Code generations so far (rounds that produced no code included).")
    rounds_budget: int | None
    resumes: int
    wall_s: float = Field(description="Running time, summed over sessions.")
    evaluations: int = Field(description="Candidate evaluations (the baseline and the seed not counted).")
    outcomes: dict[str, int] = Field(description="Candidate rounds per status; NO_CODE: no code came back to evaluate.")
    best: dict[str, Any] | None = Field(
        description="solution_id, speedup over the baseline, node, round and gpu of the best so far (the seed until beaten)."
    )
    noise: float | None = Field(
        description="Relative spread of repeated measurements of one kernel on the best's GPU type: "
        "a smaller speedup difference is not evidence of anything."
    )
    confirmed: list[dict[str, Any]] = Field(
        description="Per GPU type, the final re-timing of the best against the baseline, interleaved: "
        "gpu, solution_id, best_speedup (median, low, high), over_seed, verdict."
    )
    seed: dict[str, Any] | None = Field(description="solution_id and speedup of the solution the run started from.")
    baseline: dict[str, Any] | None = Field(description="solution_id, name, score and score_kind of the task's baseline.")
    llm_calls: int
    llm_cost_usd: float
    llm_tokens: int
    ledger: list[LedgerRow]
    cycles_open: list[dict[str, str]] = Field(description="Cycles started and not ended: cycle, node.")
    lost: list[str] = Field(default_factory=list, description=(
        "Evaluations an evaluator (or its node) took down with it: the solution, the evaluator, and whether it was "
        "evaluated again."))
    world_model: dict[str, Any] | None = Field(description="The world-model tree (JSON); null for methods that keep none.")


def lost_evaluations(events: list[dict[str, Any]]) -> list[str]:
    """One phrase per evaluation an evaluator (or its node) took down with it, from `evaluator_lost` events."""
    evaluated: dict[str, float] = {}
    for e in events:
        if e.get("kind") in ("evaluation", "tune", "baseline", "seed", "seed_repeat", "confirm") and e.get("solution_id"):
            evaluated[e["solution_id"]] = e["t"]
    return [
        f"{e['solution_id']} on evaluator {e['evaluator']}, "
        + ("evaluated again" if evaluated.get(e["solution_id"], 0) > e["t"] else "not evaluated since")
        for e in events if e.get("kind") == "evaluator_lost"
    ]


def summarize(run: Run, *, with_tree: bool = True) -> RunSummary:
    cfg = run.config
    calls = run.llm_calls
    base = run.baseline
    seed = run.seed
    best = run.best
    tree = run.tree if with_tree else None
    return RunSummary(
        run_id=run.run_id, run_dir=str(run.root.resolve()), task=cfg.get("task"), method=run.method, policy=run.policy,
        hardware=run.hardware, finished=run.finished, stopped=run.stopped, rounds_used=run.rounds_used, rounds_budget=cfg.get("rounds"),
        resumes=run.resumes, wall_s=run.wall_s,
        evaluations=run.evaluations.filter(
            (run.evaluations["origin"] == Origin.CANDIDATE) & run.evaluations["solution_id"].is_not_null()
        ).height,
        outcomes=run.status_counts(),
        best={k: best[k] for k in ("solution_id", "speedup", "node", "round", "gpu") if k in best} if best else None,
        noise=run.noise(),
        confirmed=[{k: ev.get(k) for k in ("gpu", "solution_id", "best_speedup", "over_seed", "verdict")}
                   for ev in run.confirms.values()],
        seed={"solution_id": seed["solution_id"], "speedup": seed.get("speedup")} if seed else None,
        baseline={"solution_id": base.solution_id, "name": base.solution_name, "score": base.score,
                  "score_kind": base.score_kind} if base else None,
        llm_calls=calls.height, llm_cost_usd=run.llm_cost_usd, llm_tokens=run.llm_tokens,
        ledger=[LedgerRow.model_validate(row) for row in run.ledger().iter_rows(named=True)],
        cycles_open=[{"cycle": c, "node": n} for c, n in run.cycles_in_flight()],
        lost=lost_evaluations(run.events),
        world_model=tree.model_dump(mode="json") if tree else None,
    )
