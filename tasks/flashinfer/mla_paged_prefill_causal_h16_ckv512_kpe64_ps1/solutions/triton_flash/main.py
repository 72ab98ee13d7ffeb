"""Causal MLA paged prefill (16 heads, ckv 512, kpe 64, page size 1): a flash-attention tiling in
Triton, with a split over the keys and a merge where the query blocks alone cannot fill the GPU.

A query block is block_q consecutive queries of one request times the 16 heads: its tile rows are
(query, head) pairs, which are consecutive rows of q_nope viewed as [total_q * 16, 512], and every
row shares the one latent KV row per token. A program walks the block's visible keys in tiles of
block_n tokens: one page-id load per tile, one [block_n, 512] ckv and one [block_n, 64] kpe gather,
the ckv tile used both as keys (Q·Kᵀ over the 576-wide key, bf16 tensor cores, fp32 accumulation)
and as values (P·V), an online softmax in base 2. Causal tiles are skipped, not masked: the walk
ends at the block's last visible key, and only the tiles that the diagonal crosses are masked (a
loop of its own, so the loop of full tiles carries no mask at all).

Two tilings, chosen on the host from total_q alone. Small calls (fewer than LARGE_FROM_Q queries)
are latency-bound: one query a block (16 rows), 4 warps, short walks, many programs. Large calls
are compute-bound: 128-row blocks (8 queries), each computed by two programs that own 256 of the
512 value columns apiece. Triton lays a chain of two dots (Q·Kᵀ feeding P·V) out with every warp
along the rows, so a 64-row tile over 8 warps computed Q·Kᵀ twice and a 128 x 512 fp32 accumulator
does not fit in registers; 128 rows x 256 columns over 8 warps is 128 registers a thread, at the
price of each program computing the whole Q·Kᵀ (its own ckv columns, then the other program's).
P·V there takes P as the sum of two bf16 terms on the ckv tile as it is in shared memory instead of
converting each V tile to fp16 through registers (the H200 figures: docs/benchmarks.md).

Programs are numbered heaviest first (a request's last query block, which sees the most keys,
gets the lowest program id, so the long programs start in the first wave). Each program finds its
(request, block) from qo_indptr by a prefix sum on the device; the grid is an upper bound on the
number of blocks computed from shapes alone (total_q and the batch size), so no device-to-host
copy and one CUDA graph is right for every page table and every split of the lengths.

The key split is planned on the host from shapes alone as well: when the programs (blocks times
the value split) are fewer than PROGRAMS_PER_SM per SM, each block's visible range is cut into up
to `splits` pieces of whole tiles (at least MIN_SPLIT_TILES tiles each). A block that gets one
piece writes its output directly; the pieces of a block that gets several write fp32 partial
outputs and lse, and the merge kernel (one program per query token and slice of MERGE_DIM
columns) combines them by their lse. The merge is launched only when the plan splits at all.

The tunables below are read and rewritten by the offline policy; every choice passes the task's
tolerance on its own.
"""

from typing import NamedTuple

import torch
import triton
import triton.language as tl

# Two tilings, chosen per call from total_q alone (a shape, so one CUDA graph per shape still holds).
# Calls below LARGE_FROM_Q queries are latency-bound: small blocks, many programs, short walks.
# Larger calls are compute-bound: 128-row tiles whose value columns are split over two programs.
# Queries per block: tiles have BLOCK_Q * 16 rows.
BLOCK_Q = 1  # tunable: [1, 2, 4]
# Keys per tile: a [BLOCK_N, 512] ckv tile is 32 KiB of bf16 at 32.
BLOCK_N = 32  # tunable: [16, 32, 64]
NUM_WARPS = 4  # tunable: [4, 8]
NUM_STAGES = 2  # tunable: [1, 2, 3]
# Operands of P·V (fp32 accumulation always): "fp16" rounds P to fp16 and converts V (exact for
# bf16 values between 6e-5 and 65504 in magnitude; the tile of V goes through registers for it),
# "tf32" keeps P to 10 mantissa bits and V exact, "bf16x2" writes P as the sum of two bf16 terms
# (16 mantissa bits) and runs P·V twice on V as it is (no conversion, twice the tensor work). One
# bf16 P is not offered: its 8-bit mantissa puts a few in 100k output elements past the tolerance
# (measured on the CPU with Hopper's rounding emulated).
PV_PRECISION = "fp16"  # tunable: ["fp16", "tf32", "bf16x2"]
# Programs per query block, each with 512 / VALUE_SPLIT of the value columns; each computes the whole
# Q·Kᵀ (its own columns of ckv, then the others'), so 2 costs half again the tensor work and halves
# the accumulator: 128 rows x 256 columns of fp32 is 128 registers a thread over 8 warps.
VALUE_SPLIT = 1  # tunable: [1, 2]
# The large tiling, from LARGE_FROM_Q queries in the call: its value split is always 2 (at 1, a
# 128 x 512 fp32 accumulator takes 256 KiB of shared memory to store, past the H200's 227 KiB).
# Every combination fits (the Q tile stays in shared memory: 144 KiB at 128 rows).
LARGE_FROM_Q = 512  # tunable: [1, 256, 512, 1024, 2048]
LARGE_BLOCK_Q = 8  # tunable: [4, 8]
LARGE_BLOCK_N = 32  # tunable: [16, 32]
LARGE_NUM_WARPS = 8  # tunable: [4, 8]
LARGE_NUM_STAGES = 2  # tunable: [1, 2]
LARGE_PV_PRECISION = "bf16x2"  # tunable: ["fp16", "bf16x2"]
# Programs per SM the key split aims at when the programs (blocks x value split) are fewer;
# MAX_SPLITS = 1 never splits. A piece is at least MIN_SPLIT_TILES tiles: shorter ones cost more in
# partials (32 KiB of fp32 a query) and merging than they save.
PROGRAMS_PER_SM = 2  # tunable: [1, 2, 4]
MAX_SPLITS = 8  # tunable: [1, 4, 8, 16]
MIN_SPLIT_TILES = 4  # tunable: [2, 4, 8]
# Output columns per merge program, and its warps.
MERGE_DIM = 512  # tunable: [128, 256, 512]
MERGE_WARPS = 8  # tunable: [2, 4, 8]

LOG2E = 1.4426950408889634
H200_SMS = 132  # the plan on a CPU (Triton's interpreter) is the H200's, so CPU tests split and merge alike
MAX_BLOCK_B = 1024  # requests read per step of the prefix sum over qo_indptr

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
def _scores(qn_o, qn_x, qp, kc_o, kc_x, kp, qk_scale, VALUE_SPLIT: tl.constexpr, INTERPRET: tl.constexpr):
    # Q·Kᵀ over the 576-wide key in base-2 units: the program's own value columns of ckv, the other
    # program's (VALUE_SPLIT 2), then kpe.
    if INTERPRET:
        # Triton's interpreter multiplies bf16 tiles as raw integers; fp32 products of bf16 values are
        # exact, so upcasting is the same arithmetic.
        sc = tl.dot(qn_o, tl.trans(kc_o.to(tl.float32)))
        if VALUE_SPLIT > 1:
            sc = tl.dot(qn_x, tl.trans(kc_x.to(tl.float32)), sc)
        sc = tl.dot(qp, tl.trans(kp.to(tl.float32)), sc)
    else:
        sc = tl.dot(qn_o, tl.trans(kc_o))
        if VALUE_SPLIT > 1:
            sc = tl.dot(qn_x, tl.trans(kc_x), sc)
        sc = tl.dot(qp, tl.trans(kp), sc)
    return sc * qk_scale


@triton.jit
def _pv(acc, prob, v, PV_PRECISION: tl.constexpr, INTERPRET: tl.constexpr):
    # acc + P·V with fp32 accumulation; the interpreter gets the operands rounded the way the GPU
    # rounds them, then multiplied in fp32.
    if PV_PRECISION == "bf16x2":  # P as the sum of two bf16 terms (16 mantissa bits), V as it is
        p_hi = prob.to(tl.bfloat16)
        p_lo = (prob - p_hi.to(tl.float32)).to(tl.bfloat16)
        if INTERPRET:
            vf = v.to(tl.float32)
            acc = tl.dot(p_lo.to(tl.float32), vf, tl.dot(p_hi.to(tl.float32), vf, acc))
        else:
            acc = tl.dot(p_lo, v, tl.dot(p_hi, v, acc))
    elif PV_PRECISION == "fp16":
        if INTERPRET:
            acc = tl.dot(prob.to(tl.float16).to(tl.float32), v.to(tl.float16).to(tl.float32), acc)
        else:
            acc = tl.dot(prob.to(tl.float16), v.to(tl.float16), acc)
    else:
        if INTERPRET:  # Hopper's tf32 tensor cores read only the top 19 bits of an fp32 operand
            prob_tf32 = (prob.to(tl.uint32, bitcast=True) & 0xFFFFE000).to(tl.float32, bitcast=True)
            acc = tl.dot(prob_tf32, v.to(tl.float32), acc)
        else:
            acc = tl.dot(prob, v.to(tl.float32), acc, input_precision="tf32")
    return acc


@triton.jit
def _attend_kernel(
    qn_ptr, qp_ptr, ckv_ptr, kpe_ptr, qo_indptr_ptr, kv_indptr_ptr, indices_ptr,
    out_ptr, lse_ptr, part_o_ptr, part_lse_ptr, pieces_ptr,
    batch, num_blocks, splits, min_piece, total_rows, qk_scale,
    NUM_HEADS: tl.constexpr, DIM_CKV: tl.constexpr, DIM_KPE: tl.constexpr, BLOCK_Q: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr, ONE_REQUEST: tl.constexpr, PV_PRECISION: tl.constexpr,
    VALUE_SPLIT: tl.constexpr, INTERPRET: tl.constexpr,
):
    # Heaviest first: program 0 takes the last block of the numbering, a request's last block.
    p = num_blocks - 1 - tl.program_id(0)
    s = tl.program_id(1)  # this program's piece of the block's keys
    v = tl.program_id(2)  # this program's share of the value columns
    DIM_V: tl.constexpr = DIM_CKV // VALUE_SPLIT
    # Which (request, block) p is. Blocks are numbered request by request, ceil(q_len / BLOCK_Q) for
    # a request (none without queries): the request is the number of requests whose blocks all come
    # before p (`batch` for a p past the last block), `first` its first block. Inline, not a helper:
    # the interpreter pays about a millisecond per helper call.
    if ONE_REQUEST:
        b = 0
        first = 0
    else:
        b = 0
        first = 0
        carry = 0
        for b0 in range(0, batch, BLOCK_B):
            offs_b = b0 + tl.arange(0, BLOCK_B)
            b_ok = offs_b < batch
            b_lo = tl.load(qo_indptr_ptr + offs_b, mask=b_ok, other=0)
            b_hi = tl.load(qo_indptr_ptr + offs_b + 1, mask=b_ok, other=0)
            blocks = (b_hi - b_lo + BLOCK_Q - 1) // BLOCK_Q  # 0 on masked lanes
            before = b_ok & (carry + tl.cumsum(blocks, 0) <= p)
            b += tl.sum(before.to(tl.int32), 0)
            first += tl.sum(tl.where(before, blocks, 0), 0)
            carry += tl.sum(blocks, 0)
    q_start = tl.load(qo_indptr_ptr + b, mask=b < batch, other=0)
    q_len = tl.load(qo_indptr_ptr + b + 1, mask=b < batch, other=0) - q_start
    i0 = (p - first) * BLOCK_Q  # the block's first query within its request
    # Programs past the last block (the grid is an upper bound) do nothing.
    if (b < batch) & (i0 < q_len):
        kv_start = tl.load(kv_indptr_ptr + b)
        kv_len = tl.load(kv_indptr_ptr + b + 1) - kv_start
        prefix = kv_len - q_len
        n_q = tl.minimum(BLOCK_Q, q_len - i0)  # queries in this block
        end = prefix + i0 + n_q  # keys the block's last query sees
        # Keys every query of the block sees, in whole tiles: those tiles need no mask.
        full_end = (prefix + i0 + 1) // BLOCK_N * BLOCK_N
        # This block's pieces: `splits` at most, whole tiles, min_piece tokens at least.
        piece = tl.maximum(min_piece, (end + splits * BLOCK_N - 1) // (splits * BLOCK_N) * BLOCK_N)
        n_pieces = (end + piece - 1) // piece
        lo = s * piece
        if lo < end:
            hi = tl.minimum(lo + piece, end)
            rows = tl.arange(0, BLOCK_Q * NUM_HEADS)
            qi = i0 + rows // NUM_HEADS  # the row's query within its request
            row_ok = rows < n_q * NUM_HEADS
            visible = prefix + qi + 1  # keys the row may see
            grow = (q_start + i0).to(tl.int64) * NUM_HEADS + rows  # row of q, out and lse
            lse_ok = row_ok & (rows * 0 + v == 0)  # one program of a row's value split writes its lse
            offs_o = v * DIM_V + tl.arange(0, DIM_V)  # this program's value columns
            offs_x = (1 - v) * DIM_V + tl.arange(0, DIM_V)  # the other program's (VALUE_SPLIT 2)
            offs_p = tl.arange(0, DIM_KPE)
            offs_n = tl.arange(0, BLOCK_N)
            qn_o = tl.load(qn_ptr + grow[:, None] * DIM_CKV + offs_o[None, :], mask=row_ok[:, None], other=0.0)
            qn_x = qn_o
            if VALUE_SPLIT > 1:
                qn_x = tl.load(qn_ptr + grow[:, None] * DIM_CKV + offs_x[None, :], mask=row_ok[:, None], other=0.0)
            qp = tl.load(qp_ptr + grow[:, None] * DIM_KPE + offs_p[None, :], mask=row_ok[:, None], other=0.0)
            if INTERPRET:
                qn_o = qn_o.to(tl.float32)
                qn_x = qn_x.to(tl.float32)
                qp = qp.to(tl.float32)

            m_i = tl.full([BLOCK_Q * NUM_HEADS], float("-inf"), tl.float32)  # running max, log2 units
            l_i = tl.zeros([BLOCK_Q * NUM_HEADS], tl.float32)
            acc = tl.zeros([BLOCK_Q * NUM_HEADS, DIM_V], tl.float32)
            # Tiles below the diagonal: every row sees every key, no mask, no bounds.
            for n0 in range(lo, tl.minimum(hi, full_end), BLOCK_N):
                page = tl.load(indices_ptr + kv_start + n0 + offs_n).to(tl.int64)
                kc_o = tl.load(ckv_ptr + page[:, None] * DIM_CKV + offs_o[None, :])
                kc_x = kc_o
                if VALUE_SPLIT > 1:
                    kc_x = tl.load(ckv_ptr + page[:, None] * DIM_CKV + offs_x[None, :])
                kp = tl.load(kpe_ptr + page[:, None] * DIM_KPE + offs_p[None, :])
                sc = _scores(qn_o, qn_x, qp, kc_o, kc_x, kp, qk_scale, VALUE_SPLIT, INTERPRET)
                m_new = tl.maximum(m_i, tl.max(sc, axis=1))
                alpha = tl.exp2(m_i - m_new)
                prob = tl.exp2(sc - m_new[:, None])
                l_i = l_i * alpha + tl.sum(prob, axis=1)
                acc = _pv(acc * alpha[:, None], prob, kc_o, PV_PRECISION, INTERPRET)
                m_i = m_new
            # Tiles the diagonal crosses: a row sees keys up to prefix + its query.
            for n0 in range(tl.maximum(lo, full_end), hi, BLOCK_N):
                pos = n0 + offs_n
                ok = pos < hi
                page = tl.load(indices_ptr + kv_start + pos, mask=ok, other=0).to(tl.int64)
                kc_o = tl.load(ckv_ptr + page[:, None] * DIM_CKV + offs_o[None, :], mask=ok[:, None], other=0.0)
                kc_x = kc_o
                if VALUE_SPLIT > 1:
                    kc_x = tl.load(ckv_ptr + page[:, None] * DIM_CKV + offs_x[None, :], mask=ok[:, None], other=0.0)
                kp = tl.load(kpe_ptr + page[:, None] * DIM_KPE + offs_p[None, :], mask=ok[:, None], other=0.0)
                sc = _scores(qn_o, qn_x, qp, kc_o, kc_x, kp, qk_scale, VALUE_SPLIT, INTERPRET)
                sc = tl.where((pos[None, :] < visible[:, None]) & ok[None, :], sc, float("-inf"))
                m_new = tl.maximum(m_i, tl.max(sc, axis=1))
                # A row that has seen nothing yet keeps m = -inf (a piece past its diagonal);
                # subtracting 0 instead keeps it NaN-free.
                m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
                alpha = tl.exp2(m_i - m_sub)
                prob = tl.exp2(sc - m_sub[:, None])
                l_i = l_i * alpha + tl.sum(prob, axis=1)
                acc = _pv(acc * alpha[:, None], prob, kc_o, PV_PRECISION, INTERPRET)
                m_i = m_new

            # l_i = 0 only for a row that sees nothing of this piece (lse -inf; the merge weighs it 0).
            seen = l_i > 0
            l_safe = tl.where(seen, l_i, 1.0)
            out = acc / l_safe[:, None]
            lse = tl.where(seen, m_i + tl.log2(l_safe), float("-inf"))
            if n_pieces == 1:  # the block's only piece: final output, no merge
                tl.store(out_ptr + grow[:, None] * DIM_CKV + offs_o[None, :], out.to(tl.bfloat16),
                         mask=row_ok[:, None])
                tl.store(lse_ptr + grow, lse, mask=lse_ok)
            else:
                part = s.to(tl.int64) * total_rows + grow
                tl.store(part_o_ptr + part[:, None] * DIM_CKV + offs_o[None, :], out, mask=row_ok[:, None])
                tl.store(part_lse_ptr + part, lse, mask=lse_ok)
            if (s == 0) & (v == 0) & (splits > 1):  # tell the merge how many pieces each query of the block has
                offs_q = tl.arange(0, BLOCK_Q)
                tl.store(pieces_ptr + q_start + i0 + offs_q, tl.full([BLOCK_Q], 0, tl.int32) + n_pieces,
                         mask=offs_q < n_q)


@triton.jit
def _merge_kernel(
    out_ptr, lse_ptr, part_o_ptr, part_lse_ptr, pieces_ptr, total_rows,
    NUM_HEADS: tl.constexpr, DIM_CKV: tl.constexpr, MERGE_DIM: tl.constexpr, BLOCK_S: tl.constexpr,
):
    t = tl.program_id(0)  # a query token, all its heads
    d0 = tl.program_id(1) * MERGE_DIM
    n = tl.load(pieces_ptr + t)
    if n > 1:  # (one piece: the attention kernel wrote the result)
        offs_h = tl.arange(0, NUM_HEADS)
        offs_d = d0 + tl.arange(0, MERGE_DIM)
        offs_s = tl.arange(0, BLOCK_S)
        row = t.to(tl.int64) * NUM_HEADS + offs_h
        s_ok = offs_s < n
        part = offs_s[:, None].to(tl.int64) * total_rows + row[None, :]  # [pieces, heads]
        lse_s = tl.load(part_lse_ptr + part, mask=s_ok[:, None], other=float("-inf"))
        top = tl.max(lse_s, 0)  # finite: a query's first piece holds its first key
        w = tl.exp2(lse_s - top[None, :])  # 0 for a piece the row sees nothing of
        total = tl.sum(w, 0)  # >= 1
        acc = tl.zeros([NUM_HEADS, MERGE_DIM], tl.float32)
        for j in range(0, n):
            w_j = tl.sum(tl.where(offs_s[:, None] == j, w, 0.0), 0)  # [heads]
            o_j = tl.load(part_o_ptr + (j * total_rows + row)[:, None] * DIM_CKV + offs_d[None, :])
            acc += w_j[:, None] * o_j
        tl.store(out_ptr + row[:, None] * DIM_CKV + offs_d[None, :], (acc / total[:, None]).to(tl.bfloat16))
        if d0 == 0:
            tl.store(lse_ptr + row, top + tl.log2(total))


def _num_sms(index: int) -> int:
    """The SM count of CUDA device `index` (asked once), or the H200's for the interpreter (-1)."""
    if index < 0:
        return H200_SMS
    if index not in _sm_counts:
        _sm_counts[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _sm_counts[index]


class Tiling(NamedTuple):
    block_q: int
    block_n: int
    num_warps: int
    num_stages: int
    pv_precision: str
    value_split: int


def tiling(total_q: int) -> Tiling:
    """The tiling for a call of total_q queries: the large one from LARGE_FROM_Q queries on."""
    if total_q >= LARGE_FROM_Q:
        return Tiling(LARGE_BLOCK_Q, LARGE_BLOCK_N, LARGE_NUM_WARPS, LARGE_NUM_STAGES, LARGE_PV_PRECISION, 2)
    return Tiling(BLOCK_Q, BLOCK_N, NUM_WARPS, NUM_STAGES, PV_PRECISION, VALUE_SPLIT)


def plan(total_q: int, batch: int, tokens: int, sms: int) -> tuple[Tiling, int, int]:
    """(tiling, blocks, splits) from what the host knows without reading qo_indptr or kv_indptr.

    A request of q queries has ceil(q / block_q) blocks; summed over the requests that is at most
    (total_q + batch * (block_q - 1)) // block_q, and at most total_q: `blocks`, the grid's first
    axis, whatever the split. Splits when the programs (blocks times the value split) are fewer
    than PROGRAMS_PER_SM per SM, as many as fill them, no more than MAX_SPLITS, and no more than
    pieces of MIN_SPLIT_TILES tiles that the longest possible request (`tokens`, the length of
    kv_indices) holds."""
    t = tiling(total_q)
    blocks = min(total_q, (total_q + batch * (t.block_q - 1)) // t.block_q)
    if blocks == 0:
        return t, 0, 1
    target = PROGRAMS_PER_SM * sms
    splits = min(MAX_SPLITS, target // (blocks * t.value_split), _cdiv(tokens, MIN_SPLIT_TILES * t.block_n))
    return t, blocks, max(1, splits)


def run(q_nope, q_pe, ckv_cache, kpe_cache, qo_indptr, kv_indptr, kv_indices, sm_scale):
    total_q, num_heads, dim_ckv = q_nope.shape
    dim_kpe = q_pe.shape[-1]
    batch = qo_indptr.shape[0] - 1
    q_nope, q_pe = q_nope.contiguous(), q_pe.contiguous()
    # Page size 1: a page is a token, so the contiguous caches are [tokens, dim] rows as they are.
    ckv, kpe = ckv_cache.contiguous(), kpe_cache.contiguous()
    out = torch.empty_like(q_nope)
    lse = torch.empty((total_q, num_heads), dtype=torch.float32, device=q_nope.device)
    tokens = kv_indices.shape[0]
    device = q_nope.get_device()  # -1: CPU tensors, which mean Triton's interpreter
    t, blocks, splits = plan(total_q, batch, tokens, _num_sms(device))
    if blocks == 0:
        return out, lse
    total_rows = total_q * num_heads
    # Partial outputs and lse of every piece, and each query's number of pieces; only with a split.
    rows = total_rows if splits > 1 else 1
    work = torch.empty(splits * rows * (dim_ckv + 1), dtype=torch.float32, device=q_nope.device)
    part_o, part_lse = work[: splits * rows * dim_ckv], work[splits * rows * dim_ckv :]
    pieces = torch.empty(total_q if splits > 1 else 1, dtype=torch.int32, device=q_nope.device)
    scale = float(sm_scale)
    key = _call_key((q_nope, q_pe, ckv, kpe, qo_indptr, kv_indptr, kv_indices), total_q, batch, tokens, num_heads,
                    dim_ckv, dim_kpe, scale)
    stream = _stream(key)
    _launch(_attend_kernel, "attend", (blocks, splits, t.value_split), key, stream, (
        q_nope, q_pe, ckv, kpe, qo_indptr, kv_indptr, kv_indices, out, lse, part_o, part_lse, pieces,
        batch, blocks, splits, MIN_SPLIT_TILES * t.block_n if splits > 1 else 1 << 30, total_rows, scale * LOG2E,
        num_heads, dim_ckv, dim_kpe, t.block_q, t.block_n, min(MAX_BLOCK_B, _pow2(batch)), batch == 1,
        t.pv_precision, t.value_split, device < 0), num_warps=t.num_warps, num_stages=t.num_stages)
    if splits > 1:
        _launch(_merge_kernel, "merge", (total_q, _cdiv(dim_ckv, MERGE_DIM)), key, stream, (
            out, lse, part_o, part_lse, pieces, total_rows, num_heads, dim_ckv, MERGE_DIM, _pow2(splits)),
            num_warps=MERGE_WARPS)
    return out, lse
