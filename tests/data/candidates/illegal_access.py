import torch
import triton
import triton.language as tl


@triton.jit
def _wild_store(y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK).to(tl.int64) + (1 << 40)  # a terabyte past the buffer
    tl.store(y_ptr + offs, tl.zeros([BLOCK], dtype=tl.float32))


def run(x, a, b):
    y = a * x + b
    _wild_store[(1,)](y, y.numel(), BLOCK=128)
    return y
