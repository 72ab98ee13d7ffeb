"""DeepSeek-V3 FP8 block-scale MoE, the reference math as a candidate: torch routing, then for each
local expert a dequantized fp32 gated MLP over its tokens.

Scores are measured against this. It mirrors the task's reference.py but stands alone, since a
candidate ships only its own files.
"""

import torch

N_GROUP = 8
TOPK_GROUP = 4
TOP_K = 8
BLOCK = 128


def _route(logits, bias, scaling):
    tokens, experts = logits.shape
    scores = torch.sigmoid(logits.float())
    biased = scores + bias.float()
    group_scores = biased.view(tokens, N_GROUP, experts // N_GROUP).topk(2, dim=-1).values.sum(dim=-1)
    top_groups = group_scores.topk(TOPK_GROUP, dim=-1).indices
    keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, top_groups, True)
    keep = keep.repeat_interleave(experts // N_GROUP, dim=1)
    ids = biased.masked_fill(~keep, float("-inf")).topk(TOP_K, dim=-1).indices
    chosen = scores.gather(1, ids)
    return ids, chosen / (chosen.sum(dim=-1, keepdim=True) + 1e-20) * scaling


def _dequantize(codes, scales):
    return codes.float() * scales.repeat_interleave(BLOCK, dim=-2).repeat_interleave(BLOCK, dim=-1)


@torch.no_grad()
def run(routing_logits, routing_bias, hidden_states, hidden_states_scale, gemm1_weights, gemm1_weights_scale,
        gemm2_weights, gemm2_weights_scale, local_expert_offset, routed_scaling_factor):
    tokens, hidden_size = hidden_states.shape
    intermediate = gemm2_weights.shape[2]
    offset = int(local_expert_offset)
    ids, weights = _route(routing_logits, routing_bias, float(routed_scaling_factor))
    activations = hidden_states.float() * hidden_states_scale.t().repeat_interleave(BLOCK, dim=1)
    output = torch.zeros((tokens, hidden_size), dtype=torch.float32, device=hidden_states.device)
    for e in range(gemm1_weights.shape[0]):
        hit = ids == offset + e
        rows = hit.any(dim=1).nonzero().squeeze(1)
        if rows.numel() == 0:
            continue
        gate_up = activations[rows] @ _dequantize(gemm1_weights[e], gemm1_weights_scale[e]).t()
        inner = torch.nn.functional.silu(gate_up[:, intermediate:]) * gate_up[:, :intermediate]
        expert_out = inner @ _dequantize(gemm2_weights[e], gemm2_weights_scale[e]).t()
        output.index_add_(0, rows, expert_out * (weights * hit).sum(dim=1)[rows][:, None])
    return output.to(torch.bfloat16)
