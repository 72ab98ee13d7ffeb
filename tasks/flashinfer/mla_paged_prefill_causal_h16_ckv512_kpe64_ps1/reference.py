"""Trusted reference for mla_paged_prefill_causal_h16_ckv512_kpe64_ps1: causal MLA prefill, paged cache.

Request b has q_len = qo_indptr[b+1] - qo_indptr[b] query rows and kv_len = kv_indptr[b+1] -
kv_indptr[b] cached tokens (its history followed by the new tokens), kv_len >= q_len. The causal
mask is aligned bottom-right: with prefix = kv_len - q_len, query row i sees KV positions
0 .. prefix + i. Loaded by path by the framework; inputs come from the shared FlashInfer
synthesizer (new page table and splits from every seed). Plain PyTorch in fp32, one request at a
time, query rows in chunks so that a 16k x 16k request never needs more than ~1 GiB of logits.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

from ksearch_ray.taskspec.flashinfer_inputs import synthesize

DEFINITION = json.loads(Path(__file__).with_name("definition.json").read_text())
MAX_LOGITS = 1 << 28  # elements of one chunk's logits tensor


def generate_inputs(workload: Any, seed: int, device: str, options: frozenset[str] = frozenset()) -> dict[str, Any]:
    return synthesize(DEFINITION, workload, seed, device, options)


@torch.no_grad()
def reference(inputs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    q_nope, q_pe, ckv_cache, kpe_cache = inputs["q_nope"], inputs["q_pe"], inputs["ckv_cache"], inputs["kpe_cache"]
    qo_indptr, kv_indptr, kv_indices = inputs["qo_indptr"], inputs["kv_indptr"], inputs["kv_indices"]
    sm_scale = float(inputs["sm_scale"])
    total_q, num_heads, dim_ckv = q_nope.shape
    if ckv_cache.shape[1] != 1:
        raise ValueError(f"this definition has page_size 1, got {ckv_cache.shape[1]}")
    ckv = ckv_cache.reshape(-1, dim_ckv)  # page size 1: a page is a token
    kpe = kpe_cache.reshape(-1, kpe_cache.shape[-1])
    device = q_nope.device

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
        kc = ckv[pages].float()  # [L, 512]: keys and values at once
        kp = kpe[pages].float()  # [L, 64]
        prefix = kv_len - q_len
        positions = torch.arange(kv_len, device=device)
        chunk = max(1, MAX_LOGITS // (num_heads * kv_len))
        for c0 in range(0, q_len, chunk):
            c1 = min(q_len, c0 + chunk)
            qn = q_nope[q0 + c0 : q0 + c1].float()  # [C, H, 512]
            qp = q_pe[q0 + c0 : q0 + c1].float()
            logits = (torch.einsum("chd,ld->chl", qn, kc) + torch.einsum("chd,ld->chl", qp, kp)) * sm_scale
            rows = torch.arange(c0, c1, device=device)
            hidden = positions[None, :] > (prefix + rows)[:, None]  # bottom-right causal mask
            logits.masked_fill_(hidden[:, None, :], -math.inf)
            row_lse = torch.logsumexp(logits, dim=-1)  # [C, H]; -inf for a row that sees nothing
            probs = torch.exp(logits - row_lse[..., None]).nan_to_num_(0.0)
            output[q0 + c0 : q0 + c1] = torch.einsum("chl,ld->chd", probs, kc)
            lse[q0 + c0 : q0 + c1] = row_lse / math.log(2.0)
    return output.to(torch.bfloat16), lse
