"""A TriMul candidate whose Triton kernel Triton's interpreter runs but its compiler refuses: `dst` is
a pointer in one branch of a runtime `if` and an integer offset in the other (tests/test_compile_sm90.py)."""

import torch
import triton
import triton.language as tl


@triton.jit
def _copy_kernel(x_ptr, y_ptr, n, use_pointer, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    if use_pointer > 0:
        dst = y_ptr + offs
        tl.store(dst, tl.load(x_ptr + offs, mask=ok), mask=ok)
    else:
        dst = offs.to(tl.int64)
        tl.store(y_ptr + dst, tl.load(x_ptr + offs, mask=ok), mask=ok)


def custom_kernel(data):
    x, mask, w, config = data
    flat = x.contiguous().reshape(-1)
    out = torch.empty_like(flat)
    _copy_kernel[(triton.cdiv(flat.numel(), 1024),)](flat, out, flat.numel(), 3, BLOCK=1024)  # 1 would be specialized away
    return out.reshape(x.shape)
