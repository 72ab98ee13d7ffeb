"""Causal MLA paged prefill, the reference math as a candidate: plain PyTorch fp32, one request at
a time, query rows in chunks that keep the logits under ~1 GiB.

Scores are measured against this. It mirrors the task's reference.py but stands alone, since a
candidate ships only its own files.
"""

import math

import torch

MAX_LOGITS = 1 << 28


@torch.no_grad()
def run(q_nope, q_pe, ckv_cache, kpe_cache, qo_indptr, kv_indptr, kv_indices, sm_scale):
    total_q, num_heads, dim_ckv = q_nope.shape
    ckv = ckv_cache.reshape(-1, dim_ckv)  # page size 1: a page is a token
    kpe = kpe_cache.reshape(-1, kpe_cache.shape[-1])
    device = q_nope.device
    sm_scale = float(sm_scale)

    output = torch.zeros((total_q, num_heads, dim_ckv), dtype=torch.float32, device=device)
    lse = torch.full((total_q, num_heads), -math.inf, dtype=torch.float32, device=device)
    q_bounds, kv_bounds = qo_indptr.tolist(), kv_indptr.tolist()
    for b in range(len(q_bounds) - 1):
        q0, q1 = q_bounds[b], q_bounds[b + 1]
        k0, k1 = kv_bounds[b], kv_bounds[b + 1]
        q_len, kv_len = q1 - q0, k1 - k0
        if q_len <= 0 or kv_len <= 0:
            continue
        pages = kv_indices[k0:k1].long()
        kc = ckv[pages].float()
        kp = kpe[pages].float()
        prefix = kv_len - q_len
        positions = torch.arange(kv_len, device=device)
        chunk = max(1, MAX_LOGITS // (num_heads * kv_len))
        for c0 in range(0, q_len, chunk):
            c1 = min(q_len, c0 + chunk)
            qn = q_nope[q0 + c0 : q0 + c1].float()
            qp = q_pe[q0 + c0 : q0 + c1].float()
            logits = (torch.einsum("chd,ld->chl", qn, kc) + torch.einsum("chd,ld->chl", qp, kp)) * sm_scale
            rows = torch.arange(c0, c1, device=device)
            logits.masked_fill_((positions[None, :] > (prefix + rows)[:, None])[:, None, :], -math.inf)
            row_lse = torch.logsumexp(logits, dim=-1)
            probs = torch.exp(logits - row_lse[..., None]).nan_to_num_(0.0)
            output[q0 + c0 : q0 + c1] = torch.einsum("chl,ld->chd", probs, kc)
            lse[q0 + c0 : q0 + c1] = row_lse / math.log(2.0)
    return output.to(torch.bfloat16), lse
