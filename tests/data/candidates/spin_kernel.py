"""A Triton kernel that never finishes: it spins on the GPU until the evaluator gives up on it.

Works for any task (GPUMode `custom_kernel(data)` or a flattened `run(*inputs)`): it never returns.
On the CPU path the interpreter spins in Python instead; either way the worker sends nothing more.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _spin(flag_ptr, out_ptr):
    stop = tl.load(flag_ptr, volatile=True)
    i = 0
    while stop == 0:  # the flag is never set; a volatile load keeps the loop from being optimized away
        i += 1
        stop = tl.load(flag_ptr, volatile=True)
    tl.store(out_ptr, i)


def _forever(device):
    flag = torch.zeros(1, dtype=torch.int32, device=device)
    out = torch.empty(1, dtype=torch.int32, device=device)
    _spin[(1,)](flag, out)
    return out.item()  # waits on the spinning kernel


def custom_kernel(data):
    return _forever(data[0].device)


def run(*inputs):
    return _forever(inputs[0].device)
