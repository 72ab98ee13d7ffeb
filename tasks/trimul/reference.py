"""Trusted reference for the TriMul task: AlphaFold3's outgoing triangle multiplicative update.

Loaded by path by the framework (never imported by name). Inputs are regenerated from a seed in
whichever process needs them, so generate_inputs must be bit-for-bit deterministic per device.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

EPS = 1e-5

# GPUMode's names, in the order the weights dict is built and the inputs dict lists them.
WEIGHT_NAMES = (
    "norm.weight",
    "norm.bias",
    "left_proj.weight",
    "right_proj.weight",
    "left_gate.weight",
    "right_gate.weight",
    "out_gate.weight",
    "to_out_norm.weight",
    "to_out_norm.bias",
    "to_out.weight",
)

COMPAT = "gpumode-compat"


def _param(workload: Any, key: str, default: Any) -> Any:
    params = workload.params if hasattr(workload, "params") else workload["params"]
    return params.get(key, default)


def _axes(workload: Any) -> dict[str, int]:
    return dict(workload.axes if hasattr(workload, "axes") else workload["axes"])


def generate_inputs(
    workload: Any, seed: int, device: str, options: frozenset[str] = frozenset()
) -> dict[str, torch.Tensor]:
    """x, mask, then the ten weights, all drawn from one generator seeded with `seed`.

    `seed` (not workload.params["seed"]) is used: the framework mixes the workload's seed with a
    secret so a candidate cannot precompute answers for the published seeds.
    """
    axes = _axes(workload)
    b, n, d, h = axes["B"], axes["N"], axes["D"], axes.get("H", 128)
    nomask = bool(_param(workload, "nomask", True))
    distribution = _param(workload, "distribution", "normal")
    if distribution not in ("normal", "cauchy"):
        raise ValueError(f"unknown distribution {distribution!r}")

    gen = torch.Generator(device=device).manual_seed(seed)
    f32 = {"device": device, "dtype": torch.float32, "generator": gen}

    if distribution == "cauchy":
        # Inverse CDF of Cauchy(0, 2); drawn from our generator so it is reproducible.
        u = torch.rand((b, n, n, d), **f32)
        x = 2.0 * torch.tan(math.pi * (u - 0.5))
        del u
    else:
        x = torch.randn((b, n, n, d), **f32)

    # The mask bits are always drawn, so the weights that follow do not depend on nomask or options.
    mask_bits = torch.rand((b, n, n), **f32) < 0.5
    if nomask or COMPAT in options:
        mask = torch.ones((b, n, n), device=device, dtype=torch.float32)
    else:
        mask = mask_bits.to(torch.float32)
    del mask_bits

    inputs: dict[str, torch.Tensor] = {"x": x, "mask": mask}
    inputs["norm.weight"] = torch.randn((d,), **f32)
    inputs["norm.bias"] = torch.randn((d,), **f32)
    for name in ("left_proj", "right_proj", "left_gate", "right_gate", "out_gate"):
        inputs[f"{name}.weight"] = torch.randn((h, d), **f32) / math.sqrt(h)
    inputs["to_out_norm.weight"] = torch.randn((h,), **f32)
    inputs["to_out_norm.bias"] = torch.randn((h,), **f32)
    inputs["to_out.weight"] = torch.randn((d, h), **f32) / math.sqrt(d)
    return inputs


def pack_data(inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor], dict]:
    """The GPUMode `data` tuple: (x, mask, weights, config)."""
    weights = {name: inputs[name] for name in WEIGHT_NAMES}
    config = {"dim": int(inputs["x"].shape[-1]), "hidden_dim": int(inputs["left_proj.weight"].shape[0])}
    return inputs["x"], inputs["mask"], weights, config


@contextmanager
def _tf32_disabled() -> Iterator[None]:
    # The tolerance is set for true fp32; TF32 would put the reference itself ~1e-3 off.
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _gated(xn: torch.Tensor, proj: torch.Tensor, gate: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(xn·projᵀ) ⊙ mask ⊙ σ(xn·gateᵀ), returned as [B, H, N, N] so H is a batch axis."""
    out = torch.matmul(xn, proj.t())
    out.mul_(mask.unsqueeze(-1))
    out.mul_(torch.sigmoid(torch.matmul(xn, gate.t())))
    return out.permute(0, 3, 1, 2).contiguous()


@torch.no_grad()
def reference(inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    x, mask, w, _config = pack_data(inputs)
    d = x.shape[-1]
    h = w["to_out_norm.weight"].shape[0]
    mask = mask.to(torch.float32)
    with _tf32_disabled():
        xn = torch.nn.functional.layer_norm(x, (d,), w["norm.weight"], w["norm.bias"], EPS)
        left = _gated(xn, w["left_proj.weight"], w["left_gate.weight"], mask)  # [B,H,N(i),N(k)]
        right = _gated(xn, w["right_proj.weight"], w["right_gate.weight"], mask)  # [B,H,N(j),N(k)]
        gate = torch.sigmoid(torch.matmul(xn, w["out_gate.weight"].t()))  # [B,N,N,H]
        del xn  # the largest intermediate; free it before the contraction allocates more

        # O[b,i,j,h] = sum_k left[b,i,k,h] * right[b,j,k,h], as a matmul batched over (b, h).
        out = torch.matmul(left, right.transpose(-1, -2))
        del left, right
        out = out.permute(0, 2, 3, 1)  # [B,N,N,H], a view; layer_norm makes it contiguous
        out = torch.nn.functional.layer_norm(out, (h,), w["to_out_norm.weight"], w["to_out_norm.bias"], EPS)
        out.mul_(gate)
        del gate
        return torch.matmul(out, w["to_out.weight"].t())
