"""Trusted reference for moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e32_h7168_i2048.

DeepSeek-V3 MoE on one expert-parallel rank: route every token to 8 of 256 experts (grouped
top-k with a selection bias), then run the rank's 32 local experts (an FP8 block-scaled gated
MLP each) and sum their outputs weighted by the routing weights. Sizes are read from the tensor
shapes, so the reduced CPU workloads (hidden 512, intermediate 256) use the same code; only the
routing constants (8 groups, top 4 groups, top 8 experts) and the 128-wide scale blocks are fixed.

Loaded by path by the framework; inputs come from the shared FlashInfer synthesizer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from ksearch_ray.taskspec.flashinfer_inputs import synthesize

DEFINITION = json.loads(Path(__file__).with_name("definition.json").read_text())
N_GROUP = 8
TOPK_GROUP = 4
TOP_K = 8
BLOCK = 128


def generate_inputs(workload: Any, seed: int, device: str, options: frozenset[str] = frozenset()) -> dict[str, Any]:
    return synthesize(DEFINITION, workload, seed, device, options)


def route(logits: torch.Tensor, bias: torch.Tensor, scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Global expert ids [T, 8] and their weights [T, 8] (fp32), DeepSeek-V3's no-aux-loss routing."""
    tokens, experts = logits.shape
    scores = torch.sigmoid(logits.float())
    biased = scores + bias.float()  # the bias only steers selection, never the weights
    grouped = biased.view(tokens, N_GROUP, experts // N_GROUP)
    group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)  # [T, 8]: sum of each group's top two
    top_groups = group_scores.topk(TOPK_GROUP, dim=-1).indices
    keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, top_groups, True)
    keep = keep.repeat_interleave(experts // N_GROUP, dim=1)
    ids = biased.masked_fill(~keep, float("-inf")).topk(TOP_K, dim=-1).indices
    chosen = scores.gather(1, ids)
    weights = chosen / (chosen.sum(dim=-1, keepdim=True) + 1e-20) * scaling
    return ids, weights


def dequantize(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """fp32 values of an [..., R, C] fp8 tensor with one scale per 128 x 128 block ([..., R/128, C/128])."""
    expanded = scales.repeat_interleave(BLOCK, dim=-2).repeat_interleave(BLOCK, dim=-1)
    return codes.float() * expanded


@torch.no_grad()
def reference(inputs: dict[str, Any]) -> torch.Tensor:
    hidden, hidden_scale = inputs["hidden_states"], inputs["hidden_states_scale"]
    w13, w13_scale = inputs["gemm1_weights"], inputs["gemm1_weights_scale"]
    w2, w2_scale = inputs["gemm2_weights"], inputs["gemm2_weights_scale"]
    offset = int(inputs["local_expert_offset"])
    tokens, hidden_size = hidden.shape
    local_experts = w13.shape[0]
    intermediate = w2.shape[2]

    ids, weights = route(inputs["routing_logits"], inputs["routing_bias"], float(inputs["routed_scaling_factor"]))
    # A[t, k] = a[t, k] * s[k // 128, t]: the activation scales are stored transposed.
    activations = hidden.float() * hidden_scale.t().repeat_interleave(BLOCK, dim=1)
    output = torch.zeros((tokens, hidden_size), dtype=torch.float32, device=hidden.device)
    for e in range(local_experts):
        hit = ids == offset + e  # [T, 8]; a token picks an expert at most once
        rows = hit.any(dim=1).nonzero().squeeze(1)
        if rows.numel() == 0:
            continue
        gate_up = activations[rows] @ dequantize(w13[e], w13_scale[e]).t()  # [Tk, 2I]
        inner = torch.nn.functional.silu(gate_up[:, intermediate:]) * gate_up[:, :intermediate]
        expert_out = inner @ dequantize(w2[e], w2_scale[e]).t()  # [Tk, H]
        weight = (weights * hit).sum(dim=1)[rows]
        output.index_add_(0, rows, expert_out * weight[:, None])
    return output.to(torch.bfloat16)
