"""Fresh inputs for FlashInfer-Bench definitions: new page tables, length splits and tensors per seed.

FlashInfer-Bench replays the page table recorded with each workload (a safetensors blob) on
every evaluation. A kernel searched against those fixed tables can be wrong on any other: the
K-Search paper's MLA-prefill kernel was. Here every evaluation draws, from its seed, a new split
of the workload's totals into requests and a new page table, as well as new tensors. Blob inputs
are never read (the blobs are not shipped); only the workload's axes and scalar values are used.

Choices, stated once here and repeated in each bundle's task.json:
- Split style, drawn per seed: "even" (lengths differ by at most one), "uneven" (Dirichlet(1)
  shares, i.e. uniform cut points) or "skewed" (log-normal shares, sigma 2: a few long requests
  and many short ones). Lengths are rounded cumulatively, so they sum exactly to the total; a
  request may get length 0 when the axes allow it (they never force every request non-empty).
- Page ids: a random permutation of range(num_pages) truncated to num_kv_indices, so ids are
  unique and scattered over the whole pool.
- Prefill: query lengths split total_q; the KV surplus num_kv_indices - total_q is split with the
  same style and added, so kv_len >= q_len for every request.
- Float tensors N(0,1) in their dtype; fp8 tensors N(0,1) clamped to [-2, 2] and cast.
- MoE (FP8 block scale): positive scales U(0.5, 1.5) times 2 for activations, 1/sqrt(hidden) for
  gemm1 and 1/sqrt(intermediate) for gemm2: the gate/up products come out with a standard
  deviation near 2 and the outputs of routed tokens near 1, where both tolerance terms bite.
  Routing bias 0.1 * N(0,1): N(0,1) would pick the same groups for every token and leave about
  half of all evaluations with no token on the local experts. With the compat option
  "realistic-moe", hidden states and weights are N(0,1) bf16 quantized per 128-block with
  amax/448 scales instead.

Everything is drawn from one torch.Generator on the target device, so inputs are reproducible
per (seed, device) and fast to make on a GPU; only the split style costs a host sync.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

SPLIT_STYLES = ("even", "uneven", "skewed")
REALISTIC_MOE = "realistic-moe"
QUANT_BLOCK = 128  # FP8 block-scale granularity of the DeepSeek MoE definitions
FP8_MAX = 448.0  # largest finite float8_e4m3fn
SKEW_SIGMA = 2.0
MOE_BIAS_STD = 0.1
MOE_ACTIVATION_SCALE = 2.0

_DTYPES = {
    "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64,
    "float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2,
    "int32": torch.int32, "int64": torch.int64, "int8": torch.int8, "uint8": torch.uint8, "bool": torch.bool,
}
_PAGED_NAMES = {"kv_indptr", "kv_indices"}
_MOE_NAMES = {
    "routing_logits", "routing_bias", "hidden_states", "hidden_states_scale",
    "gemm1_weights", "gemm1_weights_scale", "gemm2_weights", "gemm2_weights_scale",
}


class SynthesisError(ValueError):
    """A definition or workload that this module cannot make inputs for; one line for a user."""


# --- workloads and axes -----------------------------------------------------------------------


def _field(workload: Any, key: str) -> dict[str, Any]:
    value = workload.get(key, {}) if isinstance(workload, Mapping) else getattr(workload, key, {})
    return dict(value or {})


def resolve_axes(definition: Mapping[str, Any], workload_axes: Mapping[str, int]) -> dict[str, int]:
    """Const axes from the definition, var axes from the workload; a workload may override a
    const axis (the reduced CPU workloads shrink hidden sizes that way)."""
    axes = {name: int(spec["value"]) for name, spec in definition["axes"].items() if spec.get("type") == "const"}
    axes.update({name: int(v) for name, v in workload_axes.items()})
    missing = [name for name in definition["axes"] if name not in axes]
    if missing:
        raise SynthesisError(f"{definition['name']}: workload gives no size for axes {', '.join(missing)}")
    return axes


def shape_of(spec: Mapping[str, Any], axes: Mapping[str, int]) -> tuple[int, ...]:
    return tuple(axes[d] if isinstance(d, str) else int(d) for d in spec["shape"])


def dtype_of(name: str) -> torch.dtype:
    try:
        return _DTYPES[name]
    except KeyError:
        raise SynthesisError(f"unsupported dtype {name}") from None


def family(definition: Mapping[str, Any]) -> str:
    """Which synthesizer a definition needs: paged_attention, moe_fp8_block_scale or generic."""
    names = set(definition["inputs"])
    if names >= _PAGED_NAMES:
        return "paged_attention"
    if names >= _MOE_NAMES:
        return "moe_fp8_block_scale"
    return "generic"


def unsupported_reason(definition: Mapping[str, Any]) -> str | None:
    """Why inputs for this definition cannot be synthesized, or None when they can."""
    special = {
        "paged_attention": _PAGED_NAMES | {"qo_indptr", "kv_last_page_len"},
        "moe_fp8_block_scale": _MOE_NAMES,
    }.get(family(definition), set())
    for name, spec in definition["inputs"].items():
        if name in special or spec.get("shape") is None:
            continue
        if spec["dtype"] not in _DTYPES:
            return f"input {name} has unsupported dtype {spec['dtype']}"
        if not dtype_of(spec["dtype"]).is_floating_point:
            return f"integer input {name} has no known meaning to synthesize it from"
    return None


# --- request lengths and page tables ------------------------------------------------------------


def choose_style(gen: torch.Generator, device: str | torch.device) -> str:
    pick = torch.randint(len(SPLIT_STYLES), (1,), generator=gen, device=device)
    return SPLIT_STYLES[int(pick.item())]


def split_lengths(total: int, parts: int, style: str, gen: torch.Generator, device: str | torch.device) -> torch.Tensor:
    """`parts` non-negative int64 lengths summing exactly to `total`, shaped by `style`."""
    if parts <= 0:
        if total:
            raise SynthesisError(f"cannot split {total} over zero requests")
        return torch.zeros(0, dtype=torch.int64, device=device)
    f64: dict[str, Any] = {"dtype": torch.float64, "device": device, "generator": gen}
    if style == "even":
        shares = torch.ones(parts, dtype=torch.float64, device=device)
    elif style == "uneven":
        shares = -torch.log1p(-torch.rand(parts, **f64))  # Exp(1) shares: Dirichlet(1) fractions
    elif style == "skewed":
        shares = torch.exp(SKEW_SIGMA * torch.randn(parts, **f64))
    else:
        raise SynthesisError(f"unknown split style {style!r}")
    # Cumulative rounding: boundaries are monotone and the last one is exactly `total`.
    bounds = torch.floor(total * torch.cumsum(shares, 0) / shares.sum()).to(torch.int64)
    bounds[-1] = total
    lengths = torch.diff(bounds, prepend=torch.zeros(1, dtype=torch.int64, device=device))
    if style == "even":
        # Which requests get the +1 remainder is itself random.
        lengths = lengths[torch.randperm(parts, generator=gen, device=device)]
    return lengths


def indptr_of(lengths: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(lengths.numel() + 1, dtype=torch.int32, device=lengths.device)
    out[1:] = torch.cumsum(lengths, 0).to(torch.int32)
    return out


def paged_tables(axes: Mapping[str, int], names: set[str], gen: torch.Generator, device: str) -> dict[str, torch.Tensor]:
    """qo_indptr (prefill), kv_indptr, kv_indices and kv_last_page_len, as the definition asks."""
    batch = axes["len_indptr"] - 1
    total_kv = axes["num_kv_indices"]
    pool = axes["num_pages"]
    page_size = axes.get("page_size", 1)
    if total_kv > pool:
        raise SynthesisError(f"num_kv_indices {total_kv} exceeds num_pages {pool}: page ids could not be unique")
    style = choose_style(gen, device)
    out: dict[str, torch.Tensor] = {}
    if "qo_indptr" in names:
        if page_size != 1:
            raise SynthesisError("prefill page tables are only synthesized for page_size 1")
        total_q = axes["total_q"]
        if total_q > total_kv:
            raise SynthesisError(f"total_q {total_q} exceeds num_kv_indices {total_kv}: kv_len >= q_len is impossible")
        q_lens = split_lengths(total_q, batch, style, gen, device)
        kv_lens = q_lens + split_lengths(total_kv - total_q, batch, style, gen, device)
        out["qo_indptr"] = indptr_of(q_lens)
    else:
        kv_lens = split_lengths(total_kv, batch, style, gen, device)
    out["kv_indptr"] = indptr_of(kv_lens)
    out["kv_indices"] = torch.randperm(pool, generator=gen, device=device)[:total_kv].to(torch.int32)
    if "kv_last_page_len" in names:
        last = torch.randint(1, page_size + 1, (batch,), generator=gen, device=device)
        out["kv_last_page_len"] = torch.where(kv_lens > 0, last, 0).to(torch.int32)
    return out


# --- tensors ------------------------------------------------------------------------------------


def random_tensor(shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator, device: str) -> torch.Tensor:
    """N(0,1) in `dtype`; fp8 as N(0,1) clamped to [-2, 2], drawn one leading slice at a time so
    that a 1 GB fp8 weight never needs a 4 GB float temporary."""
    if dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        out = torch.empty(shape, dtype=dtype, device=device)
        slices = out.view(1, *shape) if len(shape) < 3 else out
        for s in slices:
            s.copy_(torch.randn(s.shape, dtype=torch.bfloat16, device=device, generator=gen).clamp_(-2.0, 2.0))
        return out
    if not dtype.is_floating_point:
        raise SynthesisError(f"no generic synthesis for {dtype} tensors")
    return torch.randn(shape, dtype=dtype, device=device, generator=gen)


def uniform_scales(shape: tuple[int, ...], magnitude: float, gen: torch.Generator, device: str) -> torch.Tensor:
    return (torch.rand(shape, dtype=torch.float32, device=device, generator=gen) + 0.5) * magnitude


def quantize_blocks(x: torch.Tensor, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """fp8 codes and amax/448 scales of a [R, C] tensor in rows x cols blocks (R, C multiples)."""
    r, c = x.shape
    blocks = x.float().view(r // rows, rows, c // cols, cols)
    scales = (blocks.abs().amax(dim=(1, 3)) / FP8_MAX).clamp_(min=1e-12)
    codes = (blocks / scales[:, None, :, None]).clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return codes.view(r, c), scales


def moe_routing(shapes: Mapping[str, tuple[int, ...]], gen: torch.Generator, device: str) -> dict[str, torch.Tensor]:
    """The routing inputs of a DeepSeek FP8 block-scale MoE: the first draws of `moe_tensors`."""
    return {
        "routing_logits": torch.randn(shapes["routing_logits"], dtype=torch.float32, device=device, generator=gen),
        "routing_bias": (MOE_BIAS_STD * torch.randn(shapes["routing_bias"], device=device, generator=gen)).to(torch.bfloat16),
    }


def moe_tensors(
    definition: Mapping[str, Any], axes: Mapping[str, int], gen: torch.Generator, device: str, realistic: bool
) -> dict[str, torch.Tensor]:
    """The eight tensor inputs of a DeepSeek FP8 block-scale MoE, sized by the (maybe shrunk) axes."""
    shapes = {name: shape_of(definition["inputs"][name], axes) for name in _MOE_NAMES}
    tokens, hidden = shapes["hidden_states"]
    experts, gemm1_out, _ = shapes["gemm1_weights"]
    intermediate = shapes["gemm2_weights"][2]
    for what, size in (("hidden", hidden), ("gemm1 out", gemm1_out), ("intermediate", intermediate)):
        if size % QUANT_BLOCK:
            raise SynthesisError(f"{what} size {size} is not a multiple of the {QUANT_BLOCK}-wide scale blocks")
    out = moe_routing(shapes, gen, device)
    if not realistic:
        out["hidden_states"] = random_tensor((tokens, hidden), torch.float8_e4m3fn, gen, device)
        out["hidden_states_scale"] = uniform_scales(shapes["hidden_states_scale"], MOE_ACTIVATION_SCALE, gen, device)
        out["gemm1_weights"] = random_tensor(shapes["gemm1_weights"], torch.float8_e4m3fn, gen, device)
        out["gemm1_weights_scale"] = uniform_scales(shapes["gemm1_weights_scale"], 1 / math.sqrt(hidden), gen, device)
        out["gemm2_weights"] = random_tensor(shapes["gemm2_weights"], torch.float8_e4m3fn, gen, device)
        out["gemm2_weights_scale"] = uniform_scales(shapes["gemm2_weights_scale"], 1 / math.sqrt(intermediate), gen, device)
        return out
    x = torch.randn((tokens, hidden), dtype=torch.bfloat16, device=device, generator=gen)
    codes, scales = quantize_blocks(x, 1, QUANT_BLOCK)
    out["hidden_states"], out["hidden_states_scale"] = codes, scales.t().contiguous()
    for name in ("gemm1_weights", "gemm2_weights"):
        shape = shapes[name]
        codes = torch.empty(shape, dtype=torch.float8_e4m3fn, device=device)
        scales = torch.empty(shapes[f"{name}_scale"], dtype=torch.float32, device=device)
        for e in range(experts):  # one expert at a time bounds the bf16 temporary
            w = torch.randn(shape[1:], dtype=torch.bfloat16, device=device, generator=gen)
            codes[e], scales[e] = quantize_blocks(w, QUANT_BLOCK, QUANT_BLOCK)
        out[name], out[f"{name}_scale"] = codes, scales
    return out


def _scalar(definition_name: str, name: str, spec: Mapping[str, Any], descriptor: Mapping[str, Any] | None) -> Any:
    if not descriptor or descriptor.get("type") != "scalar" or "value" not in descriptor:
        raise SynthesisError(f"{definition_name}: the workload gives no value for scalar input {name}")
    value = descriptor["value"]
    dtype = dtype_of(spec["dtype"])
    if dtype == torch.bool:
        return bool(value)
    return float(value) if dtype.is_floating_point else int(value)


def synthesize(
    definition: Mapping[str, Any], workload: Any, seed: int, device: str, options: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """All inputs of `definition` for one workload, in the definition's input order.

    `workload` is a ksearch Workload (or its dict) whose params["inputs"] holds the FlashInfer-Bench
    input descriptors; only "scalar" descriptors are read, everything else is drawn from `seed`.
    """
    axes = resolve_axes(definition, _field(workload, "axes"))
    descriptors = _field(workload, "params").get("inputs", {})
    gen = torch.Generator(device=device).manual_seed(seed)
    names = set(definition["inputs"])
    kind = family(definition)
    special: dict[str, torch.Tensor] = {}
    if kind == "paged_attention":
        special = paged_tables(axes, names, gen, device)
    elif kind == "moe_fp8_block_scale":
        special = moe_tensors(definition, axes, gen, device, realistic=REALISTIC_MOE in options)
    inputs: dict[str, Any] = {}
    for name, spec in definition["inputs"].items():
        if name in special:
            inputs[name] = special[name]
        elif spec.get("shape") is None:
            inputs[name] = _scalar(definition["name"], name, spec, descriptors.get(name))
        else:
            inputs[name] = random_tensor(shape_of(spec, axes), dtype_of(spec["dtype"]), gen, device)
    return inputs


def drawn_inputs(definition: Mapping[str, Any], workload: Any, names: set[str], seed: int) -> dict[str, torch.Tensor]:
    """The inputs `names` of one workload exactly as `synthesize(definition, workload, seed, "cpu")`
    draws them. Page tables and MoE routing are the first draws of their families, so they are made
    without the rest (a DeepSeek MoE's weights are a gigabyte); other inputs take a full synthesis."""
    axes = resolve_axes(definition, _field(workload, "axes"))
    gen = torch.Generator(device="cpu").manual_seed(seed)
    kind = family(definition)
    if kind == "paged_attention" and names <= _PAGED_NAMES | {"qo_indptr", "kv_last_page_len"}:
        drawn = paged_tables(axes, set(definition["inputs"]), gen, "cpu")
    elif kind == "moe_fp8_block_scale" and names <= {"routing_logits", "routing_bias"}:
        drawn = moe_routing({n: shape_of(definition["inputs"][n], axes) for n in ("routing_logits", "routing_bias")}, gen, "cpu")
    else:
        drawn = synthesize(definition, workload, seed, "cpu")
    return {name: drawn[name] for name in names}
