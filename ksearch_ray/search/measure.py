"""How much to trust a speedup: the noise of repeated measurements, and the final re-timing.

Every session of a run measures the task's baseline on every evaluator (on its own GPU), so a
candidate's speedup is always against a baseline measured where the candidate was measured. The
baseline is measured more than once on each GPU type over a run; how much those measurements of
one unchanged kernel disagree is the run's *noise*, shown beside every speedup: a difference
smaller than the noise is not evidence of anything.

At the end the best kernel (and the seed it started from) are re-timed against the baseline,
interleaved, several times on one evaluator per GPU type. The spread of those speedups is what a
user should quote, and decides whether the search beat its seed at all.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from ksearch_ray.worldmodel.render import format_speedup


def relative_spread(scores: list[float]) -> float | None:
    """(max - min) / median of repeated measurements of one kernel; None below two measurements."""
    values = [s for s in scores if s and s > 0]
    if len(values) < 2:
        return None
    return (max(values) - min(values)) / statistics.median(values)


def _percent(noise: float) -> str:
    percent = 100 * noise
    return f"±{percent:.2g}%" if percent < 10 else f"±{percent:.0f}%"


def format_noise(noise: float | None) -> str:
    return "noise unknown" if noise is None else f"noise {_percent(noise)}"


def with_noise(speedup: float | None, noise: float | None) -> str:
    """'1.23x (±4%)': a speedup and how far repeated measurements of one kernel disagree."""
    text = format_speedup(speedup)
    return text if speedup is None or noise is None else f"{text} ({_percent(noise)})"


@dataclass(frozen=True)
class Spread:
    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: list[float]) -> Spread | None:
        return cls(statistics.median(values), min(values), max(values)) if values else None

    def text(self) -> str:
        if self.low == self.high:
            return format_speedup(self.median)
        return f"{format_speedup(self.median)} (range {format_speedup(self.low)}-{format_speedup(self.high)})"

    def as_dict(self) -> dict[str, float]:
        return {"median": self.median, "low": self.low, "high": self.high}


def confirm_verdict(best: Spread | None, over_seed: Spread | None, *, best_is_seed: bool) -> str:
    """One sentence on what the re-timing shows."""
    if best is None:
        return "the best could not be re-timed"
    if best_is_seed:
        return "the search did not beat its seed: the best kernel is the seed"
    if over_seed is None:
        return f"re-timed: {best.text()} over the baseline"
    if over_seed.low > 1.0:
        return f"beats the seed in every repeat: {over_seed.text()} over the seed"
    return f"the difference from the seed is within measured noise ({over_seed.text()} over the seed)"
