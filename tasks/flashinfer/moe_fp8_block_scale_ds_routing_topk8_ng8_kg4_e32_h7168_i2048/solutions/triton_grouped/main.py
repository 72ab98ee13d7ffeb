"""DeepSeek-V3 FP8 block-scale MoE as two grouped GEMMs whose whole call is one CUDA graph.

No device-to-host copy and no shape that depends on the routing, so a captured graph is right for
every input of the same size:

1. torch, fixed sizes only: DeepSeek-V3 routing gives all T·8 (token, expert) pairs; a pair whose
   expert is on another rank gets the sentinel key E (one past the local experts), a stable sort
   by key puts the local pairs first, grouped by expert, and a searchsorted over the sorted keys
   gives each expert's first and last slot; each expert's BLOCK_M-row tiles are counted and
   prefix-summed into tile_indptr [E + 1].
2. _gemm1_swiglu_kernel: G = A · W13[e]ᵀ on fp8 tensor cores (e4m3 codes, fp32 accumulation),
   the activation scale of each row and the weight scale of each column applied per 128-wide K
   block, C = silu(gate) · up written in fp32 to the pair's slot.
3. _gemm2_kernel: O = C · W2[e]ᵀ (tf32 tensor cores by default), scaled the same way, times the
   routing weight, atomically added into the fp32 [T, H] output row of the pair's token.
4. torch: the fp32 output cast to bf16.

Both kernels launch an upper bound of programs computed from T alone (every expert's last tile may
be partial: at most min(T·8, ceil(T·8 / BLOCK_M) + E) tiles, times the column slices); each program
finds its (expert, column slice, tile) from tile_indptr, as the split-KV decode kernels find their
request from kv_indptr, and a program past the real work returns at once. An expert's programs are
contiguous and, within one column slice, its tiles are neighbours, so the tiles of one expert read
that slice of its weights while it is in L2 rather than from DRAM once each; an expert with no
tokens has no programs and its weights are never read.

The combine is an fp32 atomic add rather than per-pair rows reduced by index_add: per-pair rows
would need a [T·8, H] fp32 buffer at fixed size (3.2 GB at 14k tokens) where the output is 8x
smaller, and index_add on the GPU adds atomically anyway. The order of the at most 8 adds into an
element varies from call to call, which moves the fp32 sum by ~1e-7 relative, so the bf16 result
can differ by one bf16 unit (2^-8 relative, within the tolerance's 1e-2) from one call to the next.

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

# Pair rows per tile, output columns per program and K per step, for both GEMMs. BLOCK_K divides
# 128, so a K step never straddles two scale blocks, and BLOCK_N divides 128, so a program's
# columns share one weight-scale block row. At the largest choices a GEMM1 stage holds a 64 x 128
# activation tile and two 128 x 128 weight tiles in fp8 (40 KiB).
BLOCK_M = 64  # tunable: [16, 32, 64]
BLOCK_N = 64  # tunable: [32, 64, 128]
BLOCK_K = 128  # tunable: [64, 128]
NUM_WARPS = 4  # tunable: [4, 8]
NUM_STAGES = 3  # tunable: [2, 3]
# GEMM2's arithmetic on the fp32 intermediate C: "tf32" runs on tensor cores, which read C to 10
# mantissa bits (the fp8 weights are exact in tf32); that passes the realistic-moe option, where a
# bf16 C does not (about 7% of the elements fail). "ieee" is exact fp32 on CUDA cores, and slow.
GEMM2_PRECISION = "tf32"  # tunable: ["tf32", "ieee"]


@triton.jit
def _find_program(tile_indptr_ptr, slot_bounds_ptr, num_experts, num_slices,
                  BLOCK_M: tl.constexpr, BLOCK_E: tl.constexpr):
    """This program's expert (int64), column slice, rows and which of them are the expert's; the
    expert is num_experts past the real work.

    Expert e owns programs tile_indptr[e]·S .. tile_indptr[e + 1]·S (S column slices); within
    them the slice is the major index and the tile the minor one."""
    pid = tl.program_id(0)
    offs_e = tl.arange(0, BLOCK_E)
    e_ok = offs_e < num_experts
    tile_end = tl.load(tile_indptr_ptr + 1 + offs_e, mask=e_ok, other=0)
    e = tl.sum(((tile_end * num_slices <= pid) & e_ok).to(tl.int32))  # experts whose programs all come before
    e_safe = tl.minimum(e, num_experts - 1)
    first_tile = tl.load(tile_indptr_ptr + e_safe)
    tiles = tl.maximum(tl.load(tile_indptr_ptr + e_safe + 1) - first_tile, 1)
    local = pid - first_tile * num_slices
    col_slice = local // tiles
    row0 = tl.load(slot_bounds_ptr + e_safe) + (local % tiles) * BLOCK_M
    rows = row0 + tl.arange(0, BLOCK_M)
    return e.to(tl.int64), col_slice, rows, rows < tl.load(slot_bounds_ptr + e_safe + 1)


@triton.jit
def _gemm1_swiglu_kernel(
    a_ptr, a_scale_ptr, w_ptr, w_scale_ptr, c_ptr, tile_indptr_ptr, slot_bounds_ptr, slot_token_ptr,
    num_tokens, hidden, inter, num_experts, num_slices,
    stride_we, stride_wn, stride_se, stride_sn, stride_c,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, QBLOCK: tl.constexpr,
    BLOCK_E: tl.constexpr, INTERPRET: tl.constexpr,
):
    e, col_slice, rows, row_ok = _find_program(tile_indptr_ptr, slot_bounds_ptr, num_experts, num_slices,
                                               BLOCK_M, BLOCK_E)
    if e >= num_experts:
        return
    tok = tl.load(slot_token_ptr + rows, mask=row_ok, other=0).to(tl.int64)
    cols = col_slice * BLOCK_N + tl.arange(0, BLOCK_N)  # within the up half; gate = inter + cols
    col_ok = cols < inter
    offs_k = tl.arange(0, BLOCK_K)

    a_rows = a_ptr + tok[:, None] * hidden + offs_k[None, :]
    w_up = w_ptr + e * stride_we + cols[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
    w_gate = w_up + inter * stride_wn
    s_up = w_scale_ptr + e * stride_se + (cols // QBLOCK) * stride_sn
    s_gate = w_scale_ptr + e * stride_se + ((inter + cols) // QBLOCK) * stride_sn
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, hidden, BLOCK_K):
        a = tl.load(a_rows + k0, mask=row_ok[:, None], other=0.0)
        wu = tl.load(w_up + k0, mask=col_ok[:, None], other=0.0)
        wg = tl.load(w_gate + k0, mask=col_ok[:, None], other=0.0)
        kb = k0 // QBLOCK
        a_scale = tl.load(a_scale_ptr + kb * num_tokens + tok, mask=row_ok, other=0.0)  # scales are [H/128, T]
        up_scale = tl.load(s_up + kb, mask=col_ok, other=0.0)
        gate_scale = tl.load(s_gate + kb, mask=col_ok, other=0.0)
        if INTERPRET:  # no fp8 tensor cores in the interpreter; fp32 products of fp8 codes are exact
            a = a.to(tl.float32)
            wu = wu.to(tl.float32)
            wg = wg.to(tl.float32)
        acc_up += tl.dot(a, tl.trans(wu)) * a_scale[:, None] * up_scale[None, :]
        acc_gate += tl.dot(a, tl.trans(wg)) * a_scale[:, None] * gate_scale[None, :]

    c = acc_gate * tl.sigmoid(acc_gate) * acc_up  # silu(second half) times first half
    tl.store(c_ptr + rows[:, None].to(tl.int64) * stride_c + cols[None, :], c, mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _gemm2_kernel(
    c_ptr, w_ptr, w_scale_ptr, out_ptr, slot_weight_ptr, slot_token_ptr, tile_indptr_ptr, slot_bounds_ptr,
    hidden, inter, num_experts, num_slices,
    stride_c, stride_we, stride_wn, stride_se, stride_sn, stride_o,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, QBLOCK: tl.constexpr,
    BLOCK_E: tl.constexpr, TF32: tl.constexpr, INTERPRET: tl.constexpr,
):
    e, col_slice, rows, row_ok = _find_program(tile_indptr_ptr, slot_bounds_ptr, num_experts, num_slices,
                                               BLOCK_M, BLOCK_E)
    if e >= num_experts:
        return
    cols = col_slice * BLOCK_N + tl.arange(0, BLOCK_N)  # output hidden columns
    col_ok = cols < hidden
    offs_k = tl.arange(0, BLOCK_K)

    c_rows = c_ptr + rows[:, None].to(tl.int64) * stride_c + offs_k[None, :]
    w_base = w_ptr + e * stride_we + cols[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
    s_base = w_scale_ptr + e * stride_se + (cols // QBLOCK) * stride_sn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, inter, BLOCK_K):
        c = tl.load(c_rows + k0, mask=row_ok[:, None], other=0.0)
        w = tl.load(w_base + k0, mask=col_ok[:, None], other=0.0).to(tl.float32)
        w_scale = tl.load(s_base + k0 // QBLOCK, mask=col_ok, other=0.0)
        if INTERPRET:
            if TF32:  # Hopper's tf32 tensor cores read only the top 19 bits of C
                c = (c.to(tl.uint32, bitcast=True) & 0xFFFFE000).to(tl.float32, bitcast=True)
            part = tl.dot(c, tl.trans(w))
        else:
            part = tl.dot(c, tl.trans(w), input_precision="tf32" if TF32 else "ieee")
        acc += part * w_scale[None, :]

    weight = tl.load(slot_weight_ptr + rows, mask=row_ok, other=0.0)
    tok = tl.load(slot_token_ptr + rows, mask=row_ok, other=0).to(tl.int64)
    tl.atomic_add(out_ptr + tok[:, None] * stride_o + cols[None, :], acc * weight[:, None],
                  mask=row_ok[:, None] & col_ok[None, :], sem="relaxed")


def _route(logits, bias, scaling):
    """Global expert ids [T, 8] and fp32 weights [T, 8]."""
    tokens, experts = logits.shape
    scores = torch.sigmoid(logits.float())
    biased = scores + bias.float()  # the bias steers the choice only, never the weights
    group_scores = biased.view(tokens, N_GROUP, experts // N_GROUP).topk(2, dim=-1).values.sum(dim=-1)
    dropped = torch.ones_like(group_scores, dtype=torch.bool).scatter_(1, group_scores.topk(TOPK_GROUP, dim=-1).indices,
                                                                      False)
    ids = biased.masked_fill(dropped.repeat_interleave(experts // N_GROUP, dim=1), float("-inf")).topk(TOP_K, dim=-1).indices
    chosen = scores.gather(1, ids)
    return ids, chosen / (chosen.sum(dim=-1, keepdim=True) + 1e-20) * scaling


def _group(ids, weights, offset, local_experts, block_m):
    """Every pair's slot in expert order: the token and weight of each slot, each expert's first slot
    (and, at index E, the end of the local slots), and each expert's first tile ([E + 1])."""
    device = ids.device
    local = ids.flatten() - offset
    key = torch.where((local >= 0) & (local < local_experts), local, local_experts)  # E: on another rank
    sorted_key, order = torch.sort(key, stable=True)
    slot_bounds = torch.searchsorted(sorted_key, torch.arange(local_experts + 1, device=device))
    tiles = (slot_bounds[1:] - slot_bounds[:-1] + block_m - 1) // block_m
    tile_indptr = torch.zeros(local_experts + 1, dtype=torch.int64, device=device)
    tile_indptr[1:] = torch.cumsum(tiles, 0)
    slot_token = (order // TOP_K).to(torch.int32)
    return slot_token, weights.flatten()[order].contiguous(), slot_bounds.to(torch.int32), tile_indptr.to(torch.int32)


@torch.no_grad()
def run(routing_logits, routing_bias, hidden_states, hidden_states_scale, gemm1_weights, gemm1_weights_scale,
        gemm2_weights, gemm2_weights_scale, local_expert_offset, routed_scaling_factor):
    device = hidden_states.device
    tokens, hidden = hidden_states.shape
    local_experts = gemm1_weights.shape[0]
    inter = gemm2_weights.shape[2]
    interpret = device.type == "cpu"  # CPU tensors mean Triton's interpreter

    ids, weights = _route(routing_logits, routing_bias, float(routed_scaling_factor))
    slot_token, slot_weight, slot_bounds, tile_indptr = _group(ids, weights, int(local_expert_offset), local_experts,
                                                                BLOCK_M)
    pairs = tokens * TOP_K
    max_tiles = min(pairs, triton.cdiv(pairs, BLOCK_M) + local_experts)  # every expert's last tile may be partial
    block_e = triton.next_power_of_2(local_experts)

    a, a_scale = hidden_states.contiguous(), hidden_states_scale.contiguous()
    w13, s13 = gemm1_weights.contiguous(), gemm1_weights_scale.contiguous()
    w2, s2 = gemm2_weights.contiguous(), gemm2_weights_scale.contiguous()
    inner = torch.empty((pairs, inter), dtype=torch.float32, device=device)  # slot rows; only local ones are written
    slices1 = triton.cdiv(inter, BLOCK_N)
    _gemm1_swiglu_kernel[(max_tiles * slices1,)](
        a, a_scale, w13, s13, inner, tile_indptr, slot_bounds, slot_token,
        tokens, hidden, inter, local_experts, slices1,
        w13.stride(0), w13.stride(1), s13.stride(0), s13.stride(1), inner.stride(0),
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, QBLOCK=QBLOCK, BLOCK_E=block_e, INTERPRET=interpret,
        num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )
    out = torch.zeros((tokens, hidden), dtype=torch.float32, device=device)
    slices2 = triton.cdiv(hidden, BLOCK_N)
    _gemm2_kernel[(max_tiles * slices2,)](
        inner, w2, s2, out, slot_weight, slot_token, tile_indptr, slot_bounds,
        hidden, inter, local_experts, slices2,
        inner.stride(0), w2.stride(0), w2.stride(1), s2.stride(0), s2.stride(1), out.stride(0),
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, QBLOCK=QBLOCK, BLOCK_E=block_e,
        TF32=GEMM2_PRECISION == "tf32", INTERPRET=interpret,
        num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )
    return out.to(torch.bfloat16)
