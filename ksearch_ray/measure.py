"""How much to trust a speedup: the noise of repeated measurements, and the final re-timing.

Every session of a run measures the task's baseline on every evaluator (on its own GPU), and the
kernel the session starts from beside it, so a candidate's speedup is always against numbers
measured where and when the candidate was measured.

**The noise** of a GPU type in a session is how far two measurements of one unchanged kernel
differ, nine times in ten. It is estimated robustly from every kernel measured more than once in
the session (the baseline's and the seed's repeats, re-measured bests, the final re-timing): the
spread of a measurement around its kernel's median, in logs, pooled over kernels, taken as 1.4826
times the median absolute deviation (a standard deviation that one wild measurement among many
barely moves, unlike a range, which only grows with more measurements); two measurements differ by
at most 1.645·√2 of those nine times in ten. It is shown beside every speedup (`1.23x (±4%)`),
and a candidate becomes the new best only when it beats the best by more than it: a smaller
difference is not evidence of anything.

At the end the best kernel (and the seed it started from) are re-timed against the baseline,
interleaved, on one evaluator per GPU type. The spread of those speedups is what a user should
quote, and decides whether the search beat its seed at all.
"""

from __future__ import annotations

import itertools
import math
import statistics

from pydantic import BaseModel, ConfigDict, Field

from ksearch_ray.worldmodel.render import format_speedup

MAD_TO_SIGMA = 1.4826
"""A normal distribution's standard deviation per median absolute deviation."""
OUTLIER_SIGMAS = 3.0
"""A measurement further than this many robust standard deviations from its kernel's median is an outlier."""
PAIR_90 = 1.645 * math.sqrt(2.0)
"""Two measurements differ by less than this many standard deviations (of one) nine times in ten."""


class Noise(BaseModel):
    """How far two measurements of one unchanged kernel differ, nine times in ten (relative)."""

    model_config = ConfigDict(frozen=True)

    value: float
    measurements: int = Field(description="Measurements of kernels measured more than once, that it rests on.")

    def text(self) -> str:
        return (f"noise {percent(self.value)}: nine in ten repeated measurements of one kernel differ by less "
                f"(from {self.measurements} measurements)")


def noise_of(scores_by_solution: dict[str, list[float]]) -> Noise | None:
    """The noise (above) of these measurements, kernel by kernel; None without a kernel measured twice."""
    residuals: list[float] = []
    counted = 0  # the outliers left out included: what was measured
    for scores in scores_by_solution.values():
        values = [math.log(s) for s in scores if s and s > 0 and math.isfinite(s)]
        if len(values) < 2:
            continue
        centre = statistics.median(values)
        counted += len(values)
        residuals += [abs(v - centre) for v in without_outliers(values, centre)]
    if not residuals:
        return None
    sigma = MAD_TO_SIGMA * statistics.median(residuals)
    return Noise(value=math.exp(PAIR_90 * sigma) - 1.0, measurements=counted)


def without_outliers(values: list[float], centre: float) -> list[float]:
    """One kernel's log-measurements less those further than OUTLIER_SIGMAS robust standard deviations from
    its median (a Hampel filter; a warm-up measurement ten times slow is one). Only with three or more: in a
    pair neither is the outlier."""
    if len(values) < 3:
        return values
    mad = statistics.median(abs(v - centre) for v in values)
    if mad <= 0:
        return [v for v in values if v == centre] or values
    return [v for v in values if abs(v - centre) <= OUTLIER_SIGMAS * MAD_TO_SIGMA * mad]


def pair_differences(scores: list[float]) -> list[float]:
    """|a - b| / min(a, b) for every pair of positive measurements of one kernel."""
    values = [s for s in scores if s and s > 0 and math.isfinite(s)]
    return [abs(a - b) / min(a, b) for a, b in itertools.combinations(values, 2)]


def relative_spread(scores: list[float]) -> float | None:
    """(max - min) / median of repeated measurements of one kernel; None below two measurements."""
    values = [s for s in scores if s and s > 0]
    if len(values) < 2:
        return None
    return (max(values) - min(values)) / statistics.median(values)


def percent(value: float) -> str:
    p = 100 * value
    return f"±{p:.2g}%" if p < 10 else f"±{p:.0f}%"


def format_noise(noise: Noise | None) -> str:
    return "noise unknown (no kernel measured twice yet)" if noise is None else noise.text()


def with_noise(speedup: float | None, noise: Noise | None) -> str:
    """'1.23x (±4%)': a speedup and how far repeated measurements of one kernel disagree."""
    text = format_speedup(speedup)
    return text if speedup is None or noise is None else f"{text} ({percent(noise.value)})"


def beyond_noise(value: float, than: float, noise: Noise | None) -> bool:
    """`value` is larger than `than` by more than the noise (any larger value, when the noise is unknown)."""
    return value > than * (1.0 + (noise.value if noise else 0.0))


class Spread(BaseModel):
    model_config = ConfigDict(frozen=True)

    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: list[float]) -> Spread | None:
        return cls(median=statistics.median(values), low=min(values), high=max(values)) if values else None

    def text(self) -> str:
        if self.low == self.high:
            return format_speedup(self.median)
        return f"{format_speedup(self.median)} (range {format_speedup(self.low)}-{format_speedup(self.high)})"


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
    return (f"did not beat the seed in every repeat ({over_seed.text()} over the seed): "
            "the run hands out the seed")
