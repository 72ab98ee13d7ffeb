"""An `Evaluator` built from the run's evaluation settings: in one place, for every pool."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from ksearch_ray.config import EvaluationConfig
from ksearch_ray.evaluation.evaluator import Evaluator
from ksearch_ray.evaluation.sandbox.isolation import Isolation


def build_evaluator(settings: EvaluationConfig, device: str, work_root: Path | None = None, *,
                    start: bool = False, secret_names: Iterable[str | None] = (), secret: int | None = None) -> Evaluator:
    """The evaluator of one device, with the run's limits, timing rule and isolation. Its sandbox starts
    with the first evaluation, or now with `start` (a host that cannot isolate fails here then).
    `secret_names`: the run's API key variable (config.llm.api_key_env): kept from candidates, redacted.
    `secret`: the run's input secret (one per run, so every evaluator draws the same inputs); none: its own."""
    return Evaluator(
        device, work_root,
        limits=settings.limits.model_copy(), timing=settings.timing_for(device),
        isolation=Isolation(settings.isolation), start=start, profiler=settings.profile.settings(),
        secret_names=frozenset(n for n in secret_names if n), secret=secret,
        triton_helper_ahead=settings.triton_helper_ahead, screen_timing=settings.screen_timing_for(device),
        overlap=settings.overlap,
    )
