"""TriMul (outgoing triangle multiplicative update) with Triton kernels, GPUMode submission format.

Pipeline, for x [B,N,N,D] and H hidden channels:
  1. torch: LayerNorm over D, then one matmul against the five projections stacked as [5H, D]
     giving P [B*N*N, 5H] = (left, right, left gate, right gate, out gate).
  2. _gate_kernel: left/right = proj ⊙ mask ⊙ σ(gate), written as [B,H,N,N] so that the
     contraction is a plain matmul batched over (b, h).
  3. _triangle_kernel: O[b,h] = L[b,h] @ R[b,h]ᵀ  (O[b,i,j,h] = Σ_k left[b,i,k,h]·right[b,j,k,h]).
  4. _out_norm_gate_kernel: LayerNorm over H of O, affine, times σ(out gate), as Z [B*N*N, H].
  5. torch: Z @ W_outᵀ.

The tunables below are read and rewritten by the offline policy; every choice passes the task's
tolerance on its own.
"""

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import triton
import triton.language as tl

# Triangle contraction tiles. BLOCK_K stays ≤ 32 so that even 128x128 tiles with 4 stages fit
# in a Hopper SM's shared memory (fp32 operands: (128+128)*32*4 B * 4 stages = 128 KiB).
BLOCK_M = 64  # tunable: [32, 64, 128]
BLOCK_N = 64  # tunable: [32, 64, 128]
BLOCK_K = 32  # tunable: [16, 32]
NUM_WARPS = 4  # tunable: [4, 8]
NUM_STAGES = 3  # tunable: [2, 3, 4]
# Operand precision of the contraction's tl.dot; "bf16" rounds operands to bfloat16 and still
# accumulates in fp32.
DOT_PRECISION = "ieee"  # tunable: ["ieee", "tf32", "tf32x3", "bf16"]
# Precision of the two torch matmuls (input projections, output projection). bf16 is left out:
# on H200 it used up to ~90% of the tolerance on some tests workloads, too close for unseen seeds.
PROJ_PRECISION = "ieee"  # tunable: ["ieee", "tf32"]
# Elementwise kernels: rows x hidden channels per program in the gate kernel, and how many j
# positions per program in the output LayerNorm (which always holds all H channels of a row).
GATE_BLOCK_ROWS = 64  # tunable: [32, 64, 128]
GATE_BLOCK_H = 32  # tunable: [16, 32, 64]
NORM_BLOCK_J = 32  # tunable: [16, 32, 64]

EPS = 1e-5


@triton.jit
def _gate_kernel(
    p_ptr, mask_ptr, left_ptr, right_ptr, M, NN, H,
    BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    row_ok = rows < M
    ok = row_ok[:, None] & (cols < H)[None, :]

    src = p_ptr + rows[:, None] * (5 * H) + cols[None, :]
    left_p = tl.load(src, mask=ok, other=0.0)
    right_p = tl.load(src + H, mask=ok, other=0.0)
    left_g = tl.load(src + 2 * H, mask=ok, other=0.0)
    right_g = tl.load(src + 3 * H, mask=ok, other=0.0)
    m = tl.load(mask_ptr + rows, mask=row_ok, other=0.0)[:, None]

    left = left_p * m * tl.sigmoid(left_g)
    right = right_p * m * tl.sigmoid(right_g)

    # Row r = b*N*N + (i*N + k) goes to [b, h, i*N + k] of the [B, H, N*N] outputs.
    b = rows // NN
    dst = (b * H * NN + (rows - b * NN))[:, None] + cols[None, :].to(tl.int64) * NN
    tl.store(left_ptr + dst, left, mask=ok)
    tl.store(right_ptr + dst, right, mask=ok)


@triton.jit
def _triangle_kernel(
    left_ptr, right_ptr, out_ptr, N,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr, EMULATE_BF16: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    base = tl.program_id(2).to(tl.int64) * N * N  # one (b, h) matrix

    offs_i = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_j = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    i_ok = offs_i < N
    j_ok = offs_j < N
    # Both operands are row-major over k; R is read as a [K, N] tile so tl.dot gets L @ Rᵀ.
    a_ptrs = left_ptr + base + offs_i[:, None] * N + offs_k[None, :]
    b_ptrs = right_ptr + base + offs_j[None, :] * N + offs_k[:, None]

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, N, BLOCK_K):
        k_ok = (k0 + offs_k) < N
        a = tl.load(a_ptrs, mask=i_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_ok[:, None] & j_ok[None, :], other=0.0)
        if PRECISION == "bf16":
            if EMULATE_BF16:
                # Triton's interpreter multiplies bf16 tiles as raw integers; rounding to bf16
                # and multiplying in fp32 is the same arithmetic (bf16 products are exact in fp32).
                a = a.to(tl.bfloat16).to(tl.float32)
                b = b.to(tl.bfloat16).to(tl.float32)
                acc = tl.dot(a, b, acc, input_precision="ieee")
            else:
                acc = tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16), acc)
        else:
            acc = tl.dot(a, b, acc, input_precision=PRECISION)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K

    dst = out_ptr + base + offs_i[:, None] * N + offs_j[None, :]
    tl.store(dst, acc, mask=i_ok[:, None] & j_ok[None, :])


@triton.jit
def _out_norm_gate_kernel(
    o_ptr, p_ptr, w_ptr, bias_ptr, z_ptr, N, H, eps,
    BLOCK_J: tl.constexpr, BLOCK_H: tl.constexpr,
):
    pid_j = tl.program_id(0)
    bi = tl.program_id(1).to(tl.int64)  # flattened (b, i)
    b = bi // N
    i = bi - b * N
    NN = N * N

    offs_j = pid_j * BLOCK_J + tl.arange(0, BLOCK_J)
    offs_h = tl.arange(0, BLOCK_H)
    j_ok = offs_j < N
    h_ok = offs_h < H
    ok = j_ok[:, None] & h_ok[None, :]

    # O is [B, H, N, N]: consecutive j are adjacent in memory, so each h column loads coalesced.
    o = tl.load(o_ptr + b * H * NN + offs_h[None, :].to(tl.int64) * NN + i * N + offs_j[:, None],
                mask=ok, other=0.0)
    mean = tl.sum(o, axis=1) / H
    centered = tl.where(ok, o - mean[:, None], 0.0)
    var = tl.sum(centered * centered, axis=1) / H
    normed = centered * tl.rsqrt(var + eps)[:, None]

    w = tl.load(w_ptr + offs_h, mask=h_ok, other=0.0)
    bias = tl.load(bias_ptr + offs_h, mask=h_ok, other=0.0)
    rows = bi * N + offs_j  # = b*N*N + i*N + j, the row in P and Z
    og = tl.load(p_ptr + rows[:, None] * (5 * H) + 4 * H + offs_h[None, :], mask=ok, other=0.0)
    z = (normed * w[None, :] + bias[None, :]) * tl.sigmoid(og)
    tl.store(z_ptr + rows[:, None] * H + offs_h[None, :], z, mask=ok)


@contextmanager
def _tf32(enabled: bool) -> Iterator[None]:
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved


def _matmul_t(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """a @ wᵀ in fp32, TF32 tensor cores allowed only when PROJ_PRECISION says so."""
    with _tf32(PROJ_PRECISION == "tf32"):
        return torch.matmul(a, w.t())


@torch.no_grad()
def custom_kernel(data):
    x, mask, w, config = data
    bsz, n, _, d = x.shape
    h = config["hidden_dim"]
    m_rows = bsz * n * n

    xn = torch.nn.functional.layer_norm(x, (d,), w["norm.weight"], w["norm.bias"], EPS)
    w_in = torch.cat(
        [w["left_proj.weight"], w["right_proj.weight"], w["left_gate.weight"],
         w["right_gate.weight"], w["out_gate.weight"]], dim=0,
    )
    p = _matmul_t(xn.reshape(m_rows, d), w_in).contiguous()  # [B*N*N, 5H]
    del xn

    mask_rows = mask.reshape(m_rows).to(torch.float32).contiguous()
    left = torch.empty((bsz, h, n, n), device=x.device, dtype=torch.float32)
    right = torch.empty_like(left)
    grid = (triton.cdiv(m_rows, GATE_BLOCK_ROWS), triton.cdiv(h, GATE_BLOCK_H))
    _gate_kernel[grid](p, mask_rows, left, right, m_rows, n * n, h,
                       BLOCK_R=GATE_BLOCK_ROWS, BLOCK_H=GATE_BLOCK_H)

    out = torch.empty_like(left)
    grid = (triton.cdiv(n, BLOCK_M), triton.cdiv(n, BLOCK_N), bsz * h)
    _triangle_kernel[grid](
        left, right, out, n,
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
        PRECISION=DOT_PRECISION, EMULATE_BF16=x.device.type == "cpu",  # CPU tensors mean the interpreter
        num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )
    del left, right

    z = torch.empty((m_rows, h), device=x.device, dtype=torch.float32)
    grid = (triton.cdiv(n, NORM_BLOCK_J), bsz * n)
    _out_norm_gate_kernel[grid](out, p, w["to_out_norm.weight"], w["to_out_norm.bias"], z, n, h, EPS,
                                BLOCK_J=NORM_BLOCK_J, BLOCK_H=triton.next_power_of_2(h))
    del out, p

    return _matmul_t(z, w["to_out.weight"]).reshape(bsz, n, n, d)
