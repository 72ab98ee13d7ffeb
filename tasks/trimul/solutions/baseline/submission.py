"""TriMul baseline: the reference math in plain PyTorch fp32, in GPUMode's submission format.

Scores are measured against this. It mirrors the task's reference.py but stands alone, since a
candidate ships only its own files.
"""

from collections.abc import Iterator
from contextlib import contextmanager

import torch

EPS = 1e-5


@contextmanager
def _tf32_disabled() -> Iterator[None]:
    # Plain fp32, like the reference: TF32 would make this baseline faster than the math it stands for.
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _gated(xn, proj, gate, mask):
    """(xn·projᵀ) ⊙ mask ⊙ σ(xn·gateᵀ), returned as [B, H, N, N] so H is a batch axis."""
    out = torch.matmul(xn, proj.t())
    out.mul_(mask.unsqueeze(-1))
    out.mul_(torch.sigmoid(torch.matmul(xn, gate.t())))
    return out.permute(0, 3, 1, 2).contiguous()


@torch.no_grad()
def custom_kernel(data):
    x, mask, w, config = data
    d, h = config["dim"], config["hidden_dim"]
    mask = mask.to(torch.float32)
    with _tf32_disabled():
        xn = torch.nn.functional.layer_norm(x, (d,), w["norm.weight"], w["norm.bias"], EPS)
        left = _gated(xn, w["left_proj.weight"], w["left_gate.weight"], mask)
        right = _gated(xn, w["right_proj.weight"], w["right_gate.weight"], mask)
        gate = torch.sigmoid(torch.matmul(xn, w["out_gate.weight"].t()))
        del xn

        # O[b,i,j,h] = sum_k left[b,i,k,h] * right[b,j,k,h], batched over (b, h).
        out = torch.matmul(left, right.transpose(-1, -2))
        del left, right
        out = out.permute(0, 2, 3, 1)
        out = torch.nn.functional.layer_norm(out, (h,), w["to_out_norm.weight"], w["to_out_norm.bias"], EPS)
        out.mul_(gate)
        del gate
        return torch.matmul(out, w["to_out.weight"].t())
