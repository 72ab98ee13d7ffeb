"""The evaluator's settings as records the run configuration embeds: limits and the timing rule.

Imports nothing heavy (no torch): the configuration reads these before anything starts.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class Limits(BaseModel):
    """Seconds. A worker that sends nothing for `idle` seconds (a hang) is killed."""

    model_config = ConfigDict(extra="forbid")

    setup: float = Field(default=300.0, gt=0, description="Sandbox worker start-up.")
    build_python: float = Field(default=300.0, gt=0, description="Importing a Python/Triton candidate.")
    build_cuda: float = Field(default=900.0, gt=0, description="Compiling a CUDA/C++ candidate in the evaluation.")
    idle: float = Field(default=180.0, gt=0, description="A candidate silent this long is a hang.")
    total: float = Field(default=3600.0, gt=0, description="A whole evaluation.")


class TimingPolicy(BaseModel):
    """GPUMode's stop rule: up to max_calls, stop once std/sqrt(n)/mean < target_rel_err, or
    n*mean > max_total_s, or max_wall_s have passed (always at least 3 calls)."""

    model_config = ConfigDict(extra="forbid")

    max_calls: int = Field(default=100, ge=3)
    target_rel_err: float = Field(default=1e-3, gt=0)
    max_total_s: float = Field(default=10.0, gt=0)
    max_wall_s: float = Field(default=120.0, gt=0)
    warmup_calls: int = Field(default=2, ge=0)
    flush_l2: bool = True
    tail_slack_ratio: float = Field(default=0.05, ge=0, description="Work hidden from the timed stream keeps the "
                                    "device busy after the end event: a device-wide sync right after it must return at once.")
    tail_slack_ms: float = Field(default=0.05, ge=0)

    @classmethod
    def for_device(cls, device: str) -> TimingPolicy:
        # On the CPU path a call is the Triton interpreter (seconds, host wall clock): GPUMode's
        # 10 s per benchmark would make every evaluation minutes long for a number that only
        # ranks variants on this machine.
        if device == "cpu":
            return cls(max_calls=20, max_total_s=1.0, max_wall_s=10.0, warmup_calls=1)
        return cls()
