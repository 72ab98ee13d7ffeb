"""DeepSeek-V3 FP8 block-scale MoE through the FlashInfer library's Hopper path: cutlass_fused_moe
with DeepSeek FP8 block scales (FlashInfer's trtllm_fp8_block_scale_moe, which also routes, runs
on Blackwell only).

A library baseline, not a search seed. cutlass_fused_moe takes bf16 activations (it quantizes
them per 1x128 block itself), fp8 weights with their [E, N/128, K/128] fp32 block scales, and the
routing as (expert ids, weights). So each call, all of it measured: DeepSeek-V3 routing in torch
ops; the fp8 hidden states dequantized to bf16 with their [H/128, T] scales; expert ids made
local (id - local_expert_offset; the library skips ids outside [0, 32)); then the fused MoE into a
zeroed output, so a token with no local expert gets zeros. Needs the optional `flashinfer` package
(flashinfer-python) and an SM90 GPU.

Not yet run on a GPU: FlashInfer's JIT build of this module (~249 compilation units) did not fit
the device time of the session that wrote it (docs/benchmarks.md). Until it has passed there,
treat this wrapper as unverified.
"""

import torch
from flashinfer.fused_moe import cutlass_fused_moe

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


@torch.no_grad()
def run(routing_logits, routing_bias, hidden_states, hidden_states_scale, gemm1_weights, gemm1_weights_scale,
        gemm2_weights, gemm2_weights_scale, local_expert_offset, routed_scaling_factor):
    tokens, hidden_size = hidden_states.shape
    ids, weights = _route(routing_logits, routing_bias, float(routed_scaling_factor))
    activations = (hidden_states.float() * hidden_states_scale.t().repeat_interleave(BLOCK, dim=1)).to(torch.bfloat16)
    output = torch.zeros((tokens, hidden_size), dtype=torch.bfloat16, device=hidden_states.device)
    cutlass_fused_moe(
        activations,
        (ids - int(local_expert_offset)).to(torch.int32),
        weights.float(),
        gemm1_weights,
        gemm2_weights,
        torch.bfloat16,
        [gemm1_weights_scale.float().contiguous(), gemm2_weights_scale.float().contiguous()],
        use_deepseek_fp8_block_scale=True,
        output=output,
    )
    return output
