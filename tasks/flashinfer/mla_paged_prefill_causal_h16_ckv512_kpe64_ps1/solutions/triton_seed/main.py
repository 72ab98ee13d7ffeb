"""Causal MLA paged prefill (16 heads, ckv 512, kpe 64, page size 1) in one Triton kernel.

A program owns BLOCK_Q consecutive query rows of one request times all 16 heads (the rows of its
tiles are (query, head) pairs: every head shares the one latent KV row per token). It walks the
request's page list up to the last position its queries may see, loads each [BLOCK_N, 512] ckv
tile once for both Q·Kᵀ and P·V, and masks per row with the bottom-right causal rule: with
prefix = kv_len - q_len, query i sees KV positions 0 .. prefix + i. There is one program per
query token, and only those at a multiple of BLOCK_Q within their request do work, so the grid
needs no host-side block table (no sync). No split over the sequence.

The tunables below are read and rewritten by the offline policy; every choice passes the task's
tolerance on its own.
"""

import torch
import triton
import triton.language as tl

# Query tokens per program: tiles have BLOCK_Q * 16 rows, so the fp32 accumulator is
# BLOCK_Q * 16 x 512 (32 KiB at BLOCK_Q = 1, which is where registers are comfortable).
BLOCK_Q = 1  # tunable: [1, 2, 4]
# Tokens per step. Shared memory at BLOCK_N = 32, two stages: the bf16 ckv tile (32 KiB) per
# stage, its fp32 copy for a tf32 P·V (64 KiB) and the queries (18 KiB per query token).
BLOCK_N = 32  # tunable: [16, 32]
NUM_WARPS = 4  # tunable: [4, 8]
NUM_STAGES = 2  # tunable: [1, 2]
# Operands of P·V (fp32 accumulation always): "fp16" rounds P to fp16 and converts V (exact for
# bf16 values between 6e-5 and 65504 in magnitude; full-rate tensor cores), "tf32" keeps P to 10
# mantissa bits, "ieee" is exact fp32. bf16 P is not offered: its 8-bit mantissa puts a few in
# 100k output elements past the tolerance (measured on the CPU with Hopper's rounding emulated).
PV_PRECISION = "fp16"  # tunable: ["fp16", "tf32", "ieee"]

LOG2E = 1.4426950408889634


@triton.jit
def _tf32_truncate(x):
    # Hopper's tf32 tensor cores read only the top 19 bits of an fp32 operand.
    return (x.to(tl.uint32, bitcast=True) & 0xFFFFE000).to(tl.float32, bitcast=True)


@triton.jit
def _pv_dot(p, v, PRECISION: tl.constexpr, INTERPRET: tl.constexpr):
    """P·V with fp32 accumulation. In the interpreter (which multiplies 16-bit tiles as raw
    integers) operands are rounded the way the GPU would round them, then multiplied in fp32."""
    if PRECISION == "fp16":
        if INTERPRET:
            pv = tl.dot(p.to(tl.float16).to(tl.float32), v.to(tl.float16).to(tl.float32))
        else:
            pv = tl.dot(p.to(tl.float16), v.to(tl.float16))
    elif PRECISION == "tf32":
        if INTERPRET:
            pv = tl.dot(_tf32_truncate(p), v.to(tl.float32))
        else:
            pv = tl.dot(p, v.to(tl.float32), input_precision="tf32")
    else:
        pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
    return pv


@triton.jit
def _mla_prefill_kernel(
    qn_ptr, qp_ptr, ckv_ptr, kpe_ptr, qo_indptr_ptr, kv_indptr_ptr, indices_ptr, tok_req_ptr,
    out_ptr, lse_ptr, qk_scale, num_heads,
    stride_qnt, stride_qnh, stride_qpt, stride_qph, stride_ckv, stride_kpe, stride_ot, stride_oh, stride_lt,
    DIM_CKV: tl.constexpr, DIM_KPE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_Q: tl.constexpr,
    BLOCK_N: tl.constexpr, PV_PRECISION: tl.constexpr, INTERPRET: tl.constexpr,
):
    t = tl.program_id(0)
    req = tl.load(tok_req_ptr + t)
    q_start = tl.load(qo_indptr_ptr + req)
    i0 = t - q_start  # this token's row within its request
    if i0 % BLOCK_Q != 0:
        return  # a token inside another program's block
    q_len = tl.load(qo_indptr_ptr + req + 1) - q_start
    kv_start = tl.load(kv_indptr_ptr + req)
    kv_len = tl.load(kv_indptr_ptr + req + 1) - kv_start
    prefix = kv_len - q_len

    rows = tl.arange(0, BLOCK_Q * BLOCK_H)
    qi = i0 + rows // BLOCK_H  # query row within the request
    heads = tl.program_id(1) * BLOCK_H + rows % BLOCK_H
    row_ok = (qi < q_len) & (heads < num_heads)
    visible = prefix + qi + 1  # KV positions this row may see
    n_end = tl.minimum(prefix + tl.minimum(i0 + BLOCK_Q, q_len), kv_len)  # the block's last row sees most

    tok = (q_start + qi).to(tl.int64)
    offs_c = tl.arange(0, DIM_CKV)
    offs_p = tl.arange(0, DIM_KPE)
    offs_n = tl.arange(0, BLOCK_N)
    qn = tl.load(qn_ptr + tok[:, None] * stride_qnt + heads[:, None] * stride_qnh + offs_c[None, :],
                 mask=row_ok[:, None], other=0.0)
    qp = tl.load(qp_ptr + tok[:, None] * stride_qpt + heads[:, None] * stride_qph + offs_p[None, :],
                 mask=row_ok[:, None], other=0.0)
    if INTERPRET:
        # Triton's interpreter multiplies bf16 tiles as raw integers; fp32 products of bf16
        # values are exact, so upcasting is the same arithmetic.
        qn = qn.to(tl.float32)
        qp = qp.to(tl.float32)

    m_i = tl.full([BLOCK_Q * BLOCK_H], float("-inf"), tl.float32)  # running max, log2 units
    l_i = tl.zeros([BLOCK_Q * BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_Q * BLOCK_H, DIM_CKV], tl.float32)
    for n0 in range(0, n_end, BLOCK_N):
        pos = n0 + offs_n
        ok = pos < n_end
        page = tl.load(indices_ptr + kv_start + pos, mask=ok, other=0).to(tl.int64)
        kc = tl.load(ckv_ptr + page[:, None] * stride_ckv + offs_c[None, :], mask=ok[:, None], other=0.0)
        kp = tl.load(kpe_ptr + page[:, None] * stride_kpe + offs_p[None, :], mask=ok[:, None], other=0.0)
        if INTERPRET:
            kc = kc.to(tl.float32)
            kp = kp.to(tl.float32)
        s = (tl.dot(qn, tl.trans(kc)) + tl.dot(qp, tl.trans(kp))) * qk_scale
        s = tl.where(pos[None, :] < visible[:, None], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        # A row that has seen nothing yet keeps m = -inf; subtracting 0 instead keeps it NaN-free.
        m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_sub)
        p = tl.exp2(s - m_sub[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + _pv_dot(p, kc, PV_PRECISION, INTERPRET)
        m_i = m_new

    seen = l_i > 0
    l_safe = tl.where(seen, l_i, 1.0)
    out = acc / l_safe[:, None]
    lse = tl.where(seen, m_i + tl.log2(l_safe), float("-inf"))
    tl.store(out_ptr + tok[:, None] * stride_ot + heads[:, None] * stride_oh + offs_c[None, :], out.to(tl.bfloat16),
             mask=row_ok[:, None])
    tl.store(lse_ptr + tok * stride_lt + heads, lse, mask=row_ok)


@torch.no_grad()
def run(q_nope, q_pe, ckv_cache, kpe_cache, qo_indptr, kv_indptr, kv_indices, sm_scale):
    total_q, num_heads, dim_ckv = q_nope.shape
    dim_kpe = q_pe.shape[-1]
    q_nope, q_pe = q_nope.contiguous(), q_pe.contiguous()
    ckv = ckv_cache.reshape(-1, dim_ckv).contiguous()  # page size 1: a page is a token
    kpe = kpe_cache.reshape(-1, dim_kpe).contiguous()
    out = torch.empty_like(q_nope)
    lse = torch.empty((total_q, num_heads), dtype=torch.float32, device=q_nope.device)
    if total_q == 0:
        return out, lse
    # The request of every query token, on the device (requests with no queries own no token).
    tokens = torch.arange(total_q, dtype=qo_indptr.dtype, device=q_nope.device)
    tok_req = torch.searchsorted(qo_indptr[1:].contiguous(), tokens, right=True).to(torch.int32)
    block_h = 16  # the smallest row count tl.dot takes; 16 is also this definition's head count
    _mla_prefill_kernel[(total_q, triton.cdiv(num_heads, block_h))](
        q_nope, q_pe, ckv, kpe, qo_indptr, kv_indptr, kv_indices, tok_req, out, lse,
        float(sm_scale) * LOG2E, num_heads,
        q_nope.stride(0), q_nope.stride(1), q_pe.stride(0), q_pe.stride(1), ckv.stride(0), kpe.stride(0),
        out.stride(0), out.stride(1), lse.stride(0),
        DIM_CKV=dim_ckv, DIM_KPE=dim_kpe, BLOCK_H=block_h, BLOCK_Q=BLOCK_Q, BLOCK_N=BLOCK_N,
        PV_PRECISION=PV_PRECISION, INTERPRET=q_nope.device.type == "cpu",  # CPU tensors mean the interpreter
        num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )
    return out, lse
