"""Causal MLA paged prefill through the FlashInfer library: BatchMLAPagedAttentionWrapper.

A library baseline, not a search seed. Each call plans the wrapper for that call's query and page
tables with causal=True (FlashInfer aligns the causal mask to the bottom right: query i of a
request sees KV positions up to kv_len - q_len + i, as the definition asks) and then runs it on the
split query and split caches; the measured time includes the plan. The workspace and the wrapper
are made once per process. Needs the optional `flashinfer` package (flashinfer-python).
"""

import flashinfer
import torch
from flashinfer.mla import MLAPlanMetadata

WORKSPACE_BYTES = 128 * 1024 * 1024

_wrappers = {}


def _wrapper(device):
    if device not in _wrappers:
        workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        _wrappers[device] = flashinfer.mla.BatchMLAPagedAttentionWrapper(workspace, backend="auto")
    return _wrappers[device]


@torch.no_grad()
def run(q_nope, q_pe, ckv_cache, kpe_cache, qo_indptr, kv_indptr, kv_indices, sm_scale):
    _, num_heads, dim_ckv = q_nope.shape
    kv_len = (kv_indptr[1:] - kv_indptr[:-1]).to(torch.int32)
    wrapper = _wrapper(q_nope.device)
    wrapper.plan(
        metadata=MLAPlanMetadata.csr(qo_indptr, kv_indptr, kv_indices, kv_len),
        num_heads=num_heads, head_dim_ckv=dim_ckv, head_dim_kpe=q_pe.shape[-1], page_size=ckv_cache.shape[1],
        causal=True, sm_scale=float(sm_scale), q_data_type=q_nope.dtype, kv_data_type=ckv_cache.dtype,
        query_layout="split", kv_cache_layout="split", lse_mode="base2",
    )
    output, lse = wrapper.run(query=(q_nope, q_pe), kv_cache=(ckv_cache, kpe_cache), return_lse=True)
    return output, lse
