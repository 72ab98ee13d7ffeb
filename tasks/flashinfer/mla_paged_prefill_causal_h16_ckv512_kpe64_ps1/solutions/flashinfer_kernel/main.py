"""Causal MLA paged prefill through the FlashInfer library: BatchMLAPagedAttentionWrapper.

The library's kernel time, for a kernel-against-kernel score: `plan` (the wrapper's host-side
plan for an input set's page table) is this solution's `prepare` function, which the evaluator
runs for each input set outside the timed region, because this is a task's own bundled solution
(a candidate's setup is always timed). `run` plans by itself only for inputs it was not planned
for. The `flashinfer` solution beside this one plans inside every timed call: plan plus kernel.
Needs the optional `flashinfer` package (flashinfer-python).
"""

import flashinfer
import torch
from flashinfer.mla import MLAPlanMetadata

WORKSPACE_BYTES = 128 * 1024 * 1024

_wrappers = {}
_planned_for = None  # the kv_indptr tensor the wrapper was last planned for


def _wrapper(device):
    if device not in _wrappers:
        workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        _wrappers[device] = flashinfer.mla.BatchMLAPagedAttentionWrapper(workspace, backend="auto")
    return _wrappers[device]


@torch.no_grad()
def plan(q_nope, q_pe, ckv_cache, kpe_cache, qo_indptr, kv_indptr, kv_indices, sm_scale):
    """Plan the wrapper for this input set's page table (host-side work: it reads kv_indptr)."""
    global _planned_for
    _, num_heads, dim_ckv = q_nope.shape
    kv_len = (kv_indptr[1:] - kv_indptr[:-1]).to(torch.int32)
    wrapper = _wrapper(q_nope.device)
    wrapper.plan(
        metadata=MLAPlanMetadata.csr(qo_indptr, kv_indptr, kv_indices, kv_len),
        num_heads=num_heads, head_dim_ckv=dim_ckv, head_dim_kpe=q_pe.shape[-1], page_size=ckv_cache.shape[1],
        causal=True, sm_scale=float(sm_scale), q_data_type=q_nope.dtype, kv_data_type=ckv_cache.dtype,
        query_layout="split", kv_cache_layout="split", lse_mode="base2",
    )
    _planned_for = kv_indptr


@torch.no_grad()
def run(q_nope, q_pe, ckv_cache, kpe_cache, qo_indptr, kv_indptr, kv_indices, sm_scale):
    if _planned_for is not kv_indptr:  # not planned for these inputs (`prepare` did not run): plan now
        plan(q_nope, q_pe, ckv_cache, kpe_cache, qo_indptr, kv_indptr, kv_indices, sm_scale)
    wrapper = _wrapper(q_nope.device)
    output, lse = wrapper.run(query=(q_nope, q_pe), kv_cache=(ckv_cache, kpe_cache), return_lse=True)
    return output, lse
