"""One run's state in a record: what `ksearch show --json` prints and what `show` and `--follow` draw."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from ksearch_ray.report.run_tables import Run


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
        description="solution_id, speedup over the baseline, node, round, gpu and why of the best so far (the seed until "
        "beaten), as last measured beside the baseline."
    )
    noise: float | None = Field(
        description="How far two measurements of one unchanged kernel differ, nine times in ten (relative), on the "
        "best's GPU type in the last session: a smaller speedup difference is not evidence of anything."
    )
    noise_measurements: int = Field(default=0, description="Measurements of repeated kernels the noise rests on.")
    noise_floor: float = Field(default=0.0, description="The timed calls' own resolution, below which the noise is not put.")
    confirmed: list[dict[str, Any]] = Field(
        description="Per GPU type, the final re-timing of the best against the baseline, interleaved: "
        "gpu, solution_id, best_speedup (median, low, high), over_seed, verdict, beats_seed, cut_short."
    )
    seed: dict[str, Any] | None = Field(description="solution_id, speedup and name of the solution the run started from.")
    start: str | None = Field(default=None, description="seed (the run starts from a seed kernel) or spec (from the specification).")
    baseline: dict[str, Any] | None = Field(description="solution_id, name, score and score_kind of the task's baseline.")
    llm_calls: int
    llm_cost_usd: float
    llm_tokens: int
    ledger: list[LedgerRow]
    cycles_open: list[dict[str, str]] = Field(description="Cycles started and not ended: cycle, node.")
    lost: list[str] = Field(default_factory=list, description=(
        "Evaluations an evaluator (or its node) took down with it: the solution, the evaluator, and whether it was "
        "evaluated again."))
    profiler: dict[str, Any] | None = Field(default=None, description=(
        "Profiling of the bests (--profile-bests): tool, evaluators, or the problem that kept every evaluator from it; "
        "null when it was not asked for."))
    profiles: list[dict[str, Any]] = Field(default_factory=list, description=(
        "Each best's Nsight Compute profile, oldest first: solution_id, gpu, and the profile (status, message, "
        "workload, measured_ms, seconds, tool, kernels with their throughputs, occupancy and top stalls)."))
    world_model: dict[str, Any] | None = Field(description="The world-model tree (JSON); null for methods that keep none.")


def summarize(run: Run, *, with_tree: bool = True) -> RunSummary:
    base = run.baseline
    seed = run.seed
    best = run.best
    noise = run.noise()
    tree = run.tree if with_tree else None
    return RunSummary(
        run_id=run.run_id, run_dir=str(run.root.resolve()), task=run.config.get("task"), method=run.method,
        policy=run.policy, hardware=run.hardware, finished=run.finished, stopped=run.stopped, rounds_used=run.rounds_used,
        rounds_budget=run.rounds_budget, resumes=run.resumes, wall_s=run.wall_s,
        evaluations=run.view.evaluations,
        outcomes=run.status_counts(),
        best=best.model_dump(mode="json", include={"solution_id", "speedup", "node", "round", "gpu", "why"}) if best else None,
        noise=noise.value if noise else None,
        noise_measurements=noise.measurements if noise else 0,
        noise_floor=noise.floor if noise else 0.0,
        confirmed=[c.model_dump(mode="json", include={"gpu", "solution_id", "best_speedup", "over_seed", "verdict",
                                                      "beats_seed", "cut_short"}) for c in run.confirms.values()],
        seed={"solution_id": seed.solution_id, "speedup": seed.speedup, "name": seed.result.solution_name if seed.result else None}
        if seed else None,
        start=run.view.start,
        baseline={"solution_id": base.solution_id, "name": base.solution_name, "score": base.score,
                  "score_kind": base.score_kind} if base else None,
        llm_calls=run.view.llm_call_count, llm_cost_usd=run.llm_cost_usd, llm_tokens=run.llm_tokens,
        ledger=[LedgerRow.model_validate(row) for row in run.ledger_rows()],
        cycles_open=[{"cycle": c, "node": n} for c, n in run.cycles_in_flight()],
        lost=run.view.lost_phrases(),
        profiler=run.view.profiler.model_dump(mode="json", include={"tool", "evaluators", "problem"})
        if run.view.profiler else None,
        profiles=[{"solution_id": p.solution_id, "gpu": p.gpu, **p.result.model_dump(mode="json", exclude={"solution_id"})}
                  for p in sorted(run.view.profiles.values(), key=lambda p: p.seq)],
        world_model=tree.model_dump(mode="json") if tree else None,
    )
