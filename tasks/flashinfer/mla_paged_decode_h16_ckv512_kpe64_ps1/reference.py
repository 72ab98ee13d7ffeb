"""Trusted reference for mla_paged_decode_h16_ckv512_kpe64_ps1: batched MLA decode over a paged cache.

Multi-head latent attention with the projections absorbed: every head attends over one shared
compressed cache (ckv, 512 wide, which is both K and V) plus a shared rotary part (kpe, 64 wide).
Loaded by path by the framework; inputs come from the shared FlashInfer synthesizer (a new page
table and length split from every seed). Plain PyTorch in fp32, one request at a time.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

from ksearch_ray.taskspec.flashinfer_inputs import synthesize

DEFINITION = json.loads(Path(__file__).with_name("definition.json").read_text())


def generate_inputs(workload: Any, seed: int, device: str, options: frozenset[str] = frozenset()) -> dict[str, Any]:
    return synthesize(DEFINITION, workload, seed, device, options)


@torch.no_grad()
def reference(inputs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    q_nope, q_pe, ckv_cache, kpe_cache = inputs["q_nope"], inputs["q_pe"], inputs["ckv_cache"], inputs["kpe_cache"]
    kv_indptr, kv_indices, sm_scale = inputs["kv_indptr"], inputs["kv_indices"], float(inputs["sm_scale"])
    batch, num_heads, dim_ckv = q_nope.shape
    if ckv_cache.shape[1] != 1:
        raise ValueError(f"this definition has page_size 1, got {ckv_cache.shape[1]}")
    ckv = ckv_cache.reshape(-1, dim_ckv)  # page size 1: a page is a token
    kpe = kpe_cache.reshape(-1, kpe_cache.shape[-1])

    output = torch.zeros((batch, num_heads, dim_ckv), dtype=torch.float32, device=q_nope.device)
    lse = torch.full((batch, num_heads), -math.inf, dtype=torch.float32, device=q_nope.device)
    bounds = kv_indptr.tolist()
    for b in range(batch):
        start, end = bounds[b], bounds[b + 1]
        if end <= start:
            continue  # an empty request: output 0, lse -inf
        pages = kv_indices[start:end].long()
        kc = ckv[pages].float()  # [L, 512]: keys and values at once
        kp = kpe[pages].float()  # [L, 64]
        logits = (q_nope[b].float() @ kc.t() + q_pe[b].float() @ kp.t()) * sm_scale  # [H, L]
        lse[b] = torch.logsumexp(logits, dim=-1) / math.log(2.0)
        output[b] = torch.softmax(logits, dim=-1) @ kc
    return output.to(torch.bfloat16), lse
