"""Human-readable views of results (rich tables). Reads records only; computes nothing new."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from ksearch_ray.models import EvalResult, Status


def _fmt(value: float | None, spec: str = ".4g") -> str:
    return "—" if value is None else format(value, spec)


def eval_table(result: EvalResult, base: EvalResult | None = None) -> Table:
    clock = "GPU (CUDA events)" if result.device == "cuda" else "CPU host wall clock, not GPU latency"
    table = Table(title=f"{result.task} · {result.solution_name} · {result.workload_set} · {result.mode} · {clock}")
    for col in ("workload", "status", "mean ms", "median ms", "min ms", "std ms", "n", "max abs err", "max rel err"):
        table.add_column(col, justify="left" if col in ("workload", "status") else "right")
    if base is not None:
        table.add_column("speedup", justify="right")
    base_by_name = {w.workload: w for w in base.workloads} if base else {}
    for w in result.workloads:
        t = w.timing
        colour = "green" if w.status is Status.PASSED else "red"
        row = [
            w.workload, f"[{colour}]{w.status.value}[/]",
            _fmt(t.mean_ms if t else None), _fmt(t.median_ms if t else None), _fmt(t.min_ms if t else None),
            _fmt(t.std_ms if t else None), str(t.count) if t else "—",
            _fmt(w.max_abs_error, ".2e"), _fmt(w.max_rel_error, ".2e"),
        ]
        if base is not None:
            b = base_by_name.get(w.workload)
            ratio = b.timing.mean_ms / t.mean_ms if (b and b.timing and t) else None
            row.append(_fmt(ratio, ".3f"))
        table.add_row(*row)
    return table


def print_eval(console: Console, result: EvalResult, base: EvalResult | None, speedup: float | None) -> None:
    console.print(eval_table(result, base))
    if not result.passed:
        console.print(f"[bold red]{result.status.value}[/]: {result.message}", highlight=False)
        if result.log:
            console.print(result.log, highlight=False, markup=False)
        return
    where = f"{result.device_name}" + (f", compat: {', '.join(result.compat)}" if result.compat else "")
    if result.score is not None:
        console.print(f"score: {result.score:.4g} ({result.score_kind}) on {where}")
    else:
        console.print(f"PASSED (correctness only) on {where}")
    if base is not None and speedup is not None:
        console.print(f"baseline {base.solution_name}: {base.score:.4g}; speedup {speedup:.3f}x")
    console.print(f"evaluation took {result.seconds:.1f} s, of which sandbox overhead {result.overhead_seconds:.2f} s")


def print_run(console: Console, run_dir) -> None:  # type: ignore[no-untyped-def]
    """`ksearch show`: everything comes from the run directory."""
    from pathlib import Path

    from ksearch_ray.search.runstate import fold
    from ksearch_ray.search.store import RunStore
    from ksearch_ray.worldmodel.render import format_speedup, render_tree

    store = RunStore(Path(run_dir))
    manifest = store.manifest() if (Path(run_dir) / "manifest.json").is_file() else None
    if manifest is None:
        from ksearch_ray.search.store import RunDirError

        raise RunDirError(f"{run_dir} is not a run directory (no manifest.json)")
    events = store.read_events()
    state = fold(events, store.has_solution)
    cfg = manifest["config"]
    policy = f"llm: {cfg['model']}" if cfg.get("model") else "offline-policy (tunable search, no LLM)"
    console.print(f"[bold]{manifest['run_id']}[/] · task {cfg['task']} · {policy} · width {cfg['width']}", highlight=False)
    console.print(
        f"status: {state.finished or 'not finished (resume it with ksearch resume)'}; rounds {state.rounds_used}/{cfg['rounds']}; "
        f"evaluations {state.evaluations}; cycles {len(state.cycles)}; LLM calls {state.llm_calls} "
        f"(${state.llm_cost_usd:.2f}, {state.llm_tokens} tokens); resumed {state.resumes}×",
        highlight=False,
    )
    lost = lost_evaluations(events)
    if lost:
        console.print(f"evaluations lost to evaluator failures: {len(lost)} ({'; '.join(lost)})", highlight=False)
    ledger = llm_ledger_table(events)
    if ledger is not None:
        console.print(ledger)
    if state.tree is not None:
        console.print(render_tree(state.tree), highlight=False, markup=False)
    if state.best:
        best = state.best
        solution = store.load_solution(best["solution_id"])
        console.print(f"\nbest: {format_speedup(best['speedup'])} over the baseline, node {best['node']}, round {best['round']}, "
                      f"solution {best['solution_id']} ({solution.author})", highlight=False)
        for name, text in solution.sources.items():
            console.print(f"--- {name}", highlight=False)
            console.print(text, highlight=False, markup=False)
    else:
        console.print("\nno solution better than the baseline yet", highlight=False)


def lost_evaluations(events: list[dict]) -> list[str]:
    """One phrase per evaluation an evaluator (or its node) took down with it, from `evaluator_lost` events."""
    evaluated = {e.get("solution_id") for e in events if e["kind"] in ("evaluation", "baseline", "seed", "seed_repeat", "confirm")}
    return [
        f"{e['solution_id']} on evaluator {e['evaluator']}, " + ("evaluated again" if e["solution_id"] in evaluated else "not evaluated since")
        for e in events if e["kind"] == "evaluator_lost"
    ]


def llm_ledger_table(events: list[dict]) -> Table | None:
    """LLM spend per call kind, from the run's llm_call events."""
    rows: dict[str, list[float]] = {}
    for ev in events:
        if ev["kind"] != "llm_call":
            continue
        call = ev["call"]
        row = rows.setdefault(call["kind"], [0, 0, 0, 0, 0.0])
        row[0] += 1
        row[1] += bool(call.get("cached"))
        row[2] += call.get("error") is not None
        row[3] += int(call.get("prompt_tokens") or 0) + int(call.get("completion_tokens") or 0)
        row[4] += float(call.get("cost_usd") or 0.0)
    if not rows:
        return None
    table = Table("call kind", "calls", "cached", "failed", "tokens", "cost USD", title="LLM ledger")
    for kind, (calls, cached, failed, tokens, cost) in sorted(rows.items()):
        table.add_row(kind, str(int(calls)), str(int(cached)), str(int(failed)), str(int(tokens)), f"{cost:.4f}")
    return table
