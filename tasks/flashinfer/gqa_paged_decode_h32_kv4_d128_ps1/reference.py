"""Trusted reference for gqa_paged_decode_h32_kv4_d128_ps1: batched GQA decode over a paged KV cache.

Loaded by path by the framework. Inputs come from the shared FlashInfer synthesizer, which draws a
new page table and length split from every seed (see ksearch_ray.taskspec.flashinfer_inputs); the math
below is plain PyTorch in fp32, one request at a time.
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
    q, k_cache, v_cache = inputs["q"], inputs["k_cache"], inputs["v_cache"]
    kv_indptr, kv_indices, sm_scale = inputs["kv_indptr"], inputs["kv_indices"], float(inputs["sm_scale"])
    batch, num_qo_heads, head_dim = q.shape
    _, page_size, num_kv_heads, _ = k_cache.shape
    if page_size != 1:
        raise ValueError(f"this definition has page_size 1, got {page_size}")
    group = num_qo_heads // num_kv_heads
    keys = k_cache.reshape(-1, num_kv_heads, head_dim)  # page size 1: a page is a token
    values = v_cache.reshape(-1, num_kv_heads, head_dim)

    output = torch.zeros((batch, num_qo_heads, head_dim), dtype=torch.float32, device=q.device)
    lse = torch.full((batch, num_qo_heads), -math.inf, dtype=torch.float32, device=q.device)
    bounds = kv_indptr.tolist()
    for b in range(batch):
        start, end = bounds[b], bounds[b + 1]
        if end <= start:
            continue  # an empty request: output 0, lse -inf
        pages = kv_indices[start:end].long()
        k = keys[pages].float()  # [L, KVH, D]
        v = values[pages].float()
        qb = q[b].float().view(num_kv_heads, group, head_dim)  # query head h reads KV head h // group
        logits = torch.einsum("hgd,lhd->hgl", qb, k) * sm_scale
        lse[b] = (torch.logsumexp(logits, dim=-1) / math.log(2.0)).reshape(num_qo_heads)
        probs = torch.softmax(logits, dim=-1)
        output[b] = torch.einsum("hgl,lhd->hgd", probs, v).reshape(num_qo_heads, head_dim)
    return output.to(torch.bfloat16), lse
