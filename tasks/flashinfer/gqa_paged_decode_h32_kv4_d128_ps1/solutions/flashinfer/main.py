"""GQA paged decode through the FlashInfer library: BatchDecodeWithPagedKVCacheWrapper.

A library baseline, not a search seed. Each call plans the wrapper for that call's page table
(plan() reads kv_indptr on the host) and then runs it, as a serving engine does once per decode
step, so the measured time includes the plan. The workspace and the wrapper are made once per
process. Needs the optional `flashinfer` package (flashinfer-python).
"""

import flashinfer
import torch

# FlashInfer's CUDA-core decode path. Its tensor-core path (the prefill kernels), advertised for
# large head groups, was 1.53x slower per call on the H200 on the feedback workloads, side by
# side; other runs put the two within this host-bound baseline's run-to-run spread, so the choice
# is weakly supported (docs/benchmarks.md).
USE_TENSOR_CORES = False
WORKSPACE_BYTES = 128 * 1024 * 1024

_wrappers = {}


def _wrapper(device):
    if device not in _wrappers:
        workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        _wrappers[device] = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            workspace, kv_layout="NHD", use_tensor_cores=USE_TENSOR_CORES
        )
    return _wrappers[device]


@torch.no_grad()
def run(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale):
    batch, num_qo_heads, head_dim = q.shape
    num_pages, page_size, num_kv_heads, _ = k_cache.shape
    # Page size 1: every page is full, and an empty request has no last page.
    last_page_len = (kv_indptr[1:] > kv_indptr[:-1]).to(torch.int32)
    wrapper = _wrapper(q.device)
    wrapper.plan(
        kv_indptr, kv_indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
        q_data_type=q.dtype, kv_data_type=k_cache.dtype, sm_scale=float(sm_scale),
    )
    output, lse = wrapper.run(q, (k_cache, v_cache), return_lse=True)
    return output, lse
