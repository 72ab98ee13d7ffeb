"""GQA paged decode, the reference math as a candidate: plain PyTorch fp32, one request at a time.

Scores are measured against this. It mirrors the task's reference.py but stands alone, since a
candidate ships only its own files.
"""

import math

import torch


@torch.no_grad()
def run(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale):
    batch, num_qo_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_qo_heads // num_kv_heads
    keys = k_cache.reshape(-1, num_kv_heads, head_dim)  # page size 1: a page is a token
    values = v_cache.reshape(-1, num_kv_heads, head_dim)
    sm_scale = float(sm_scale)

    output = torch.zeros((batch, num_qo_heads, head_dim), dtype=torch.float32, device=q.device)
    lse = torch.full((batch, num_qo_heads), -math.inf, dtype=torch.float32, device=q.device)
    bounds = kv_indptr.tolist()
    for b in range(batch):
        start, end = bounds[b], bounds[b + 1]
        if end <= start:
            continue
        pages = kv_indices[start:end].long()
        k = keys[pages].float()
        v = values[pages].float()
        qb = q[b].float().view(num_kv_heads, group, head_dim)
        logits = torch.einsum("hgd,lhd->hgl", qb, k) * sm_scale
        lse[b] = (torch.logsumexp(logits, dim=-1) / math.log(2.0)).reshape(num_qo_heads)
        output[b] = torch.einsum("hgl,lhd->hgd", torch.softmax(logits, dim=-1), v).reshape(num_qo_heads, head_dim)
    return output.to(torch.bfloat16), lse
