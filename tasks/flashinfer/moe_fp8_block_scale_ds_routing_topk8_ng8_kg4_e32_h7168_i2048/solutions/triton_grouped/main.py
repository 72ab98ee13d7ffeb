"""DeepSeek-V3 FP8 block-scale MoE as two grouped GEMMs whose whole call is one CUDA graph.

No device-to-host copy and no shape that depends on the routing, so a captured graph is right for
every input of the same size:

1. _route_kernel, one program a token: DeepSeek-V3 routing, the token's 8 (expert, weight) pairs,
   and an atomic count of the local pairs per local expert.
2. _group_kernel: each local pair gets a slot in its expert's run of slots (runs in expert order,
   from a prefix sum of the counts; within a run, in the order of atomic increments); program 0
   writes each expert's first slot and first BLOCK_M-row tile (tile_indptr [E + 1]).
   Routing and grouping were some 35 small torch kernels before (sort, searchsorted, cumsum ...);
   these two took the graph replay of the one-token workload from 0.134 to 0.050 ms on the H200.
3. _gemm1_swiglu_kernel: G = A · W13[e]ᵀ on fp8 tensor cores (e4m3 codes, fp32 accumulation),
   the activation scale of each row and the weight scale of each column applied per 128-wide K
   block, C = silu(gate) · up written in fp32 to the pair's slot (with K split: partial sums
   added into G, SwiGLU left to GEMM2's loads).
4. _gemm2_kernel: O = C · W2[e]ᵀ (tf32 tensor cores by default), scaled the same way, times the
   routing weight, atomically added into the fp32 [T, H] output row of the pair's token.
5. torch: the fp32 output cast to bf16.

Both kernels launch an upper bound of programs computed from T alone (every expert's last tile may
be partial: at most min(T·8, ceil(T·8 / BLOCK_M) + E) tiles, times the column slices); each program
finds its (expert, column slice, tile) from tile_indptr, as the split-KV decode kernels find their
request from kv_indptr, and a program past the real work returns at once. An expert's programs are
contiguous and, within one column slice, its tiles are neighbours, so the tiles of one expert read
that slice of its weights while it is in L2 rather than from DRAM once each; an expert with no
tokens has no programs and its weights are never read.

The defaults (16-row tiles, 128 columns, GEMM2's K split in two) were the fastest the H200
measured on every workload of `all`, up to 14k tokens, within noise: switching to 64 x 64 tiles
without splits above 64 (or 256, or 1024) tokens, where GEMM1 runs on Hopper's fp8 warpgroup MMA
(below 64 rows Triton upcasts the fp8 codes to fp16 for mma.sync, exactly), was slower on each
workload it touched (docs/benchmarks.md).

The combine is an fp32 atomic add rather than per-pair rows reduced by index_add: per-pair rows
would need a [T·8, H] fp32 buffer at fixed size (3.2 GB at 14k tokens) where the output is 8x
smaller, and index_add on the GPU adds atomically anyway. The order of the adds into an element
(at most 8 pairs times GEMM2's K splits) varies from call to call, which moves the fp32 sum by
~1e-7 relative, so the bf16 result can differ by one bf16 unit (2^-8 relative, within the
tolerance's 1e-2) from one call to the next.

Host work counts: FlashInfer-Bench times run() as a call, and at a few tokens the host's part of a call
(Python, allocations and four Triton launches) is longer than the kernels. So run() does plain integer
arithmetic (no constexpr helpers of Triton's), no autograd context, and after a call key's first
launches goes to the compiled kernels directly (DIRECT_LAUNCH below), as the attention seeds do.
Nothing cached depends on the inputs' contents: the key is the sizes, the expert offset and the
inputs' dtypes, device and 16-byte alignment.

The tunables below are read and rewritten by the offline policy; every choice passes the task's
tolerance on its own.
"""

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

N_GROUP = 8
TOPK_GROUP = 4
TOP_K = 8
QBLOCK = 128  # scale-block width of the fp8 tensors

# Pair rows per tile, output columns per program and K per step, for both GEMMs. BLOCK_K divides
# 128, so a K step never straddles two scale blocks, and BLOCK_N divides 128, so a program's
# columns share one weight-scale block row. At the largest choices a GEMM1 stage holds a 64 x 128
# activation tile and two 128 x 128 weight tiles in fp8 (40 KiB).
BLOCK_M = 16  # tunable: [16, 32, 64]
BLOCK_N = 128  # tunable: [32, 64, 128]
BLOCK_K = 128  # tunable: [64, 128]
NUM_WARPS = 4  # tunable: [4, 8]
NUM_STAGES = 3  # tunable: [2, 3]
# GEMM2's arithmetic on the fp32 intermediate C: "tf32" runs on tensor cores, which read C to 10
# mantissa bits (the fp8 weights are exact in tf32); that passes the realistic-moe option, where a
# bf16 C does not (about 7% of the elements fail). "ieee" is exact fp32 on CUDA cores, and slow.
GEMM2_PRECISION = "tf32"  # tunable: ["tf32", "ieee"]
# Small batches touch few experts, so the column slices of their experts alone can leave SMs idle
# while the weights stream: each GEMM's K can be split SPLIT_K1 and SPLIT_K2 ways. GEMM1's splits
# add their scaled partial sums atomically into an fp32 [pairs, 2 x I] buffer and GEMM2 applies
# SwiGLU as it loads it; GEMM2's splits add into the output, which is an atomic sum anyway.
SPLIT_K1 = 1  # tunable: [1, 2, 4, 8]
SPLIT_K2 = 2  # tunable: [1, 2, 4]
# SWAP_AB: swap the GEMMs' operands, the weight tile as the MMA's A (BLOCK_N rows) and
# the few token rows as its N, so that Hopper's warpgroup MMA (64 rows at least) runs on 16-row tiles
# (wgmma m64n16 e4m3 and tf32). Measured slower on the H200 than mma.sync on 16-row tiles
# (docs/benchmarks.md), so off by default.
SWAP_AB = False  # tunable: [True, False]
# Host work per call. True: after a kernel's first launch with a given call key (the sizes, the expert
# offset, and the inputs' dtypes, device and 16-byte alignment: everything the launches' arguments other
# than addresses and the scaling factor, and Triton's specialization, follow from), later launches with
# that key call the compiled kernel directly, skipping Triton's per-launch argument binding,
# specialization and cache lookup. False: every launch goes through Triton's JIT entry point. Launch
# hooks (profilers) and Triton's interpreter (the CPU) always do.
DIRECT_LAUNCH = True  # tunable: [True, False]

_CALL_KEYS: dict[tuple, int] = {}  # a call's key -> a small number standing for it in launch keys
_COMPILED: dict[tuple, tuple] = {}  # (kernel's name, call key's number) -> (launcher, its fixed arguments)


def _call_key(tensors, *values):
    """A number for everything a call's launches follow from besides the tensors' addresses and
    contents and the scaling factor; None when launches go through Triton's entry point."""
    if not DIRECT_LAUNCH or not tensors[0].is_cuda:
        return None
    key = (*values, *[t.dtype for t in tensors], *[t.get_device() for t in tensors],
           *[t.data_ptr() % 16 == 0 for t in tensors])
    number = _CALL_KEYS.get(key)
    if number is None:
        number = _CALL_KEYS[key] = len(_CALL_KEYS)
    return number


def _hooked() -> bool:
    """Whether a launch hook is set (Triton's knobs hold an empty HookChain when none is)."""
    hooks = triton.knobs.runtime
    return any(h is not None and bool(getattr(h, "calls", True))
               for h in (hooks.launch_enter_hook, hooks.launch_exit_hook))


def _direct(compiled) -> tuple:
    """(launcher, the arguments it takes between the stream and the kernel's own) of a compiled
    kernel: Triton 3.6's C launcher where its argument layout is the one this file knows (no
    scratch, no tensor descriptors), else the compiled kernel's own `run` (its Python wrapper)."""
    run = compiled.run
    try:
        import triton.backends.nvidia.driver as nv
        layout = getattr(nv, "_BASE_ARGS_FORMAT", None)
    except ImportError:
        layout = None
    launch = getattr(run, "launch", None)
    if layout == "iiiKKppOOOOOO" and launch is not None and not getattr(run, "global_scratch_size", 1) \
            and not getattr(run, "profile_scratch_size", 1) \
            and getattr(launch, "__qualname__", "") != "wrap_handle_tensordesc.<locals>.inner":
        return launch, (compiled.function, run.launch_cooperative_grid, run.launch_pdl, None, None,
                        compiled.packed_metadata, None, None, None)
    return run, (compiled.function, compiled.packed_metadata, None, None, None)


def _launch(fn, name, programs, call_key, stream, args, **options):
    """fn[(programs,)](*args, **options): `args` are every parameter of fn in signature order,
    constexprs included (the compiled kernel takes them so), `options` only launch options (num_warps,
    num_stages). Directly through the compiled kernel once this call key's first launch through
    Triton has compiled it."""
    hit = None if call_key is None else _COMPILED.get((name, call_key))
    if hit is None or _hooked():
        compiled = fn[(programs,)](*args, **options)
        if call_key is not None and hit is None and compiled is not None:
            _COMPILED[(name, call_key)] = _direct(compiled)
        return
    launcher, fixed = hit
    launcher(programs, 1, 1, stream, *fixed, *args)


def _stream(call_key):
    """The current stream's handle, as Triton launches on it (None on Triton's own path)."""
    if call_key is None:
        return None
    driver = triton.runtime.driver.active
    return driver.get_current_stream(driver.get_current_device())


def _cdiv(a: int, b: int) -> int:  # triton.cdiv is a constexpr function: microseconds a call on the host
    return -(-a // b)


def _pow2(n: int) -> int:  # triton.next_power_of_2, in plain integers
    return 1 << (n - 1).bit_length() if n > 1 else 1


@triton.jit
def _find_program(tile_indptr_ptr, slot_bounds_ptr, num_experts, num_slices,
                  BLOCK_M: tl.constexpr, BLOCK_E: tl.constexpr):
    """This program's expert (int64), slice, rows and which of them are the expert's; the expert is
    num_experts past the real work. A slice is a (column slice, K split) pair.

    Expert e owns programs tile_indptr[e]·S .. tile_indptr[e + 1]·S (S slices); within them the
    slice is the major index and the tile the minor one."""
    pid = tl.program_id(0)
    offs_e = tl.arange(0, BLOCK_E)
    e_ok = offs_e < num_experts
    tile_end = tl.load(tile_indptr_ptr + 1 + offs_e, mask=e_ok, other=0)
    e = tl.sum(((tile_end * num_slices <= pid) & e_ok).to(tl.int32))  # experts whose programs all come before
    e_safe = tl.minimum(e, num_experts - 1)
    first_tile = tl.load(tile_indptr_ptr + e_safe)
    tiles = tl.maximum(tl.load(tile_indptr_ptr + e_safe + 1) - first_tile, 1)
    local = pid - first_tile * num_slices
    col_slice = local // tiles
    row0 = tl.load(slot_bounds_ptr + e_safe) + (local % tiles) * BLOCK_M
    rows = row0 + tl.arange(0, BLOCK_M)
    return e.to(tl.int64), col_slice, rows, rows < tl.load(slot_bounds_ptr + e_safe + 1)


@triton.jit
def _gemm1_swiglu_kernel(
    a_ptr, a_scale_ptr, w_ptr, w_scale_ptr, c_ptr, tile_indptr_ptr, slot_bounds_ptr, slot_token_ptr,
    num_tokens, hidden, inter, num_experts, num_slices, split_k, k_per_split,
    stride_we, stride_wn, stride_se, stride_sn, stride_c,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, QBLOCK: tl.constexpr,
    BLOCK_E: tl.constexpr, SPLIT: tl.constexpr, SWAP: tl.constexpr, INTERPRET: tl.constexpr,
):
    """SPLIT: add this K split's up and gate sums into the [pairs, 2 x I] buffer c (up, then gate);
    else write C = silu(gate) · up to the [pairs, I] buffer c. SWAP: the products are computed
    transposed, weight columns as the MMA's rows ([BLOCK_N, BLOCK_M] tiles)."""
    e, piece, rows, row_ok = _find_program(tile_indptr_ptr, slot_bounds_ptr, num_experts, num_slices * split_k,
                                          BLOCK_M, BLOCK_E)
    if e >= num_experts:
        return
    col_slice = piece // split_k
    k_lo = (piece % split_k) * k_per_split
    k_hi = tl.minimum(hidden, k_lo + k_per_split)
    tok = tl.load(slot_token_ptr + rows, mask=row_ok, other=0).to(tl.int64)
    cols = col_slice * BLOCK_N + tl.arange(0, BLOCK_N)  # within the up half; gate = inter + cols
    col_ok = cols < inter
    offs_k = tl.arange(0, BLOCK_K)

    a_rows = a_ptr + tok[:, None] * hidden + offs_k[None, :]
    w_up = w_ptr + e * stride_we + cols[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
    w_gate = w_up + inter * stride_wn
    s_up = w_scale_ptr + e * stride_se + (cols // QBLOCK) * stride_sn
    s_gate = w_scale_ptr + e * stride_se + ((inter + cols) // QBLOCK) * stride_sn
    if SWAP:
        acc_up = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        acc_gate = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        a = tl.load(a_rows + k0, mask=row_ok[:, None], other=0.0)
        wu = tl.load(w_up + k0, mask=col_ok[:, None], other=0.0)
        wg = tl.load(w_gate + k0, mask=col_ok[:, None], other=0.0)
        kb = k0 // QBLOCK
        a_scale = tl.load(a_scale_ptr + kb * num_tokens + tok, mask=row_ok, other=0.0)  # scales are [H/128, T]
        up_scale = tl.load(s_up + kb, mask=col_ok, other=0.0)
        gate_scale = tl.load(s_gate + kb, mask=col_ok, other=0.0)
        if INTERPRET:  # no fp8 tensor cores in the interpreter; fp32 products of fp8 codes are exact
            a = a.to(tl.float32)
            wu = wu.to(tl.float32)
            wg = wg.to(tl.float32)
        if SWAP:
            acc_up += tl.dot(wu, tl.trans(a)) * up_scale[:, None] * a_scale[None, :]
            acc_gate += tl.dot(wg, tl.trans(a)) * gate_scale[:, None] * a_scale[None, :]
        else:
            acc_up += tl.dot(a, tl.trans(wu)) * a_scale[:, None] * up_scale[None, :]
            acc_gate += tl.dot(a, tl.trans(wg)) * a_scale[:, None] * gate_scale[None, :]

    if SWAP:
        c_tile = c_ptr + rows[None, :].to(tl.int64) * stride_c + cols[:, None]
        tile_ok = row_ok[None, :] & col_ok[:, None]
    else:
        c_tile = c_ptr + rows[:, None].to(tl.int64) * stride_c + cols[None, :]
        tile_ok = row_ok[:, None] & col_ok[None, :]
    if SPLIT:
        tl.atomic_add(c_tile, acc_up, mask=tile_ok, sem="relaxed")
        tl.atomic_add(c_tile + inter, acc_gate, mask=tile_ok, sem="relaxed")
    else:
        tl.store(c_tile, acc_gate * tl.sigmoid(acc_gate) * acc_up, mask=tile_ok)  # silu(second half) times first


@triton.jit
def _gemm2_kernel(
    c_ptr, w_ptr, w_scale_ptr, out_ptr, slot_weight_ptr, slot_token_ptr, tile_indptr_ptr, slot_bounds_ptr,
    hidden, inter, num_experts, num_slices, split_k, k_per_split,
    stride_c, stride_we, stride_wn, stride_se, stride_sn, stride_o,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, QBLOCK: tl.constexpr,
    BLOCK_E: tl.constexpr, SWIGLU: tl.constexpr, TF32: tl.constexpr, SWAP: tl.constexpr, INTERPRET: tl.constexpr,
):
    """SWIGLU: c holds GEMM1's up and gate sums [pairs, 2 x I], and C = silu(gate) · up is made here
    as each K step loads them; else c is C [pairs, I]. This program adds its K split's share. SWAP:
    as in GEMM1, transposed products."""
    e, piece, rows, row_ok = _find_program(tile_indptr_ptr, slot_bounds_ptr, num_experts, num_slices * split_k,
                                          BLOCK_M, BLOCK_E)
    if e >= num_experts:
        return
    col_slice = piece // split_k
    k_lo = (piece % split_k) * k_per_split
    k_hi = tl.minimum(inter, k_lo + k_per_split)
    cols = col_slice * BLOCK_N + tl.arange(0, BLOCK_N)  # output hidden columns
    col_ok = cols < hidden
    offs_k = tl.arange(0, BLOCK_K)

    c_rows = c_ptr + rows[:, None].to(tl.int64) * stride_c + offs_k[None, :]
    w_base = w_ptr + e * stride_we + cols[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
    s_base = w_scale_ptr + e * stride_se + (cols // QBLOCK) * stride_sn
    if SWAP:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        c = tl.load(c_rows + k0, mask=row_ok[:, None], other=0.0)
        if SWIGLU:
            gate = tl.load(c_rows + inter + k0, mask=row_ok[:, None], other=0.0)
            c = gate * tl.sigmoid(gate) * c
        w = tl.load(w_base + k0, mask=col_ok[:, None], other=0.0).to(tl.float32)
        w_scale = tl.load(s_base + k0 // QBLOCK, mask=col_ok, other=0.0)
        if INTERPRET:
            if TF32:  # Hopper's tf32 tensor cores read only the top 19 bits of C
                c = (c.to(tl.uint32, bitcast=True) & 0xFFFFE000).to(tl.float32, bitcast=True)
            if SWAP:
                acc += tl.dot(w, tl.trans(c)) * w_scale[:, None]
            else:
                acc += tl.dot(c, tl.trans(w)) * w_scale[None, :]
        elif SWAP:
            acc += tl.dot(w, tl.trans(c), input_precision="tf32" if TF32 else "ieee") * w_scale[:, None]
        else:
            acc += tl.dot(c, tl.trans(w), input_precision="tf32" if TF32 else "ieee") * w_scale[None, :]

    weight = tl.load(slot_weight_ptr + rows, mask=row_ok, other=0.0)
    tok = tl.load(slot_token_ptr + rows, mask=row_ok, other=0).to(tl.int64)
    if SWAP:
        tl.atomic_add(out_ptr + tok[None, :] * stride_o + cols[:, None], acc * weight[None, :],
                      mask=row_ok[None, :] & col_ok[:, None], sem="relaxed")
    else:
        tl.atomic_add(out_ptr + tok[:, None] * stride_o + cols[None, :], acc * weight[:, None],
                      mask=row_ok[:, None] & col_ok[None, :], sem="relaxed")


@triton.jit
def _route_kernel(logits_ptr, bias_ptr, ids_ptr, weights_ptr, counts_ptr, offset, num_local, scaling,
                  N_GROUP: tl.constexpr, GROUP_SIZE: tl.constexpr, TOPK_GROUP: tl.constexpr, TOP_K: tl.constexpr,
                  INTERPRET: tl.constexpr):
    """DeepSeek-V3 routing of one token (program t): its TOP_K global expert ids and weights, and one
    count per local pair in counts[local expert].

    Selection is by value with the lowest index among equals, as exact as torch's topk for distinct
    values; the sigmoid is torch's formula, 1 / (1 + exp(-x)), with libdevice's exp and a rounded
    division, as CUDA builds torch's (on the H200 the expert sets matched the reference's on a
    million random tokens)."""
    t = tl.program_id(0).to(tl.int64)
    g = tl.arange(0, N_GROUP)
    j = tl.arange(0, GROUP_SIZE)
    expert = g[:, None] * GROUP_SIZE + j[None, :]  # [N_GROUP, GROUP_SIZE] global ids
    x = tl.load(logits_ptr + t * (N_GROUP * GROUP_SIZE) + expert)
    # The interpreter has no libdevice: there, numpy's exp and division.
    scores = 1.0 / (1.0 + tl.exp(-x)) if INTERPRET else tl.math.div_rn(1.0, 1.0 + libdevice.exp(-x))
    biased = scores + tl.load(bias_ptr + expert).to(tl.float32)  # the bias steers the choice only

    # A group's score: its best two biased scores (the first best removed once, so a tie counts twice).
    best = tl.max(biased, axis=1)
    best_at = tl.min(tl.where(biased == best[:, None], j[None, :], GROUP_SIZE), axis=1)
    second = tl.max(tl.where(j[None, :] == best_at[:, None], float("-inf"), biased), axis=1)
    group_score = best + second
    kept = g < 0
    for _ in tl.static_range(TOPK_GROUP):
        left = tl.where(kept, float("-inf"), group_score)
        top = tl.max(left, axis=0)
        kept = kept | (g == tl.min(tl.where(left == top, g, N_GROUP), axis=0))

    candidates = tl.where(kept[:, None], biased, float("-inf"))
    k = tl.arange(0, TOP_K)
    ids = k * 0
    chosen = tl.zeros((TOP_K,), dtype=tl.float32)
    for i in tl.static_range(TOP_K):
        top = tl.max(tl.max(candidates, axis=1), axis=0)
        pick = tl.min(tl.min(tl.where(candidates == top, expert, N_GROUP * GROUP_SIZE), axis=1), axis=0)
        ids = tl.where(k == i, pick, ids)
        chosen = tl.where(k == i, tl.sum(tl.sum(tl.where(expert == pick, scores, 0.0), axis=1), axis=0), chosen)
        candidates = tl.where(expert == pick, float("-inf"), candidates)
    weights = chosen / (tl.sum(chosen, axis=0) + 1e-20) * scaling
    tl.store(ids_ptr + t * TOP_K + k, ids)
    tl.store(weights_ptr + t * TOP_K + k, weights)
    local = ids - offset
    tl.atomic_add(counts_ptr + local, 1, mask=(local >= 0) & (local < num_local), sem="relaxed")


@triton.jit
def _group_kernel(ids_ptr, weights_ptr, counts_ptr, cursor_ptr, slot_token_ptr, slot_weight_ptr, slot_bounds_ptr,
                  tile_indptr_ptr, num_pairs, offset, num_local,
                  TOP_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_E: tl.constexpr):
    """Gives each local pair of this program's BLOCK_P pairs a slot in its expert's run of slots; the
    runs are in expert order, from the counts the routing made. Program 0 also writes each expert's
    first slot (slot_bounds [E + 1]) and first tile (tile_indptr [E + 1]).

    Within an expert the order of the slots is the order of the atomic increments, which varies from
    call to call; no value depends on it (a row's products do not depend on its tile neighbours, and
    the combine adds atomically in any case)."""
    offs_e = tl.arange(0, BLOCK_E)
    e_ok = offs_e < num_local
    counts = tl.load(counts_ptr + offs_e, mask=e_ok, other=0)
    starts = tl.cumsum(counts, axis=0) - counts
    p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    p_ok = p < num_pairs
    local = tl.load(ids_ptr + p, mask=p_ok, other=-1) - offset
    is_local = p_ok & (local >= 0) & (local < num_local)
    start = tl.sum(tl.where(local[:, None] == offs_e[None, :], starts[None, :], 0), axis=1)
    slot = start + tl.atomic_add(cursor_ptr + local, 1, mask=is_local, sem="relaxed")
    tl.store(slot_token_ptr + slot, (p // TOP_K).to(tl.int32), mask=is_local)
    tl.store(slot_weight_ptr + slot, tl.load(weights_ptr + p, mask=is_local, other=0.0), mask=is_local)
    if tl.program_id(0) == 0:
        tiles = (counts + BLOCK_M - 1) // BLOCK_M
        tl.store(slot_bounds_ptr + offs_e, starts, mask=e_ok)
        tl.store(slot_bounds_ptr + num_local, tl.sum(counts, axis=0))
        tl.store(tile_indptr_ptr + 1 + offs_e, tl.cumsum(tiles, axis=0), mask=e_ok)
        tl.store(tile_indptr_ptr, 0)


GROUP_BLOCK_P = 256  # pairs per program of _group_kernel


def _route_and_group(logits, bias, offset, local_experts, scaling, block_m, key=None, stream=None):
    """Routing and grouping on the device, fixed sizes only: every local pair's slot in expert order
    (the token and routing weight of each slot), each expert's first slot (and, at index E, the end of
    the local slots) and each expert's first tile ([E + 1]); also the ids [T, 8] and weights [T, 8]."""
    device = logits.device
    tokens, experts = logits.shape
    pairs = tokens * TOP_K
    ids = torch.empty((tokens, TOP_K), dtype=torch.int32, device=device)
    weights = torch.empty((tokens, TOP_K), dtype=torch.float32, device=device)
    counters = torch.zeros(2 * local_experts, dtype=torch.int32, device=device)  # counts, then cursors
    _launch(_route_kernel, "route", tokens, key, stream, (
        logits, bias, ids, weights, counters, offset, local_experts, scaling,
        N_GROUP, experts // N_GROUP, TOPK_GROUP, TOP_K, device.type == "cpu"), num_warps=1)
    slot_token = torch.empty(pairs, dtype=torch.int32, device=device)  # only the first bounds[E] are written
    slot_weight = torch.empty(pairs, dtype=torch.float32, device=device)
    slot_bounds = torch.empty(local_experts + 1, dtype=torch.int32, device=device)
    tile_indptr = torch.empty(local_experts + 1, dtype=torch.int32, device=device)
    _launch(_group_kernel, "group", _cdiv(pairs, GROUP_BLOCK_P), key, stream, (
        ids, weights, counters, counters[local_experts:], slot_token, slot_weight, slot_bounds, tile_indptr,
        pairs, offset, local_experts, TOP_K, block_m, GROUP_BLOCK_P, _pow2(local_experts)), num_warps=4)
    return slot_token, slot_weight, slot_bounds, tile_indptr, ids, weights


def _k_per_split(k, splits):
    """K of one split: whole 128-wide scale blocks (so also whole BLOCK_K steps); the last split may
    be shorter, or empty."""
    return _cdiv(_cdiv(k, QBLOCK), splits) * QBLOCK


def run(routing_logits, routing_bias, hidden_states, hidden_states_scale, gemm1_weights, gemm1_weights_scale,
        gemm2_weights, gemm2_weights_scale, local_expert_offset, routed_scaling_factor):
    device = hidden_states.device
    tokens, hidden = hidden_states.shape
    local_experts = gemm1_weights.shape[0]
    inter = gemm2_weights.shape[2]
    interpret = device.type == "cpu"  # CPU tensors mean Triton's interpreter
    offset = int(local_expert_offset)

    logits, bias = routing_logits.contiguous(), routing_bias.contiguous()
    a, a_scale = hidden_states.contiguous(), hidden_states_scale.contiguous()
    w13, s13 = gemm1_weights.contiguous(), gemm1_weights_scale.contiguous()
    w2, s2 = gemm2_weights.contiguous(), gemm2_weights_scale.contiguous()
    tensors = (a, logits, bias, a_scale, w13, s13, w2, s2)
    key = _call_key(tensors, *logits.shape, hidden, inter, local_experts, offset, *a_scale.shape, *s13.shape,
                    *s2.shape, *w13.shape, *w2.shape)
    stream = _stream(key)
    slot_token, slot_weight, slot_bounds, tile_indptr, _, _ = _route_and_group(
        logits, bias, offset, local_experts, float(routed_scaling_factor), BLOCK_M, key, stream)
    pairs = tokens * TOP_K
    max_tiles = min(pairs, _cdiv(pairs, BLOCK_M) + local_experts)  # every expert's last tile may be partial
    block_e = _pow2(local_experts)

    # Slot rows (only the local ones are written): C, or with K split the up and gate sums.
    if SPLIT_K1 > 1:
        inner = torch.zeros((pairs, 2 * inter), dtype=torch.float32, device=device)
    else:
        inner = torch.empty((pairs, inter), dtype=torch.float32, device=device)
    slices1 = _cdiv(inter, BLOCK_N)
    _launch(_gemm1_swiglu_kernel, "gemm1", max_tiles * slices1 * SPLIT_K1, key, stream, (
        a, a_scale, w13, s13, inner, tile_indptr, slot_bounds, slot_token,
        tokens, hidden, inter, local_experts, slices1, SPLIT_K1, _k_per_split(hidden, SPLIT_K1),
        w13.stride(0), w13.stride(1), s13.stride(0), s13.stride(1), inner.stride(0),
        BLOCK_M, BLOCK_N, BLOCK_K, QBLOCK, block_e, SPLIT_K1 > 1, SWAP_AB, interpret),
        num_warps=NUM_WARPS, num_stages=NUM_STAGES)
    out = torch.zeros((tokens, hidden), dtype=torch.float32, device=device)
    slices2 = _cdiv(hidden, BLOCK_N)
    _launch(_gemm2_kernel, "gemm2", max_tiles * slices2 * SPLIT_K2, key, stream, (
        inner, w2, s2, out, slot_weight, slot_token, tile_indptr, slot_bounds,
        hidden, inter, local_experts, slices2, SPLIT_K2, _k_per_split(inter, SPLIT_K2),
        inner.stride(0), w2.stride(0), w2.stride(1), s2.stride(0), s2.stride(1), out.stride(0),
        BLOCK_M, BLOCK_N, BLOCK_K, QBLOCK, block_e, SPLIT_K1 > 1, GEMM2_PRECISION == "tf32", SWAP_AB, interpret),
        num_warps=NUM_WARPS, num_stages=NUM_STAGES)
    return out.to(torch.bfloat16)
