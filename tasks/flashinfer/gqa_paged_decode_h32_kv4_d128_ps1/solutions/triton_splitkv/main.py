"""GQA paged decode (32 query heads, 4 KV heads, head dim 128, page size 1): split-KV in two Triton kernels.

The sequence of every request is cut into pieces of `chunk` tokens, and one program of the split
kernel handles one (piece, KV head): it holds the 8 query heads of its KV head as the rows of its
tiles (padded to the 16 rows tl.dot needs), so every K and V row is loaded once for all 8, and walks
the piece's page ids tile by tile with an online softmax in base 2. The chunk is chosen on the host
from what the host knows without reading the page table (the number of requests and the total
number of tokens, i.e. the length of kv_indices), so that the pieces of all requests together give
about PROGRAMS_PER_SM programs per SM whatever the split of tokens over requests: a skewed batch,
where one request holds most of the tokens, is spread over the SMs as well as an even one. No
device-to-host copy: each program finds its (request, piece) from kv_indptr itself, by a prefix sum
of the pieces per request.

A request that fits in one piece is finished by the split kernel (output and lse written directly);
when every request must fit in one (kv_indices is no longer than a chunk), the split kernel runs one
program per request and KV head, writes empty requests too, and the merge is not launched.
The merge kernel, one program per (request, query head), combines the partial outputs of a request
cut into several pieces by their lse, and writes 0 and -inf for an empty request.

Host work counts: FlashInfer-Bench times run() as a call, and at these sizes the host's part of a
call (its Python and the launches) is longer than the kernels. So run() does plain integer arithmetic
(no constexpr helpers of Triton's), no autograd context, and after a call key's first launches goes
to the compiled kernels directly (DIRECT_LAUNCH below). Nothing cached depends on the inputs'
contents: the key is the sizes, sm_scale and the inputs' dtypes, device and 16-byte alignment.

The tunables below are read and rewritten by the offline policy; every choice passes the task's
tolerance on its own. Their defaults are the best of a coordinate sweep on the H200 over the
feedback workloads (docs/benchmarks.md, 2026-12-01).
"""

import torch
import triton
import triton.language as tl

# Tokens per step of a piece's walk: K and V tiles are [BLOCK_KV, 128] bf16, 8 KiB each at 32.
BLOCK_KV = 32  # tunable: [16, 32, 64, 128]
# How many split programs to aim for per SM (over all requests and KV heads); more programs mean
# shorter pieces (better balance, more latency hidden by other programs) but more partial outputs
# to write and merge (16 KiB of fp32 per piece against 256 bytes of K and V per token).
PROGRAMS_PER_SM = 2  # tunable: [1, 2, 4, 8, 16]
# The shortest piece, in tiles: below it a split costs more in partials and merging than it saves.
MIN_PIECE_TILES = 2  # tunable: [1, 2, 4, 8]
NUM_WARPS = 4  # tunable: [2, 4, 8]
# Software pipelining of the page walk. The page-id load feeding the K/V gathers costs stages:
# compiled for sm_90 by Triton 3.9, 2 to 4 stages keep one K/V tile in flight, 5 and 6 keep two.
NUM_STAGES = 5  # tunable: [1, 2, 3, 4, 5, 6]
# Operands of P·V (fp32 accumulation always): "fp16" rounds P to fp16 and converts V (exact for
# bf16 values between 6e-5 and 65504 in magnitude), "tf32" keeps P to 10 mantissa bits and V exact.
# bf16 P is not offered: its 8-bit mantissa puts a few in 100k output elements past the tolerance
# (the task's description; measured on the CPU with Hopper's rounding emulated).
PV_PRECISION = "fp16"  # tunable: ["fp16", "tf32"]
# Pieces combined per step of the merge, and its warps.
MERGE_BLOCK = 32  # tunable: [16, 32, 64]
MERGE_WARPS = 1  # tunable: [1, 2, 4]

LOG2E = 1.4426950408889634
H200_SMS = 132  # what the interpreter plans for, so the CPU exercises the GPU's splits
MAX_BLOCK_B = 1024  # requests read per step of the prefix sum over kv_indptr

_sm_counts: dict[int, int] = {}


# Host work per call (FlashInfer-Bench times run() as a call, host work included). True: after a
# kernel's first launch with a given call key (the sizes, sm_scale, and the inputs' dtypes, device
# and 16-byte alignment: everything the launches' arguments and Triton's specialization follow
# from), later launches with that key call the compiled kernel directly, skipping Triton's
# per-launch argument binding, specialization and cache lookup. False: every launch goes through
# Triton's JIT entry point. Launch hooks (profilers) and Triton's interpreter (the CPU) always do.
DIRECT_LAUNCH = True  # tunable: [True, False]

_CALL_KEYS: dict[tuple, int] = {}  # a call's key -> a small number standing for it in launch keys
_COMPILED: dict[tuple, tuple] = {}  # (kernel's name, call key's number) -> (launcher, its fixed arguments)


def _call_key(tensors, *sizes):
    """A number for everything a call's launches follow from besides the tensors' addresses and
    contents; None when launches go through Triton's entry point."""
    if not DIRECT_LAUNCH or not tensors[0].is_cuda:
        return None
    key = (*sizes, *[t.dtype for t in tensors], *[t.get_device() for t in tensors],
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


def _launch(fn, name, grid, call_key, stream, args, **options):
    """fn[grid](*args, **options): `args` are every parameter of fn in signature order, constexprs
    included (the compiled kernel takes them so), `options` only launch options (num_warps,
    num_stages, launch_pdl). Directly through the compiled kernel once this call key's first launch
    through Triton has compiled it."""
    hit = None if call_key is None else _COMPILED.get((name, call_key))
    if hit is None or _hooked():
        compiled = fn[grid](*args, **options)
        if call_key is not None and hit is None and compiled is not None:
            _COMPILED[(name, call_key)] = _direct(compiled)
        return
    launcher, fixed = hit
    launcher(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1, stream, *fixed, *args)


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
def _split_kernel(
    q_ptr, k_ptr, v_ptr, indptr_ptr, indices_ptr, out_ptr, lse_ptr, part_o_ptr, part_lse_ptr,
    batch, chunk, qk_scale,
    NUM_QO_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, BLOCK_H: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_KV: tl.constexpr, BLOCK_B: tl.constexpr,
    PV_PRECISION: tl.constexpr, SINGLE: tl.constexpr, INTERPRET: tl.constexpr,
):
    # KV heads fastest: the 4 programs of a piece run side by side, reading the same page ids and
    # neighbouring 256-byte parts of the same 1 KiB token rows.
    p = tl.program_id(0) // NUM_KV_HEADS
    kvh = tl.program_id(0) % NUM_KV_HEADS
    # Which request piece p belongs to. Pieces are numbered request by request, ceil(n / chunk) for
    # a request of n tokens (none for an empty one): the request is the number of requests whose
    # pieces all come before p (`batch` for a p past the last piece), `first` its first piece.
    # (Inline rather than a helper: the interpreter pays about a millisecond per helper call.)
    if SINGLE:  # no request is longer than a chunk: program p is request p, empty ones included
        b = p
        first = p
    else:
        b = 0
        first = 0
        carry = 0
        for b0 in range(0, batch, BLOCK_B):
            offs_b = b0 + tl.arange(0, BLOCK_B)
            b_ok = offs_b < batch
            b_lo = tl.load(indptr_ptr + offs_b, mask=b_ok, other=0)
            b_hi = tl.load(indptr_ptr + offs_b + 1, mask=b_ok, other=0)
            pieces = (b_hi - b_lo + chunk - 1) // chunk  # 0 on masked lanes
            before = b_ok & (carry + tl.cumsum(pieces, 0) <= p)
            b += tl.sum(before.to(tl.int32), 0)
            first += tl.sum(tl.where(before, pieces, 0), 0)
            carry += tl.sum(pieces, 0)
    if b < batch:  # programs past the last piece (the grid is an upper bound) do nothing
        lo = tl.load(indptr_ptr + b)
        hi = tl.load(indptr_ptr + b + 1)
        start = lo + (p - first) * chunk
        end = tl.minimum(start + chunk, hi)  # start < end but for an empty request (SINGLE only)

        offs_h = tl.arange(0, BLOCK_H)
        offs_d = tl.arange(0, HEAD_DIM)
        offs_n = tl.arange(0, BLOCK_KV)
        h_ok = offs_h < GROUP
        heads = kvh * GROUP + offs_h
        row = b.to(tl.int64) * NUM_QO_HEADS + heads  # (request, query head) rows of q, out and lse
        q = tl.load(q_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], mask=h_ok[:, None], other=0.0)
        if INTERPRET:
            # Triton's interpreter multiplies bf16 tiles as raw integers; fp32 products of bf16
            # values are exact, so upcasting is the same arithmetic.
            q = q.to(tl.float32)

        m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)  # running max, log2 units
        l_i = tl.zeros([BLOCK_H], tl.float32)
        acc = tl.zeros([BLOCK_H, HEAD_DIM], tl.float32)
        for n0 in range(start, end, BLOCK_KV):
            pos = n0 + offs_n
            ok = pos < end
            # Page size 1: one page id per token, loaded once and used for both K and V.
            page = tl.load(indices_ptr + pos, mask=ok, other=0).to(tl.int64)
            kv_rows = (page * NUM_KV_HEADS + kvh) * HEAD_DIM
            k = tl.load(k_ptr + kv_rows[:, None] + offs_d[None, :], mask=ok[:, None], other=0.0)
            v = tl.load(v_ptr + kv_rows[:, None] + offs_d[None, :], mask=ok[:, None], other=0.0)
            if INTERPRET:
                k = k.to(tl.float32)
            s = tl.dot(q, tl.trans(k)) * qk_scale
            s = tl.where(ok[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            alpha = tl.exp2(m_i - m_new)
            prob = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(prob, axis=1)
            # P·V with fp32 accumulation; the interpreter (which multiplies 16-bit tiles as raw
            # integers) gets the operands rounded the way the GPU rounds them, multiplied in fp32.
            if PV_PRECISION == "fp16":
                if INTERPRET:
                    pv = tl.dot(prob.to(tl.float16).to(tl.float32), v.to(tl.float16).to(tl.float32))
                else:
                    pv = tl.dot(prob.to(tl.float16), v.to(tl.float16))
            else:
                if INTERPRET:  # Hopper's tf32 tensor cores read only the top 19 bits of an fp32 operand
                    prob_tf32 = (prob.to(tl.uint32, bitcast=True) & 0xFFFFE000).to(tl.float32, bitcast=True)
                    pv = tl.dot(prob_tf32, v.to(tl.float32))
                else:
                    pv = tl.dot(prob, v.to(tl.float32), input_precision="tf32")
            acc = acc * alpha[:, None] + pv
            m_i = m_new

        # l_i >= 1 (the row's maximum contributes exp2(0)) but for an empty request (SINGLE only),
        # which gets 0 and lse -inf as the definition says (acc is 0 and m_i -inf).
        l_safe = tl.where(l_i > 0, l_i, 1.0)
        out = acc / l_safe[:, None]
        lse = m_i + tl.log2(l_safe)
        if hi - lo <= chunk:  # the request's only piece: final output, no merge
            tl.store(out_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], out.to(tl.bfloat16), mask=h_ok[:, None])
            tl.store(lse_ptr + row, lse, mask=h_ok)
        else:
            part = p.to(tl.int64) * NUM_QO_HEADS + heads
            tl.store(part_o_ptr + part[:, None] * HEAD_DIM + offs_d[None, :], out, mask=h_ok[:, None])
            tl.store(part_lse_ptr + part, lse, mask=h_ok)


@triton.jit
def _merge_kernel(
    indptr_ptr, out_ptr, lse_ptr, part_o_ptr, part_lse_ptr, chunk,
    NUM_QO_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_B: tl.constexpr, MERGE_BLOCK: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    n = (tl.load(indptr_ptr + b + 1) - tl.load(indptr_ptr + b) + chunk - 1) // chunk  # its pieces
    row = b.to(tl.int64) * NUM_QO_HEADS + h
    offs_d = tl.arange(0, HEAD_DIM)
    if n == 0:  # an empty request: output 0 and lse -inf, as the definition says
        tl.store(out_ptr + row * HEAD_DIM + offs_d, tl.zeros([HEAD_DIM], tl.bfloat16))
        tl.store(lse_ptr + row, float("-inf"))
    elif n > 1:  # (one piece: the split kernel wrote the result)
        first = 0  # pieces of the requests before b
        for b0 in range(0, b, BLOCK_B):
            offs_b = b0 + tl.arange(0, BLOCK_B)
            b_ok = offs_b < b
            b_lo = tl.load(indptr_ptr + offs_b, mask=b_ok, other=0)
            b_hi = tl.load(indptr_ptr + offs_b + 1, mask=b_ok, other=0)
            first += tl.sum((b_hi - b_lo + chunk - 1) // chunk, 0)
        offs_j = tl.arange(0, MERGE_BLOCK)
        # Two passes: the largest lse first (4 bytes a piece), then the weighted sum of the
        # partial outputs, so no running rescale of the [HEAD_DIM] accumulator is needed.
        top_j = tl.full([MERGE_BLOCK], float("-inf"), tl.float32)
        for j0 in range(0, n, MERGE_BLOCK):
            part = (first + j0 + offs_j).to(tl.int64) * NUM_QO_HEADS + h
            top_j = tl.maximum(top_j, tl.load(part_lse_ptr + part, mask=j0 + offs_j < n, other=float("-inf")))
        top = tl.max(top_j, 0)  # finite: every piece has a token
        den = tl.zeros([MERGE_BLOCK], tl.float32)
        acc = tl.zeros([HEAD_DIM], tl.float32)
        for j0 in range(0, n, MERGE_BLOCK):
            ok = j0 + offs_j < n
            part = (first + j0 + offs_j).to(tl.int64) * NUM_QO_HEADS + h
            w = tl.exp2(tl.load(part_lse_ptr + part, mask=ok, other=float("-inf")) - top)
            o_j = tl.load(part_o_ptr + part[:, None] * HEAD_DIM + offs_d[None, :], mask=ok[:, None], other=0.0)
            den += w
            acc += tl.sum(w[:, None] * o_j, 0)
        total = tl.sum(den, 0)  # >= 1: the piece with the largest lse weighs exp2(0)
        tl.store(out_ptr + row * HEAD_DIM + offs_d, (acc / total).to(tl.bfloat16))
        tl.store(lse_ptr + row, top + tl.log2(total))


def _num_sms(index: int) -> int:
    """The SM count of CUDA device `index` (asked once), or the H200's for the interpreter (-1)."""
    if index < 0:
        return H200_SMS
    if index not in _sm_counts:
        _sm_counts[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _sm_counts[index]


def plan(batch: int, tokens: int, num_kv_heads: int, sms: int) -> tuple[int, int]:
    """(chunk, pieces) from what the host knows without reading the page table; the split kernel's
    grid is pieces x KV heads programs.

    kv_indices holds every request's tokens, so its length `tokens` bounds their total; aiming at
    PROGRAMS_PER_SM programs per SM gives the chunk, a whole number of tiles. A request of n tokens
    has ceil(n / chunk) pieces, and summed over the requests that is at most
    (tokens + batch * (chunk - 1)) // chunk, and at most `tokens`: `pieces`, whatever the split."""
    per_kv_head = max(1, PROGRAMS_PER_SM * sms // num_kv_heads)
    chunk = max(MIN_PIECE_TILES, _cdiv(_cdiv(tokens, per_kv_head), BLOCK_KV)) * BLOCK_KV
    return chunk, min(tokens, (tokens + batch * (chunk - 1)) // chunk)


def run(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale):
    batch, num_qo_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_qo_heads // num_kv_heads
    q = q.contiguous()
    k_cache = k_cache.contiguous()
    v_cache = v_cache.contiguous()
    out = torch.empty_like(q)
    lse = torch.empty((batch, num_qo_heads), dtype=torch.float32, device=q.device)
    if batch == 0:
        return out, lse
    tokens = kv_indices.shape[0]
    device = q.get_device()  # -1: CPU tensors, which mean Triton's interpreter
    chunk, pieces = plan(batch, tokens, num_kv_heads, _num_sms(device))
    # Every request in one piece (the bound on tokens is within a chunk): one program per request and
    # KV head writes the result, empty requests included, and the merge is not launched. Decided from
    # shapes alone, like the plan, so a captured graph stays right for every split.
    single = tokens <= chunk
    block_b = min(MAX_BLOCK_B, _pow2(batch))
    interpret = device < 0
    # Partial outputs and lse of every piece, one allocation: [pieces, heads, dim] then [pieces, heads].
    rows = max(pieces, 1) * num_qo_heads
    work = torch.empty(rows * (head_dim + 1), dtype=torch.float32, device=q.device)
    part_o, part_lse = work[: rows * head_dim], work[rows * head_dim :]
    scale = float(sm_scale)
    key = _call_key((q, k_cache, v_cache, kv_indptr, kv_indices), batch, tokens, num_qo_heads, num_kv_heads,
                    head_dim, scale)
    stream = _stream(key)
    if pieces > 0 or single:
        _launch(_split_kernel, "split", ((batch if single else pieces) * num_kv_heads,), key, stream, (
            q, k_cache, v_cache, kv_indptr, kv_indices, out, lse, part_o, part_lse, batch, chunk, scale * LOG2E,
            num_qo_heads, num_kv_heads, group, max(16, _pow2(group)), head_dim, BLOCK_KV, block_b, PV_PRECISION,
            single, interpret), num_warps=NUM_WARPS, num_stages=NUM_STAGES)
    if single:
        return out, lse
    _launch(_merge_kernel, "merge", (batch, num_qo_heads), key, stream, (
        kv_indptr, out, lse, part_o, part_lse, chunk, num_qo_heads, head_dim, block_b, MERGE_BLOCK),
        num_warps=MERGE_WARPS)
    return out, lse
