"""Markdown tables of experiments: the comparison of methods (the paper's shape) and the width study.

Every speedup is over the task's baseline measured on the same machine; a cell with spread over
seeds reads `mean ± sd (n)`; `—` means no value (nothing passed, or no run reached the target).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import polars as pl


def markdown(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _present(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def spread(row: dict[str, Any], column: str, unit: str = "x", digits: int = 3) -> str:
    mean, sd, n = row.get(f"{column}_mean"), row.get(f"{column}_sd"), row.get(f"{column}_n") or 0
    if not _present(mean):
        return "—"
    text = f"{mean:.{digits}g}{unit}"
    if n > 1 and _present(sd):
        text += f" ± {sd:.2g}"
    return text + f" ({n})" if n > 1 else text


def value(v: Any, unit: str = "", digits: int = 3) -> str:
    return f"{v:.{digits}g}{unit}" if _present(v) else "—"


def method_markdown(table: pl.DataFrame, references: Sequence[str], check_set: str | None) -> str:
    """Per task and method: best speedup found, its check on the full set, rounds and dollars."""
    checked = check_set is not None and "check_passed" in table.columns
    headers = ["task", "method", "runs", "best speedup (search)"]
    if checked:
        headers += [f"correct on `{check_set}`", f"vs baseline on `{check_set}`"]
        headers += [f"vs {name} on `{check_set}`" for name in references]
    headers += ["rounds", "LLM cost (USD)"]
    rows = []
    for row in table.iter_rows(named=True):
        cells = [row["task"], row["method"], str(row["runs"]), spread(row, "best_speedup")]
        if checked:
            cells += [f"{row['check_passed']}/{row['checked']}", spread(row, "check_speedup")]
            cells += [spread(row, f"vs_{name}") for name in references]
        cells += [spread(row, "rounds", unit="", digits=4), spread(row, "cost_usd", unit="", digits=3)]
        rows.append(cells)
    return markdown(headers, rows)


def runs_markdown(runs: pl.DataFrame, references: Sequence[str], check_set: str | None) -> str:
    """One row per run: the numbers the method table summarizes."""
    checked = check_set is not None and "check_passed" in runs.columns
    headers = ["task", "method", "width", "random seed", "best (search)", "re-timed"]
    if checked:
        headers += [f"correct on `{check_set}`", "vs baseline"] + [f"vs {name}" for name in references]
    headers += ["rounds", "evaluations", "failure rate", "LLM cost (USD)", "wall (min)", "finished"]
    rows = []
    for r in runs.sort(["task", "method", "width", "random_seed"]).iter_rows(named=True):
        cells = [r["task"], r["method"], str(r["width"]), str(r["random_seed"]), value(r["best_speedup"], "x"),
                 value(r["confirmed_speedup"], "x")]
        if checked:
            status = "yes" if r["check_passed"] else (r.get("check_status") or "not checked")
            cells += [status, value(r.get("check_speedup"), "x")] + [value(r.get(f"vs_{n}"), "x") for n in references]
        cells += [str(r["rounds"]), str(r["evaluations"]), value(r["failure_rate"], "", 2), value(r["cost_usd"], "", 3),
                  value(r["wall_s"] / 60 if _present(r["wall_s"]) else None, "", 3), r["finished"] or "not finished"]
        rows.append(cells)
    return markdown(headers, rows)


def width_markdown(table: pl.DataFrame) -> str:
    """Per width: best speedup, rounds and wall time to the target, evaluation rate, busy share, failures."""
    target = table["target_speedup"][0] if table.height else None
    reach = f"≥ {target:.3g}x" if target is not None else "the target"
    headers = ["task", "method", "width", "runs", "best speedup", f"rounds to {reach}", f"wall min to {reach}",
               "evaluations / min", "evaluator busy", "failure rate"]
    rows = []
    for row in table.iter_rows(named=True):
        minutes = {k.replace("wall_s_to_target", "wall_min"): (v / 60 if _present(v) and k.endswith(("_mean", "_sd")) else v)
                   for k, v in row.items() if k.startswith("wall_s_to_target")}
        reached = f"{row['rounds_to_target_n']}/{row['runs']} reached"
        rows.append([
            row["task"], row["method"], str(row["width"]), str(row["runs"]), spread(row, "best_speedup"),
            f"{spread(row, 'rounds_to_target', unit='', digits=3)}; {reached}",
            spread(minutes, "wall_min", unit="", digits=3), spread(row, "evals_per_min", unit="", digits=3),
            spread(row, "busy_share", unit="", digits=2), spread(row, "failure_rate", unit="", digits=2),
        ])
    return markdown(headers, rows)
