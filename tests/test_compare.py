"""The judge's comparison: its short path for all-finite outputs gives the full comparison's verdict,
figure for figure, and leaves every failure to the full comparison (which says where)."""

from __future__ import annotations

import pytest
import torch

from ksearch_ray.evaluation import compare
from ksearch_ray.evaluation.compare import Comparison, compare_outputs
from ksearch_ray.models import Status
from ksearch_ray.taskspec.spec import Tolerance

GPUMODE = Tolerance(rule="gpumode", atol=1e-2, rtol=1e-2)
FLASHINFER = Tolerance(rule="flashinfer", atol=1e-2, rtol=1e-2)
MOSTLY = Tolerance(rule="flashinfer", atol=1e-2, rtol=1e-2, required_fraction=0.99)


def _cases() -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(7)
    ref = torch.randn(4096, generator=g) * 3
    heavy = torch.distributions.Cauchy(0.0, 1.0).sample((4096,))  # the TriMul workloads' distribution
    few_off = ref.clone()
    few_off[::200] += 1.0  # 21 of 4,096 out of tolerance: fails, but passes a 99 % requirement
    inf_ref = ref.clone()
    inf_ref[5] = float("-inf")
    inf_both = inf_ref.clone()
    nan_out = ref.clone()
    nan_out[9] = float("nan")
    big = torch.full((64,), 3e38)
    return [
        ("close", ref + 1e-4 * torch.randn(4096, generator=g), ref),
        ("equal", ref.clone(), ref),
        ("heavy tails, close", heavy * (1 + 1e-5), heavy),
        ("tiny references", torch.full((64,), 1e-3), torch.zeros(64)),
        ("on the tolerance's edge", torch.full((16,), 1e-2), torch.zeros(16)),  # |x - y| == atol exactly
        ("all wrong", ref + 1.0, ref),
        ("a few wrong", few_off, ref),
        ("the same infinity on both sides", inf_both, inf_ref),
        ("an infinity the reference lacks", inf_ref, ref),
        ("NaN in the output", nan_out, ref),
        ("a difference that overflows", big, -big),
        ("half precision", (ref + 1e-4).half(), ref),
        ("bfloat16, off", (ref * 1.1).bfloat16(), ref),
        ("empty", torch.zeros(0), torch.zeros(0)),
    ]


def _full(out: torch.Tensor, ref: torch.Tensor, tol: Tolerance, monkeypatch: pytest.MonkeyPatch) -> Comparison:
    with monkeypatch.context() as m:
        m.setattr(compare, "_all_finite_pass", lambda *_args: None)
        return compare._compare_values("out", out, ref, tol)


@pytest.mark.parametrize("tol", [GPUMODE, FLASHINFER, MOSTLY], ids=["gpumode", "flashinfer", "flashinfer-99%"])
def test_the_short_path_gives_the_full_comparisons_verdict_and_figures(tol, monkeypatch):
    passed_short = 0
    for name, out, ref in _cases():
        full = _full(out, ref, tol, monkeypatch)
        short = compare._compare_values("out", out, ref, tol)
        assert short == full, name
        finite = out.numel() == 0 or bool(torch.isfinite(out.float()).all() & torch.isfinite(ref).all())
        if finite and full.status is Status.PASSED and out.numel():
            assert compare._all_finite_pass(out.float().reshape(-1), ref.reshape(-1), tol) == full, name
            passed_short += 1
    assert passed_short >= 5  # the short path decided most passing cases itself


def test_a_failure_is_left_to_the_full_comparison_which_names_the_first_bad_element(monkeypatch):
    ref = torch.arange(8, dtype=torch.float32)
    out = ref.clone()
    out[3] += 1
    x = out.reshape(-1)
    assert compare._all_finite_pass(x, ref, GPUMODE) is None
    verdict = compare_outputs({"out": out}, {"out": ref}, {}, GPUMODE)
    assert verdict.status is Status.INCORRECT_NUMERICAL
    assert "1 of 8 elements wrong" in verdict.message and "first value outside tolerance at [3]" in verdict.message
