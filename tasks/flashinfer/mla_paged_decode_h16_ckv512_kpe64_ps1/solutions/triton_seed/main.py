"""MLA paged decode (16 heads, ckv 512, kpe 64, page size 1) in one Triton kernel.

All heads share one latent KV row per token, so one program per request holds the 16 heads as
the rows of its tiles: each step loads a [BLOCK_N, 512] ckv tile and a [BLOCK_N, 64] kpe tile
once, uses the ckv tile both as keys (Q·Kᵀ) and as values (P·V), and updates an online softmax
in base 2. There is no split over the sequence: a batch of one runs on a single program, which
is the first thing a faster kernel would change.

The tunables below are read and rewritten by the offline policy; every choice passes the task's
tolerance on its own.
"""

import torch
import triton
import triton.language as tl

# Tokens per step. Shared memory per program at BLOCK_N = 32, two stages: the bf16 ckv tile
# (32 KiB) per stage, its fp32 copy for a tf32 P·V (64 KiB) and the query (18 KiB), about
# 150 KiB of Hopper's 227; BLOCK_N = 64 would double the first two and not fit.
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
def _mla_decode_kernel(
    qn_ptr, qp_ptr, ckv_ptr, kpe_ptr, indptr_ptr, indices_ptr, out_ptr, lse_ptr, qk_scale, num_heads,
    stride_qnb, stride_qnh, stride_qpb, stride_qph, stride_ckv, stride_kpe, stride_ob, stride_oh, stride_lb,
    DIM_CKV: tl.constexpr, DIM_KPE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    PV_PRECISION: tl.constexpr, INTERPRET: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    start = tl.load(indptr_ptr + b)
    end = tl.load(indptr_ptr + b + 1)

    offs_c = tl.arange(0, DIM_CKV)
    offs_p = tl.arange(0, DIM_KPE)
    offs_n = tl.arange(0, BLOCK_N)
    h_ok = heads < num_heads
    qn = tl.load(qn_ptr + b * stride_qnb + heads[:, None] * stride_qnh + offs_c[None, :], mask=h_ok[:, None], other=0.0)
    qp = tl.load(qp_ptr + b * stride_qpb + heads[:, None] * stride_qph + offs_p[None, :], mask=h_ok[:, None], other=0.0)
    if INTERPRET:
        # Triton's interpreter multiplies bf16 tiles as raw integers; fp32 products of bf16
        # values are exact, so upcasting is the same arithmetic.
        qn = qn.to(tl.float32)
        qp = qp.to(tl.float32)

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)  # running max, log2 units
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, DIM_CKV], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        pos = n0 + offs_n
        ok = pos < end
        page = tl.load(indices_ptr + pos, mask=ok, other=0).to(tl.int64)
        kc = tl.load(ckv_ptr + page[:, None] * stride_ckv + offs_c[None, :], mask=ok[:, None], other=0.0)
        kp = tl.load(kpe_ptr + page[:, None] * stride_kpe + offs_p[None, :], mask=ok[:, None], other=0.0)
        if INTERPRET:
            kc = kc.to(tl.float32)
            kp = kp.to(tl.float32)
        s = (tl.dot(qn, tl.trans(kc)) + tl.dot(qp, tl.trans(kp))) * qk_scale
        s = tl.where(ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + _pv_dot(p, kc, PV_PRECISION, INTERPRET)
        m_i = m_new

    # An empty request never enters the loop: output 0 and lse -inf.
    nonempty = l_i > 0
    l_safe = tl.where(nonempty, l_i, 1.0)
    out = acc / l_safe[:, None]
    lse = tl.where(nonempty, m_i + tl.log2(l_safe), float("-inf"))
    tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + offs_c[None, :], out.to(tl.bfloat16),
             mask=h_ok[:, None])
    tl.store(lse_ptr + b * stride_lb + heads, lse, mask=h_ok)


@torch.no_grad()
def run(q_nope, q_pe, ckv_cache, kpe_cache, kv_indptr, kv_indices, sm_scale):
    batch, num_heads, dim_ckv = q_nope.shape
    dim_kpe = q_pe.shape[-1]
    q_nope, q_pe = q_nope.contiguous(), q_pe.contiguous()
    ckv = ckv_cache.reshape(-1, dim_ckv).contiguous()  # page size 1: a page is a token
    kpe = kpe_cache.reshape(-1, dim_kpe).contiguous()
    out = torch.empty_like(q_nope)
    lse = torch.empty((batch, num_heads), dtype=torch.float32, device=q_nope.device)
    if batch == 0:
        return out, lse
    block_h = 16  # the smallest row count tl.dot takes; 16 is also this definition's head count
    _mla_decode_kernel[(batch, triton.cdiv(num_heads, block_h))](
        q_nope, q_pe, ckv, kpe, kv_indptr, kv_indices, out, lse, float(sm_scale) * LOG2E, num_heads,
        q_nope.stride(0), q_nope.stride(1), q_pe.stride(0), q_pe.stride(1), ckv.stride(0), kpe.stride(0),
        out.stride(0), out.stride(1), lse.stride(0),
        DIM_CKV=dim_ckv, DIM_KPE=dim_kpe, BLOCK_H=block_h, BLOCK_N=BLOCK_N,
        PV_PRECISION=PV_PRECISION, INTERPRET=q_nope.device.type == "cpu",  # CPU tensors mean the interpreter
        num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )
    return out, lse
