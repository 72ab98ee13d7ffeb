"""An `Evaluator` built from the run's evaluation settings: in one place, for every pool."""

from __future__ import annotations

from pathlib import Path

from ksearch_ray.config import EvaluationConfig
from ksearch_ray.evaluation.evaluator import Evaluator
from ksearch_ray.evaluation.sandbox.isolation import Isolation


def build_evaluator(settings: EvaluationConfig, device: str, work_root: Path | None = None, *,
                    start: bool = False) -> Evaluator:
    """The evaluator of one device, with the run's limits, timing rule and isolation. Its sandbox starts
    with the first evaluation, or now with `start` (a host that cannot isolate fails here then)."""
    return Evaluator(
        device, work_root,
        limits=settings.limits.model_copy(), timing=settings.timing_for(device),
        isolation=Isolation(settings.isolation), start=start, profiler=settings.profile.settings(),
    )
