"""GQA paged decode through the FlashInfer library: BatchDecodeWithPagedKVCacheWrapper.

The library's kernel time, for a kernel-against-kernel score: `plan` (the wrapper's host-side
plan for an input set's page table) is this solution's `prepare` function, which the evaluator
runs for each input set outside the timed region, because this is a task's own bundled solution
(a candidate's setup is always timed). `run` plans by itself only for inputs it was not planned
for. The `flashinfer` solution beside this one plans inside every timed call: plan plus kernel.
Needs the optional `flashinfer` package (flashinfer-python).
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
_planned_for = None  # the kv_indptr tensor the wrapper was last planned for


def _wrapper(device):
    if device not in _wrappers:
        workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        _wrappers[device] = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            workspace, kv_layout="NHD", use_tensor_cores=USE_TENSOR_CORES
        )
    return _wrappers[device]


@torch.no_grad()
def plan(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale):
    """Plan the wrapper for this input set's page table (host-side work: it reads kv_indptr)."""
    global _planned_for
    batch, num_qo_heads, head_dim = q.shape
    num_pages, page_size, num_kv_heads, _ = k_cache.shape
    # Page size 1: every page is full, and an empty request has no last page.
    last_page_len = (kv_indptr[1:] > kv_indptr[:-1]).to(torch.int32)
    wrapper = _wrapper(q.device)
    wrapper.plan(
        kv_indptr, kv_indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
        q_data_type=q.dtype, kv_data_type=k_cache.dtype, sm_scale=float(sm_scale),
    )
    _planned_for = kv_indptr


@torch.no_grad()
def run(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale):
    if _planned_for is not kv_indptr:  # not planned for these inputs (`prepare` did not run): plan now
        plan(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale)
    wrapper = _wrapper(q.device)
    output, lse = wrapper.run(q, (k_cache, v_cache), return_lse=True)
    return output, lse
