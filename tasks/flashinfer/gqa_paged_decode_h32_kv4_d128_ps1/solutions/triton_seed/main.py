"""GQA paged decode (32 query heads, 4 KV heads, head dim 128, page size 1) in one Triton kernel.

One program per (request, KV head). It holds the query heads that share the KV head (8, padded
to the 16 rows tl.dot needs) and walks the request's page list once with an online softmax in
base 2, so every K/V row is read exactly once and the lse falls out for free. There is no split
over the sequence: a single long request runs on only 4 programs, which is the first thing a
faster kernel would change.

The tunables below are read and rewritten by the offline policy; every choice passes the task's
tolerance on its own.
"""

import torch
import triton
import triton.language as tl

# Tokens per step of the page walk. K and V tiles are [BLOCK_N, 128] bf16 (16 KiB each at 64)
# per stage, plus an fp32 copy of V for a tf32 P·V: 64 tokens x 3 stages is about 130 KiB.
BLOCK_N = 32  # tunable: [16, 32, 64]
NUM_WARPS = 4  # tunable: [2, 4, 8]
NUM_STAGES = 2  # tunable: [1, 2, 3]
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
def _gqa_decode_kernel(
    q_ptr, k_ptr, v_ptr, indptr_ptr, indices_ptr, out_ptr, lse_ptr, qk_scale,
    stride_qb, stride_qh, stride_kp, stride_kh, stride_vp, stride_vh, stride_ob, stride_oh, stride_lb,
    GROUP: tl.constexpr, BLOCK_H: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
    PV_PRECISION: tl.constexpr, INTERPRET: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1)
    start = tl.load(indptr_ptr + b)
    end = tl.load(indptr_ptr + b + 1)

    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, BLOCK_N)
    h_ok = offs_h < GROUP
    heads = kvh * GROUP + offs_h
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :], mask=h_ok[:, None], other=0.0)
    if INTERPRET:
        # Triton's interpreter multiplies bf16 tiles as raw integers; fp32 products of bf16
        # values are exact, so upcasting is the same arithmetic.
        q = q.to(tl.float32)

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)  # running max, log2 units
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, HEAD_DIM], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        pos = n0 + offs_n
        ok = pos < end
        page = tl.load(indices_ptr + pos, mask=ok, other=0).to(tl.int64)
        k = tl.load(k_ptr + page[:, None] * stride_kp + kvh * stride_kh + offs_d[None, :], mask=ok[:, None], other=0.0)
        v = tl.load(v_ptr + page[:, None] * stride_vp + kvh * stride_vh + offs_d[None, :], mask=ok[:, None], other=0.0)
        if INTERPRET:
            k = k.to(tl.float32)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        s = tl.where(ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + _pv_dot(p, v, PV_PRECISION, INTERPRET)
        m_i = m_new

    # An empty request never enters the loop: output 0 and lse -inf, as the definition says.
    nonempty = l_i > 0
    l_safe = tl.where(nonempty, l_i, 1.0)
    out = acc / l_safe[:, None]
    lse = tl.where(nonempty, m_i + tl.log2(l_safe), float("-inf"))
    tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :], out.to(tl.bfloat16),
             mask=h_ok[:, None])
    tl.store(lse_ptr + b * stride_lb + heads, lse, mask=h_ok)


@torch.no_grad()
def run(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale):
    batch, num_qo_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_qo_heads // num_kv_heads
    q = q.contiguous()
    k_cache = k_cache.contiguous()
    v_cache = v_cache.contiguous()
    out = torch.empty_like(q)
    lse = torch.empty((batch, num_qo_heads), dtype=torch.float32, device=q.device)
    if batch == 0:
        return out, lse
    _gqa_decode_kernel[(batch, num_kv_heads)](
        q, k_cache, v_cache, kv_indptr, kv_indices, out, lse, float(sm_scale) * LOG2E,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(2), v_cache.stride(0), v_cache.stride(2),
        out.stride(0), out.stride(1), lse.stride(0),
        GROUP=group, BLOCK_H=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim, BLOCK_N=BLOCK_N,
        PV_PRECISION=PV_PRECISION, INTERPRET=q.device.type == "cpu",  # CPU tensors mean the interpreter
        num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )
    return out, lse
