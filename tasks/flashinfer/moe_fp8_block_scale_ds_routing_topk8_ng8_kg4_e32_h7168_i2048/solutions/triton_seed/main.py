"""DeepSeek-V3 FP8 block-scale MoE: torch routing and token grouping, two Triton grouped GEMMs.

1. torch: DeepSeek-V3 routing (sigmoid, bias for selection, top-2 sum per group, top-4 groups,
   top-8 experts, weights renormalized without the bias); keep the (token, expert) pairs whose
   expert is local and sort them by expert; cut each expert's rows into BLOCK_M-row tiles.
2. _gemm1_swiglu_kernel: per tile, G = A · W13[e]ᵀ for a BLOCK_N slice of the up half and the
   same slice of the gate half, dequantizing in the K loop (fp8 codes times one activation scale
   per row and one weight scale per column, per 128-wide K block) and accumulating in fp32;
   writes C = silu(gate) · up.
3. _gemm2_kernel: per tile, O = C · W2[e]ᵀ, dequantized the same way, times the routing weight.
4. torch: index_add the weighted rows into the token outputs; cast to bf16.

The tunables below are read and rewritten by the offline policy; every choice passes the task's
tolerance on its own.
"""

import torch
import triton
import triton.language as tl

N_GROUP = 8
TOPK_GROUP = 4
TOP_K = 8
QBLOCK = 128  # scale-block width of the fp8 tensors

# Pair rows per tile, output columns per program, and K per step. BLOCK_K divides 128, so a K
# step never straddles two scale blocks. Shared memory per stage at the largest choices
# (64 x 128 activation tile, two 128 x 128 weight tiles, fp8) is 40 KiB.
BLOCK_M = 32  # tunable: [16, 32, 64]
BLOCK_N = 64  # tunable: [32, 64, 128]
BLOCK_K = 128  # tunable: [32, 64, 128]
NUM_WARPS = 4  # tunable: [4, 8]
NUM_STAGES = 3  # tunable: [2, 3]
# Operands of GEMM1's tl.dot: "fp8" multiplies the e4m3 codes on fp8 tensor cores (exact
# products, fp32 accumulation); "bf16" upcasts them first (also exact, half the rate).
GEMM1_OPERANDS = "fp8"  # tunable: ["fp8", "bf16"]
# Storage of C = silu(gate)·up between the GEMMs and operand type of GEMM2: "fp32" is exact;
# "bf16" halves C's traffic and runs GEMM2 on bf16 tensor cores. With the default inputs both
# pass; under the realistic-moe option (outputs ~1e5, so only the relative term counts) bf16
# rounding of C leaves about 7% of elements outside tolerance, more than the 5% allowed.
INTERMEDIATE = "fp32"  # tunable: ["fp32", "bf16"]
# GEMM2's arithmetic on the fp32 intermediate: "ieee" is exact fp32 on CUDA cores; "tf32" runs on
# tensor cores, which read C to 10 mantissa bits (the fp8 weights are exact in tf32), finer than
# the bf16 intermediate that fails the realistic-moe option. (With INTERMEDIATE = "bf16" GEMM2 is
# a bf16 product whatever this says.)
GEMM2_PRECISION = "ieee"  # tunable: ["ieee", "tf32"]


@triton.jit
def _gemm1_swiglu_kernel(
    a_ptr, a_scale_ptr, w_ptr, w_scale_ptr, c_ptr, tile_expert_ptr, tile_row_ptr, expert_end_ptr, pair_token_ptr,
    num_tokens, hidden, inter,
    stride_we, stride_wn, stride_se, stride_sn, stride_c,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, QBLOCK: tl.constexpr,
    FP8_DOT: tl.constexpr, C_BF16: tl.constexpr, INTERPRET: tl.constexpr,
):
    tile = tl.program_id(0)
    e = tl.load(tile_expert_ptr + tile).to(tl.int64)
    row0 = tl.load(tile_row_ptr + tile)
    row_end = tl.load(expert_end_ptr + e)
    rows = row0 + tl.arange(0, BLOCK_M)
    row_ok = rows < row_end
    tok = tl.load(pair_token_ptr + rows, mask=row_ok, other=0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # within the up half; gate = inter + cols
    col_ok = cols < inter
    offs_k = tl.arange(0, BLOCK_K)

    w_up = w_ptr + e * stride_we + cols[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
    w_gate = w_up + inter * stride_wn
    s_up = w_scale_ptr + e * stride_se + (cols // QBLOCK) * stride_sn
    s_gate = w_scale_ptr + e * stride_se + ((inter + cols) // QBLOCK) * stride_sn
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, hidden, BLOCK_K):
        k_ok = (k0 + offs_k) < hidden
        a = tl.load(a_ptr + tok[:, None] * hidden + k0 + offs_k[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        wu = tl.load(w_up + k0, mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        wg = tl.load(w_gate + k0, mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        kb = k0 // QBLOCK
        a_scale = tl.load(a_scale_ptr + kb * num_tokens + tok, mask=row_ok, other=0.0)  # scales are [H/128, T]
        up_scale = tl.load(s_up + kb, mask=col_ok, other=0.0)
        gate_scale = tl.load(s_gate + kb, mask=col_ok, other=0.0)
        if INTERPRET:
            # The interpreter has no fp8 or bf16 tensor cores; fp32 products of fp8 codes are exact.
            a = a.to(tl.float32)
            wu = wu.to(tl.float32)
            wg = wg.to(tl.float32)
        elif not FP8_DOT:
            a = a.to(tl.bfloat16)
            wu = wu.to(tl.bfloat16)
            wg = wg.to(tl.bfloat16)
        part_up = tl.dot(a, tl.trans(wu))
        part_gate = tl.dot(a, tl.trans(wg))
        acc_up += part_up * a_scale[:, None] * up_scale[None, :]
        acc_gate += part_gate * a_scale[:, None] * gate_scale[None, :]

    c = acc_gate * tl.sigmoid(acc_gate) * acc_up  # silu(second half) times first half
    if C_BF16:
        c = c.to(tl.bfloat16)
    tl.store(c_ptr + rows[:, None].to(tl.int64) * stride_c + cols[None, :], c, mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _gemm2_kernel(
    c_ptr, w_ptr, w_scale_ptr, out_ptr, pair_weight_ptr, tile_expert_ptr, tile_row_ptr, expert_end_ptr,
    hidden, inter,
    stride_c, stride_we, stride_wn, stride_se, stride_sn, stride_o,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, QBLOCK: tl.constexpr,
    C_BF16: tl.constexpr, C_TF32: tl.constexpr, INTERPRET: tl.constexpr,
):
    tile = tl.program_id(0)
    e = tl.load(tile_expert_ptr + tile).to(tl.int64)
    row0 = tl.load(tile_row_ptr + tile)
    row_end = tl.load(expert_end_ptr + e)
    rows = row0 + tl.arange(0, BLOCK_M)
    row_ok = rows < row_end
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # output hidden columns
    col_ok = cols < hidden
    offs_k = tl.arange(0, BLOCK_K)

    w_base = w_ptr + e * stride_we + cols[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
    s_base = w_scale_ptr + e * stride_se + (cols // QBLOCK) * stride_sn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, inter, BLOCK_K):
        k_ok = (k0 + offs_k) < inter
        c = tl.load(c_ptr + rows[:, None].to(tl.int64) * stride_c + k0 + offs_k[None, :],
                    mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_base + k0, mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        w_scale = tl.load(s_base + k0 // QBLOCK, mask=col_ok, other=0.0)
        if INTERPRET:
            c = c.to(tl.float32)
            if C_TF32 and not C_BF16:  # Hopper's tf32 tensor cores read only the top 19 bits of C
                c = (c.to(tl.uint32, bitcast=True) & 0xFFFFE000).to(tl.float32, bitcast=True)
            part = tl.dot(c, tl.trans(w.to(tl.float32)))
        elif C_BF16:
            part = tl.dot(c, tl.trans(w.to(tl.bfloat16)))
        else:
            part = tl.dot(c, tl.trans(w.to(tl.float32)), input_precision="tf32" if C_TF32 else "ieee")
        acc += part * w_scale[None, :]

    weight = tl.load(pair_weight_ptr + rows, mask=row_ok, other=0.0)
    acc = acc * weight[:, None]
    tl.store(out_ptr + rows[:, None].to(tl.int64) * stride_o + cols[None, :], acc,
             mask=row_ok[:, None] & col_ok[None, :])


def _route(logits, bias, scaling):
    """Global expert ids [T, 8] and fp32 weights [T, 8]."""
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


def _tiles(pair_expert, num_experts, block_m):
    """Expert-sorted order of the pairs, each expert's end row, and the (expert, first row) of every tile."""
    order = torch.argsort(pair_expert, stable=True)
    counts = torch.bincount(pair_expert, minlength=num_experts)
    ends = torch.cumsum(counts, 0)
    tiles_per_expert = (counts + block_m - 1) // block_m
    tile_expert = torch.repeat_interleave(torch.arange(num_experts, device=pair_expert.device), tiles_per_expert)
    first_tile = torch.cumsum(tiles_per_expert, 0) - tiles_per_expert
    within = torch.arange(tile_expert.numel(), device=pair_expert.device) - first_tile[tile_expert]
    tile_row = (ends - counts)[tile_expert] + within * block_m
    return order, ends.to(torch.int32), tile_expert.to(torch.int32), tile_row.to(torch.int32)


@torch.no_grad()
def run(routing_logits, routing_bias, hidden_states, hidden_states_scale, gemm1_weights, gemm1_weights_scale,
        gemm2_weights, gemm2_weights_scale, local_expert_offset, routed_scaling_factor):
    device = hidden_states.device
    tokens, hidden = hidden_states.shape
    local_experts, _, _ = gemm1_weights.shape
    inter = gemm2_weights.shape[2]
    interpret = device.type == "cpu"  # CPU tensors mean Triton's interpreter

    ids, weights = _route(routing_logits, routing_bias, float(routed_scaling_factor))
    local = ids - int(local_expert_offset)
    is_local = (local >= 0) & (local < local_experts)
    pair_token = torch.arange(tokens, device=device)[:, None].expand(-1, TOP_K)[is_local]
    pair_expert = local[is_local]
    pair_weight = weights[is_local]
    out = torch.zeros((tokens, hidden), dtype=torch.float32, device=device)
    if pair_expert.numel() == 0:
        return out.to(torch.bfloat16)  # no token chose a local expert
    order, expert_end, tile_expert, tile_row = _tiles(pair_expert, local_experts, BLOCK_M)
    pair_token = pair_token[order].to(torch.int32).contiguous()
    pair_weight = pair_weight[order].contiguous()
    num_pairs, num_tiles = pair_token.numel(), tile_expert.numel()

    a, a_scale = hidden_states.contiguous(), hidden_states_scale.contiguous()
    w13, s13 = gemm1_weights.contiguous(), gemm1_weights_scale.contiguous()
    w2, s2 = gemm2_weights.contiguous(), gemm2_weights_scale.contiguous()
    c_bf16 = INTERMEDIATE == "bf16"
    inner = torch.empty((num_pairs, inter), dtype=torch.bfloat16 if c_bf16 else torch.float32, device=device)
    _gemm1_swiglu_kernel[(num_tiles, triton.cdiv(inter, BLOCK_N))](
        a, a_scale, w13, s13, inner, tile_expert, tile_row, expert_end, pair_token,
        tokens, hidden, inter,
        w13.stride(0), w13.stride(1), s13.stride(0), s13.stride(1), inner.stride(0),
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, QBLOCK=QBLOCK,
        FP8_DOT=GEMM1_OPERANDS == "fp8", C_BF16=c_bf16, INTERPRET=interpret,
        num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )
    pair_out = torch.empty((num_pairs, hidden), dtype=torch.float32, device=device)
    _gemm2_kernel[(num_tiles, triton.cdiv(hidden, BLOCK_N))](
        inner, w2, s2, pair_out, pair_weight, tile_expert, tile_row, expert_end,
        hidden, inter,
        inner.stride(0), w2.stride(0), w2.stride(1), s2.stride(0), s2.stride(1), pair_out.stride(0),
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, QBLOCK=QBLOCK,
        C_BF16=c_bf16, C_TF32=GEMM2_PRECISION == "tf32", INTERPRET=interpret,
        num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )
    out.index_add_(0, pair_token.long(), pair_out)
    return out.to(torch.bfloat16)
