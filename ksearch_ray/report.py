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
