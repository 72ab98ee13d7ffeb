"""A TriMul candidate with the interpreter switches the project's kernels use (constexprs named INTERPRET
and EMULATE, True when the tensors are on the CPU): the sm_90 compile check must build the GPU path,
so each kernel refuses to compile with either switch on (tests/test_compile_sm90.py)."""

import torch
import triton
import triton.language as tl


@triton.jit
def _copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr, INTERPRET: tl.constexpr, EMULATE: tl.constexpr):
    tl.static_assert(not INTERPRET, "compiled with INTERPRET on: the interpreter's path, not the GPU's")
    tl.static_assert(not EMULATE, "compiled with EMULATE on: the interpreter's path, not the GPU's")
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=ok), mask=ok)


def custom_kernel(data):
    x, mask, w, config = data
    flat = x.contiguous().reshape(-1)
    out = torch.empty_like(flat)
    on_cpu = flat.device.type == "cpu"
    _copy_kernel[(triton.cdiv(flat.numel(), 1024),)](flat, out, flat.numel(), BLOCK=1024, INTERPRET=on_cpu,
                                                     EMULATE=on_cpu)
    return out.reshape(x.shape)
