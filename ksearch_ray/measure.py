"""How much to trust a speedup: the noise of repeated measurements, and the final re-timing.

Every session of a run measures the task's baseline on every evaluator (on its own GPU), and the
kernel the session starts from beside it, so a candidate's speedup is always against numbers
measured where and when the candidate was measured.

**The noise** of a GPU type in a session is how far two measurements of one unchanged kernel
differ, nine times in ten. It rests on every kernel measured more than once in the session: the
baseline (measured `noise_repeats` times at the start of every session, or fewer within its time
budget and the rest between candidates, at most `noise_share` of each evaluator's time), the seed's repeats,
re-measured bests and the final re-timing. Per kernel, in logs, the measurements further than five
robust standard deviations from the kernel's median are left out (a Hampel filter: a warm-up
measurement ten times slow); each of the rest and the next one measured of that kernel give a
difference; the median difference of those pairs, pooled over kernels, times 1.645/0.6745 is the 90th
percentile of a difference (normal differences). Pairs of measurements taken one after the other,
not every pair: a machine whose speed drifts over a session (its load falling from 10 to 3 took
TriMul's CPU baseline from 82-130 ms to 18-25 ms) made every-pair figures follow the session's load
trajectory: ±105 %, ±221 % and ±316 % in three runs of one command on a loaded 2-core machine,
against ±101 %, ±164 % and ±75 % from successive pairs; a drift between a candidate and an earlier best is left to the re-timings, which measure side
by side. A median moves only when about half the pairs are wild, and unlike a range it does not grow
with more measurements. It is never below the measurements' own resolution: two figures whose timed calls
leave each a standard error s differ by 1.645·√2·s nine times in ten, s being the median, over
every passing measurement of the session, of the score's standard error from its per-workload
timings. It is shown beside every speedup (`1.23x (±4%)`), and a candidate becomes the new best
only when it beats the best by more than it: a smaller difference is not evidence of anything.

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
OUTLIER_SIGMAS = 5.0
"""A measurement further than this many robust standard deviations from its kernel's median is an outlier
(three, the textbook Hampel bound, also drops honest measurements of a few and made the estimate swing more)."""
PAIR_90 = 1.645 * math.sqrt(2.0)
"""Two measurements differ by less than this many standard deviations (of one) nine times in ten."""
P90_PER_MEDIAN_DIFFERENCE = 1.645 / 0.6745
"""A normal difference's 90th percentile (of its absolute value) per its median: 2.44."""


class Noise(BaseModel):
    """How far two measurements of one unchanged kernel differ, nine times in ten (relative)."""

    model_config = ConfigDict(frozen=True)

    value: float
    measurements: int = Field(description="Measurements of kernels measured more than once, that it rests on.")
    floor: float = Field(default=0.0, description="The measurements' own resolution, below which it is not put.")

    @property
    def at_floor(self) -> bool:
        return self.floor > 0 and self.value <= self.floor

    def text(self) -> str:
        floor = "; the timer's own resolution" if self.at_floor else ""
        return (f"noise {percent(self.value)}: nine in ten repeated measurements of one kernel differ by less "
                f"(from {self.measurements} measurements{floor})")


def noise_of(scores_by_solution: dict[str, list[float]], floor: float = 0.0) -> Noise | None:
    """The noise (above) of these measurements, kernel by kernel, not below `floor` (resolution_of); None
    without a kernel measured twice."""
    differences: list[float] = []
    counted = 0  # the outliers left out included: what was measured
    for scores in scores_by_solution.values():
        values = [math.log(s) for s in scores if s and s > 0 and math.isfinite(s)]
        if len(values) < 2:
            continue
        counted += len(values)
        kept = without_outliers(values, statistics.median(values))  # in the order measured
        differences += [abs(a - b) for a, b in itertools.pairwise(kept)]
    if not differences:
        return None
    value = math.exp(P90_PER_MEDIAN_DIFFERENCE * statistics.median(differences)) - 1.0
    return Noise(value=max(value, floor), measurements=counted, floor=floor)


def score_error(workload_errors: list[float | None]) -> float | None:
    """The relative standard error of a geometric mean of per-workload figures with these relative standard
    errors (independent); None where a workload's is unknown."""
    if not workload_errors or any(e is None or not math.isfinite(e) for e in workload_errors):
        return None
    return math.sqrt(sum(e * e for e in workload_errors if e is not None)) / len(workload_errors)


def resolution_of(score_errors: list[float]) -> float:
    """How far two measurements differ nine times in ten from their timed calls' scatter alone (the median
    measurement's standard error): the floor of the noise. 0 without any."""
    return math.exp(PAIR_90 * statistics.median(score_errors)) - 1.0 if score_errors else 0.0


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
