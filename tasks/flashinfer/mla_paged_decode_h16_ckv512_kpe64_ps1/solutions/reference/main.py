"""MLA paged decode, the reference math as a candidate: plain PyTorch fp32, one request at a time.

Scores are measured against this. It mirrors the task's reference.py but stands alone, since a
candidate ships only its own files.
"""

import math

import torch


@torch.no_grad()
def run(q_nope, q_pe, ckv_cache, kpe_cache, kv_indptr, kv_indices, sm_scale):
    batch, num_heads, dim_ckv = q_nope.shape
    ckv = ckv_cache.reshape(-1, dim_ckv)  # page size 1: a page is a token
    kpe = kpe_cache.reshape(-1, kpe_cache.shape[-1])
    sm_scale = float(sm_scale)

    output = torch.zeros((batch, num_heads, dim_ckv), dtype=torch.float32, device=q_nope.device)
    lse = torch.full((batch, num_heads), -math.inf, dtype=torch.float32, device=q_nope.device)
    bounds = kv_indptr.tolist()
    for b in range(batch):
        start, end = bounds[b], bounds[b + 1]
        if end <= start:
            continue
        pages = kv_indices[start:end].long()
        kc = ckv[pages].float()
        kp = kpe[pages].float()
        logits = (q_nope[b].float() @ kc.t() + q_pe[b].float() @ kp.t()) * sm_scale
        lse[b] = torch.logsumexp(logits, dim=-1) / math.log(2.0)
        output[b] = torch.softmax(logits, dim=-1) @ kc
    return output.to(torch.bfloat16), lse
