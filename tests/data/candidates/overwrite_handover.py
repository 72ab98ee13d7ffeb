"""Tries to change what the judge compares after the harness has handed it over (GPU only).

From the second workload on, it returns a wrong answer, and queues on a side stream, behind a
25 ms sleep, a copy of the right answer into the harness's hand-over buffer (found through gc),
hoping it lands after the harness copied the wrong one in and before the evaluator copies it out.
"""

import ctypes
import gc

import torch

_calls = []
_side = []
_keep = []


def _staging():
    from ksearch_ray.evaluation.sandbox.handover import Exporter

    for obj in gc.get_objects():
        if isinstance(obj, Exporter) and obj.buffer is not None:
            return obj.buffer
    return None


def run(x, a, b):
    right = a * x + b
    _calls.append(1)
    buf = _staging() if x.is_cuda else None
    if len(_calls) == 1 or buf is None:
        return right
    if not _side:
        _side.append(torch.cuda.Stream())
    lib = ctypes.CDLL("libcuda.so.1")
    lib.cuMemcpyDtoDAsync_v2.argtypes = [ctypes.c_ulonglong, ctypes.c_ulonglong, ctypes.c_size_t, ctypes.c_void_p]
    keep = right.clone()
    _keep.append(keep)
    _side[0].wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(_side[0]):
        torch.cuda._sleep(50_000_000)
        lib.cuMemcpyDtoDAsync_v2(buf.ptr, keep.data_ptr(), keep.numel() * keep.element_size(), _side[0].cuda_stream)
    return right + 1.0
