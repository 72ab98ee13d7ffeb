"""TriMul in plain PyTorch, written as a GPUMode submission: it imports its type names from `task`."""

import torch
from task import input_t, output_t



def _gated(xn, proj, gate, mask):
    out = torch.matmul(xn, proj.t()) * mask.unsqueeze(-1) * torch.sigmoid(torch.matmul(xn, gate.t()))
    return out.permute(0, 3, 1, 2)


@torch.no_grad()
def custom_kernel(data: input_t) -> output_t:
    x, mask, w, config = data
    d, h = config["dim"], config["hidden_dim"]
    xn = torch.nn.functional.layer_norm(x, (d,), w["norm.weight"], w["norm.bias"], 1e-5)
    left = _gated(xn, w["left_proj.weight"], w["left_gate.weight"], mask)
    right = _gated(xn, w["right_proj.weight"], w["right_gate.weight"], mask)
    gate = torch.sigmoid(torch.matmul(xn, w["out_gate.weight"].t()))
    out = torch.matmul(left, right.transpose(-1, -2)).permute(0, 2, 3, 1)
    out = torch.nn.functional.layer_norm(out, (h,), w["to_out_norm.weight"], w["to_out_norm.bias"], 1e-5) * gate
    return torch.matmul(out, w["to_out.weight"].t())
