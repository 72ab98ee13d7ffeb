"""Judging a candidate's outputs against the reference: shape, dtype, then numbers.

Runs in the evaluator's own process, never in the sandbox. Messages name the first bad
element with its index and both values, which is what a model needs to find the bug.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ksearch_ray.models import Status
from ksearch_ray.taskspec.spec import Tolerance

_DTYPES = {
    "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64,
    "int32": torch.int32, "int64": torch.int64, "int8": torch.int8, "uint8": torch.uint8, "bool": torch.bool,
    "float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2,
}


def dtype_of(name: str) -> torch.dtype:
    return _DTYPES[name]


@dataclass
class Comparison:
    status: Status
    message: str = ""
    max_abs_error: float | None = None
    max_rel_error: float | None = None
    fraction_ok: float | None = None


def _index(flat: int, shape: torch.Size) -> tuple[int, ...]:
    idx = []
    for size in reversed(shape):
        idx.append(flat % size)
        flat //= size
    return tuple(reversed(idx))


def compare_outputs(
    got: dict[str, Any], expected: dict[str, Any], specs: dict[str, Any], tol: Tolerance, *, any_float_dtype: bool = False
) -> Comparison:
    worst = Comparison(Status.PASSED, max_abs_error=0.0, max_rel_error=0.0, fraction_ok=1.0)
    for name, ref in expected.items():
        if name not in got:
            return Comparison(Status.INCORRECT_SHAPE, f"missing output `{name}` (got {', '.join(got) or 'none'})")
        out = got[name]
        if tuple(out.shape) != tuple(ref.shape):
            return Comparison(Status.INCORRECT_SHAPE, f"output `{name}` has shape {list(out.shape)}, expected {list(ref.shape)}")
        want = dtype_of(specs[name].dtype) if name in specs else ref.dtype
        if out.dtype != want and not (any_float_dtype and out.dtype.is_floating_point):
            return Comparison(Status.INCORRECT_DTYPE, f"output `{name}` has dtype {out.dtype}, expected {want}")
        result = _compare_values(name, out, ref, tol)
        if result.status is not Status.PASSED:
            return result
        worst.max_abs_error = max(worst.max_abs_error or 0.0, result.max_abs_error or 0.0)
        worst.max_rel_error = max(worst.max_rel_error or 0.0, result.max_rel_error or 0.0)
        worst.fraction_ok = min(worst.fraction_ok or 1.0, result.fraction_ok or 1.0)
    return worst


def _compare_values(name: str, out: torch.Tensor, ref: torch.Tensor, tol: Tolerance) -> Comparison:
    x = out.to(torch.float32).reshape(-1)
    y = ref.to(device=x.device, dtype=torch.float32).reshape(-1)
    n = x.numel()
    if n == 0:
        return Comparison(Status.PASSED, max_abs_error=0.0, max_rel_error=0.0, fraction_ok=1.0)
    if bool(torch.isfinite(x.sum()) & torch.isfinite(y.sum())):  # no NaN or infinity on either side
        passed = _all_finite_pass(x, y, tol)
        if passed is not None:
            return passed
    x_finite, y_finite = torch.isfinite(x), torch.isfinite(y)
    if tol.rule == "gpumode":
        # NaN and +-inf must sit exactly where the reference has them.
        mismatch = (torch.isnan(x) != torch.isnan(y)) | ((~x_finite | ~y_finite) & ~torch.isnan(x) & (x != y))
    else:
        # No NaN ever; an infinity only where the reference has the same one (GQA's lse of an
        # empty request is -inf by definition).
        mismatch = torch.isnan(x) | (~x_finite & (x != y))
    both = x_finite & y_finite
    diff = torch.where(both, (x - y).abs(), torch.zeros_like(x))
    rel = diff / (y.abs() + 1e-8)
    if tol.rule == "gpumode":
        bad = both & (diff > tol.atol + tol.rtol * y.abs())
    else:
        bad = both & (diff > tol.atol) & (rel > tol.rtol)
    bad |= mismatch
    n_bad = int(bad.sum())
    max_abs = float(diff.max())
    max_rel = float(torch.where(both, rel, torch.zeros_like(rel)).max())
    fraction_ok = 1.0 - n_bad / n
    if fraction_ok >= tol.required_fraction and (n_bad == 0 or tol.required_fraction < 1.0):
        return Comparison(Status.PASSED, max_abs_error=max_abs, max_rel_error=max_rel, fraction_ok=fraction_ok)
    first = int(torch.nonzero(bad)[0, 0])
    where = _index(first, out.shape)
    kind = "non-finite value" if bool(mismatch[first]) else "value outside tolerance"
    return Comparison(
        Status.INCORRECT_NUMERICAL,
        f"output `{name}`: {n_bad} of {n} elements wrong ({100 * n_bad / n:.3g}%), max abs error {max_abs:.3g}; "
        f"first {kind} at {list(where)}: got {float(x[first]):.6g}, expected {float(y[first]):.6g}",
        max_abs_error=max_abs,
        max_rel_error=max_rel,
        fraction_ok=fraction_ok,
    )


def _all_finite_pass(x: torch.Tensor, y: torch.Tensor, tol: Tolerance) -> Comparison | None:
    """The verdict of `_compare_values` where every value of `x` and `y` is finite (a sum with a NaN or an
    infinity in it is not), if it passes; None if it does not (the full comparison then says where). The
    same float32 operations on the same values, so the same figures, in about half of its passes over the
    outputs (the judge's comparisons of TriMul's largest outputs, 1.5 GiB each, are bound by memory traffic)."""
    n = x.numel()
    diff = torch.sub(x, y).abs_()
    scale = y.abs()
    bad = diff > scale.mul(tol.rtol).add_(tol.atol) if tol.rule == "gpumode" else None  # before `scale` is reused
    rel = torch.div(diff, scale.add_(1e-8), out=scale)
    if bad is None:
        bad = (diff > tol.atol) & (rel > tol.rtol)
    n_bad = int(bad.sum())
    fraction_ok = 1.0 - n_bad / n
    if not (fraction_ok >= tol.required_fraction and (n_bad == 0 or tol.required_fraction < 1.0)):
        return None
    return Comparison(Status.PASSED, max_abs_error=float(diff.max()), max_rel_error=float(rel.max()),
                      fraction_ok=fraction_ok)
