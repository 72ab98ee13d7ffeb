"""Plots of experiments (matplotlib, headless): progress per method or width, and the width study.

A line is the mean over seeds, the band its min..max; speedups on a log scale. Horizontal lines mark
the baseline (1x, where the curves come near it) and any named reference solution (its speedup over
the baseline, measured on the same machine).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import polars as pl

AXIS_LABELS = {"round": "rounds (code generations)", "wall_s": "wall time (min)", "cost_usd": "LLM cost (USD)"}


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display, in CI and on cluster nodes
    import matplotlib.pyplot as plt

    return plt


def progress_figure(curves: Mapping[Any, pl.DataFrame], group: str, references: Mapping[str, float], title: str,
                    path: Path) -> Path:
    """One panel per axis in `curves` (round, wall_s, cost_usd): best-so-far speedup per `group` value."""
    plt = _pyplot()
    axes_names = [a for a in ("round", "wall_s", "cost_usd") if a in curves and curves[a].height]
    fig, axes = plt.subplots(1, len(axes_names), figsize=(5.2 * len(axes_names), 4.0), squeeze=False)
    for ax, axis in zip(axes[0], axes_names, strict=True):
        data = curves[axis]
        for (name,), part in data.group_by([group], maintain_order=True):
            x = part[axis].to_numpy() / (60.0 if axis == "wall_s" else 1.0)
            line = ax.plot(x, part["mean"].to_numpy(), label=f"{group} {name}" if group == "width" else str(name),
                           drawstyle="steps-post" if axis == "round" else "default")
            ax.fill_between(x, part["lo"].to_numpy(), part["hi"].to_numpy(), alpha=0.2, color=line[0].get_color(),
                            step="post" if axis == "round" else None)
        top = float(data["hi"].max() or 0.0)  # type: ignore[arg-type]
        if top >= 1 / 3:  # the baseline's line, unless it would squash every curve against the axis
            ax.axhline(1.0, color="grey", linestyle=":", linewidth=1)
        ax.set_yscale("log")  # speedups are ratios
        for name, speedup in references.items():
            ax.axhline(speedup, color="black", linestyle="--", linewidth=1)
            ax.annotate(name, (0.01, speedup), xycoords=("axes fraction", "data"), fontsize=8, va="bottom")
        ax.set_xlabel(AXIS_LABELS[axis])
        ax.set_ylabel("best speedup over the baseline")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


WIDTH_PANELS = (
    ("best_speedup", "best speedup over the baseline"),
    ("rounds_to_target", "rounds to the target speedup"),
    ("wall_s_to_target", "wall seconds to the target speedup"),
    ("evals_per_min", "evaluations per minute"),
    ("busy_share", "evaluator busy share"),
    ("failure_rate", "failure rate"),
)


def width_figure(table: pl.DataFrame, title: str, path: Path) -> Path:
    """The width study's numbers against the width: mean over seeds, bars from min to max."""
    plt = _pyplot()
    fig, axes = plt.subplots(2, 3, figsize=(13, 7))
    for ax, (column, label) in zip(axes.flat, WIDTH_PANELS, strict=True):
        for (task, method), part in table.group_by(["task", "method"], maintain_order=True):
            part = part.sort("width").filter(pl.col(f"{column}_mean").is_not_null())
            if not part.height:
                continue
            mean = part[f"{column}_mean"].to_numpy()
            lo, hi = mean - part[f"{column}_min"].to_numpy(), part[f"{column}_max"].to_numpy() - mean
            ax.errorbar(part["width"].to_numpy(), mean, yerr=[lo, hi], marker="o", capsize=3, label=f"{task} ({method})")
        ax.set_xscale("log", base=2)
        widths = sorted(set(table["width"].to_list()))
        ax.set_xticks(widths, [str(w) for w in widths])
        ax.set_xlabel("search width")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    target = table["target_speedup"][0] if table.height else None
    fig.suptitle(title + (f" (target speedup {target:.3g}x)" if target is not None else ""), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
