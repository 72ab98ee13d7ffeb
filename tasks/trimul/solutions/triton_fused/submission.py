"""TriMul (outgoing triangle multiplicative update) in four Triton kernels, GPUMode format.

For x [B,N,N,D], rows r = (b, i, j) of the pair map and H = 128 hidden channels:
  1. _layernorm_kernel: LayerNorm over D (fp32 statistics), x̂ written once in fp16.
  2. _project_kernel: the five projections on fp16 tensor cores (fp32 accumulation), each program
     one pair (a projection and its gate, or two halves of the output gate) as a [channels x rows]
     tile, with gating and the mask fused into the epilogue. left, right and the output gate
     σ(x̂·W_ogᵀ) are written once, in fp16, as [B,H,N,N]: the layout the contraction reads.
  3. _contract_kernel: O[b,h] = L[b,h] @ R[b,h]ᵀ on fp16 tensor cores, fp32 accumulation.
  4. _output_kernel: LayerNorm over H of O, affine, times the output gate, then the output
     projection on fp16 tensor cores; y is written once, in fp32.
x is read once and y written once; every intermediate is written once and read once from memory
(the five projection programs of one row block read its x̂ from L2 after the first).
On Hopper the tiles move through TMA descriptors where the shapes allow (the *_TMA tunables).

Host work per call (what a call costs the host is most of it on small shapes): after a call key's
first call through Triton's entry point, the four kernels are launched through Triton 3.6's compiled
launcher directly, with descriptors encoded once per address and integer pointers (DIRECT_LAUNCH,
DESC_CACHE, CALL_KEY, RAW_POINTERS, ONE_WORKSPACE below). Nothing kept between calls depends on what
the inputs hold; outputs and intermediates are allocated fresh on every call.

Why fp16 (10-bit mantissa) and not bf16: the operands are LayerNorm outputs or products of them,
well inside fp16's range, and bf16's 7-bit mantissa in the projections used up to ~90% of the
tolerance on an H200. Accumulation is always fp32. O is stored in fp16 by default: its values, sums of
N products of gated projections, stayed within fp16's range (65504) on every workload of the task
on an H200, and LayerNorm over H follows; O_DTYPE="fp32" is the choice for inputs of another scale.

The tunables below are read and rewritten by the offline policy; every choice passes the task's
tests (tests/test_trimul_task.py runs each one in Triton's interpreter). Measured and dropped on an
H200 (docs/benchmarks.md): all five projections in one program (five accumulators, 255 registers),
row-major [rows x channels] tiles, and LayerNorm computed inside the projection kernel."""

import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction
from triton.tools.tensor_descriptor import TensorDescriptor

# 1. LayerNorm over D: whole rows per program.
LN_BLOCK_M = 16  # tunable: [4, 8, 16]
LN_WARPS = 4  # tunable: [4, 8]
# 2. projections: rows of x per program, the D chunk per step, hidden channels per projection.
# 256 rows read each pair's weights half as often (every row block reads them all from L2); with
# 4 warps its two accumulators spill (sm_90: 255 registers, 1 KB of stack), with 8 warps they do not,
# but on an H200 256 rows at 8 warps were 1.18x slower than the default (docs/benchmarks.md).
PROJ_BLOCK_M = 128  # tunable: [64, 128, 256]
PROJ_BLOCK_K = 64  # tunable: [32, 64]
PROJ_BLOCK_H = 64  # tunable: [32, 64]
PROJ_WARPS = 4  # tunable: [4, 8]
PROJ_STAGES = 2  # tunable: [2, 3, 4]
# True: x̂ and the weights are loaded, and the tiles stored, through TMA descriptors where the
# shapes allow it (rows of 16-byte multiples; for the stores, N*N a multiple of PROJ_BLOCK_M).
PROJ_TMA = True  # tunable: [False, True]
# 3. the triangle contraction's tiles.
BLOCK_M = 128  # tunable: [64, 128]
BLOCK_N = 128  # tunable: [64, 128, 256]
BLOCK_K = 64  # tunable: [32, 64, 128]
NUM_WARPS = 4  # tunable: [4, 8]
NUM_STAGES = 3  # tunable: [2, 3, 4, 5]
# True: the contraction's tiles move through TMA descriptors, where N allows it (rows of 16-byte
# multiples); False: pointer loads.
CONTRACT_TMA = True  # tunable: [False, True]
# How O (the contraction's result) is stored between kernels 3 and 4.
O_DTYPE = "fp16"  # tunable: ["fp16", "fp32"]
# 4. output: rows per program and the D chunk of the output projection per step.
OUT_BLOCK_M = 128  # tunable: [32, 64, 128, 256]
OUT_BLOCK_D = 64  # tunable: [32, 64, 128]
OUT_WARPS = 4  # tunable: [4, 8]
# True: O, the output gate and y move through TMA descriptors, where the shapes allow it (a row
# block within one batch element, rows of 16-byte multiples); False: pointer loads and stores.
OUT_TMA = True  # tunable: [False, True]
# Host work. True: after a kernel's first launch with a given key (the arguments' dtypes and 16-byte
# alignment, every integer and descriptor shape: more than Triton specializes on), later launches
# with the same key call the compiled kernel directly, skipping Triton's per-launch argument
# binding and cache lookup. False: every launch goes through Triton's JIT entry point.
DIRECT_LAUNCH = True  # tunable: [False, True]
# Host work. True (with DIRECT_LAUNCH, on Triton 3.6's launcher): a TMA descriptor is built once per
# (compiled kernel, argument, address, shape, strides) and handed to the compiled launcher as it is
# later: those are all a descriptor encodes, so it is right for any tensor at that address, whatever
# it holds. False: TensorDescriptor objects are made on every call and Triton's launcher encodes them
# on every launch.
DESC_CACHE = True  # tunable: [False, True]
# Host work. True (with DIRECT_LAUNCH): a call finds its compiled kernels by one key made once per call
# (the shapes, and each input tensor's dtype, device and 16-byte alignment: everything the launches'
# specializations follow from, since the rest is this file's own allocations and constants). False:
# each launch's key is made from every one of its arguments.
CALL_KEY = True  # tunable: [False, True]
# Host work. True (with CALL_KEY): once a call key's kernels have all been launched, later calls with it
# pass every pointer as an integer (no tensor views, no per-pointer check in the launcher: the first
# call's launches through Triton checked these inputs' kind) and look the stream up once per call.
# False: tensors, as Triton's entry point takes them.
RAW_POINTERS = True  # tunable: [False, True]
# Host work. True: the call's intermediates (packed weights, x̂, left, right, the output gate, O) are
# views of one allocation, made fresh on every call (nothing is returned from it); with RAW_POINTERS
# they are addresses in it, without views. False: one allocation each.
ONE_WORKSPACE = True  # tunable: [False, True]

EPS = 1e-5
_COMPILED: dict[tuple, object] = {}  # launch key -> Triton's compiled kernel (a _Compiled from its second launch)
_CALL_KEYS: dict[tuple, int] = {}  # a call's key -> a small number standing for it in the keys below
_READY: set[int] = set()  # call keys (their numbers) whose every kernel has been launched once (RAW_POINTERS)
_DESC_CACHE_SIZE = 32  # descriptors kept per kernel argument (addresses seen); past it the cache starts over


class _Desc(NamedTuple):
    """A TMA descriptor argument as the call describes it: elements of `dtype` from `base` (a tensor
    or, with RAW_POINTERS, its data pointer) with these shape and strides, in boxes of `block`. Made
    into a TensorDescriptor only where one is needed (Triton's own entry point, or a descriptor not
    seen at this address before)."""

    base: torch.Tensor | int
    dtype: torch.dtype
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    block: tuple[int, ...]

    def ptr(self) -> int:
        return self.base if isinstance(self.base, int) else self.base.data_ptr()

    def descriptor(self) -> TensorDescriptor:
        base = _Address(self.base, self.dtype) if isinstance(self.base, int) else self.base
        return TensorDescriptor(base, list(self.shape), list(self.strides), list(self.block))


class _Address:
    """A data pointer and dtype standing in for a tensor in a TensorDescriptor that is cached: the
    cache keeps no tensor alive (outputs and scratch are freed as usual)."""

    def __init__(self, ptr: int, dtype: torch.dtype) -> None:
        self.ptr, self.dtype = ptr, dtype

    def data_ptr(self) -> int:
        return self.ptr


def _spec(a):
    """What of one launch argument decides which compiled kernel serves it (never its contents)."""
    if isinstance(a, torch.Tensor):
        return (a.dtype, a.get_device(), a.data_ptr() % 16 == 0)
    if isinstance(a, _Desc):
        return (a.dtype, a.ptr() % 16 == 0, a.shape, a.strides, a.block)
    return (type(a), a)


def _jit_args(args):
    return [a.descriptor() if isinstance(a, _Desc) else a for a in args]


def _triton_36_launcher(kernel, n_desc: int):
    """(compiled launcher, descriptor metadata) of a compiled kernel with n_desc descriptor arguments
    when Triton wraps its launcher as Triton 3.6 does (`kernel.run.launch` is the launcher itself
    when there is no descriptor, else a wrapper that expands each descriptor with
    make_tensordesc_arg(desc, meta) on every launch); None for any other layout, and the kernel is
    then launched through `kernel.run` as before."""
    import triton.backends.nvidia.driver as nv

    run = kernel.run
    if getattr(nv, "_BASE_ARGS_FORMAT", None) != "iiiKKppOOOOOO" or run.global_scratch_size or run.profile_scratch_size:
        return None
    launch = run.launch
    code = getattr(launch, "__code__", None)
    if getattr(launch, "__qualname__", "") == "wrap_handle_tensordesc.<locals>.inner" and code is not None \
            and set(code.co_freevars) == {"launcher", "tensordesc_indices", "tensordesc_meta"}:
        cells = dict(zip(code.co_freevars, (c.cell_contents for c in launch.__closure__), strict=True))
        return cells["launcher"], list(cells["tensordesc_meta"])
    return (launch, []) if n_desc == 0 else None


def _hooked(hook) -> bool:
    """Whether a launch hook is set: Triton's knobs hold an empty HookChain when none is."""
    return hook is not None and bool(getattr(hook, "calls", True))


class _Compiled:
    """One compiled kernel and how this file launches it after its first launch through Triton."""

    def __init__(self, kernel, args) -> None:
        self.kernel = kernel
        self.desc_at = [i for i, a in enumerate(args) if isinstance(a, _Desc)]  # the same in every launch of a key
        n_desc = len(self.desc_at)
        self.direct = _triton_36_launcher(kernel, n_desc) if DESC_CACHE else None
        if self.direct is not None:
            import triton.backends.nvidia.driver as nv

            self.expand = nv.make_tensordesc_arg
            meta = self.direct[1] or [None] * n_desc
            if len(meta) != n_desc:
                raise RuntimeError(f"{kernel.name}: {n_desc} descriptor arguments, Triton's launcher expects {len(meta)}")
            self.meta = meta
            self.cache: list[dict] = [{} for _ in range(n_desc)]
            run = kernel.run
            self.fixed = (kernel.function, run.launch_cooperative_grid, run.launch_pdl, None, None,
                          kernel.packed_metadata, None, None, None)

    def _expanded(self, i: int, d: _Desc) -> list:
        """Descriptor i of the launch as the compiled launcher takes it, built once per address."""
        cache = self.cache[i]
        key = (d.ptr(), d.shape, d.strides)
        hit = cache.get(key)
        if hit is None:
            if len(cache) >= _DESC_CACHE_SIZE:
                cache.clear()
            desc = TensorDescriptor(_Address(key[0], d.dtype), list(d.shape), list(d.strides), list(d.block))
            hit = cache[key] = self.expand(desc, self.meta[i])
        return hit

    def launch(self, grid, stream, args) -> None:
        hooks = triton.knobs.runtime
        g = (*grid, 1, 1)
        if self.direct is None or _hooked(hooks.launch_enter_hook) or _hooked(hooks.launch_exit_hook):
            jit = _jit_args(args)
            kernel = self.kernel
            kernel.run(g[0], g[1], g[2], stream, kernel.function, kernel.packed_metadata,
                       kernel.launch_metadata(grid, stream, *jit), hooks.launch_enter_hook, hooks.launch_exit_hook,
                       *jit)
            return
        flat, prev = [], 0
        for i, at in enumerate(self.desc_at):
            flat += args[prev:at]
            flat += self._expanded(i, args[at])
            prev = at + 1
        flat += args[prev:]
        self.direct[0](g[0], g[1], g[2], stream, *self.fixed, *flat)


def _launch(fn, grid, args, key=None, stream=None, **meta):
    """fn[grid](*args, **meta). `args` are every parameter of fn in order, constexprs included (the
    compiled kernel takes the bound arguments in signature order), TMA descriptors as _Desc; `meta`
    holds only launch options (num_warps, num_stages). `key`, when given, decides which compiled
    kernel serves the launch (it must follow from everything Triton specializes on: see CALL_KEY);
    else it is made from every argument. `stream`, when given, is the current stream, and the key's
    kernel must have been launched before (the pointers may be integers, which Triton's entry point
    would compile a kernel for as such). Through Triton's own entry point the first time a key is
    seen, when DIRECT_LAUNCH is off and in Triton's interpreter (the CPU); launch hooks (profilers)
    see every launch."""
    if not DIRECT_LAUNCH or not isinstance(fn, JITFunction):
        fn[grid](*_jit_args(args), **meta)
        return
    if key is None:
        key = (fn, *map(_spec, args), *sorted(meta.items()))
    compiled = _COMPILED.get(key)
    if compiled is None:
        if stream is not None:
            raise RuntimeError(f"{fn.__name__}: a launch with raw pointers before the kernel was compiled")
        _COMPILED[key] = fn[grid](*_jit_args(args), **meta)  # wrapped at its second launch (it has run once)
        return
    if not isinstance(compiled, _Compiled):
        compiled = _COMPILED[key] = _Compiled(compiled, args)
    if stream is None:
        stream = _current_stream()
    compiled.launch(grid, stream, args)


def _current_stream():
    driver = triton.runtime.driver.active
    return driver.get_current_stream(driver.get_current_device())


def _call_key(tensors, ptrs, *sizes):
    """One key for a call's launches: its sizes and each input tensor's dtype, device and 16-byte
    alignment (what Triton specializes a pointer on; `ptrs` are the tensors' data pointers); None when
    CALL_KEY is off."""
    if not CALL_KEY:
        return None
    key = (*sizes, *[t.dtype for t in tensors], *[t.get_device() for t in tensors], *[p % 16 == 0 for p in ptrs])
    number = _CALL_KEYS.get(key)  # the long tuple is hashed once per call; the launches' keys use the number
    if number is None:
        number = _CALL_KEYS[key] = len(_CALL_KEYS)
    return number


def _key(name, call_key):
    """A launch's key under CALL_KEY: the kernel's name (a string hashes once; a JITFunction's hash is
    recomputed from its source key on every lookup) and the call's key."""
    return None if call_key is None else (name, call_key)


def _cdiv(a, b):  # triton.cdiv is a constexpr function: several microseconds a call on the host
    return -(-a // b)


@triton.jit
def _mma(a, b, acc, EMULATE: tl.constexpr):
    """acc + a @ b for fp16 a, b. Triton's interpreter (CPU) gets the same arithmetic in fp32:
    products of fp16 values are exact in fp32."""
    if EMULATE:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc)


@triton.jit
def _layernorm_kernel(x_ptr, w_ptr, b_ptr, xn_ptr, M, D, eps, LN_PROGRAMS,
                      w0, w1, w2, w3, w4, w5, pack_ptr, HD,
                      BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, PACK_BLOCK: tl.constexpr):
    """Programs [0, LN_PROGRAMS): LayerNorm over D of BLOCK_M whole rows (BLOCK_D >= D), statistics
    in fp32, written in fp16. The others copy the six weight matrices (HD elements each: the five
    input projections [H, D], then the output projection [D, H]) into one fp16 buffer, in that
    order: one launch instead of a concatenation and two casts."""
    pid = tl.program_id(0)
    if pid < LN_PROGRAMS:
        rows = pid.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
        ds = tl.arange(0, BLOCK_D)
        d_ok = ds < D
        ok = (rows < M)[:, None] & d_ok[None, :]
        x = tl.load(x_ptr + rows[:, None] * D + ds[None, :], mask=ok, other=0.0)
        mean = tl.sum(x, axis=1) / D
        centered = tl.where(ok, x - mean[:, None], 0.0)
        rstd = tl.rsqrt(tl.sum(centered * centered, axis=1) / D + eps)
        g = tl.load(w_ptr + ds, mask=d_ok, other=0.0)
        b = tl.load(b_ptr + ds, mask=d_ok, other=0.0)
        xn = centered * rstd[:, None] * g[None, :] + b[None, :]
        tl.store(xn_ptr + rows[:, None] * D + ds[None, :], xn.to(tl.float16), mask=ok)
    else:
        per = tl.cdiv(HD, PACK_BLOCK)
        which = (pid - LN_PROGRAMS) // per
        offs = ((pid - LN_PROGRAMS) % per) * PACK_BLOCK + tl.arange(0, PACK_BLOCK)
        in_w = offs < HD  # not `ok`: Triton joins a name bound in both branches, and the shapes differ
        src = w0
        if which == 1:
            src = w1
        if which == 2:
            src = w2
        if which == 3:
            src = w3
        if which == 4:
            src = w4
        if which == 5:
            src = w5
        v = tl.load(src + offs, mask=in_w, other=0.0)
        tl.store(pack_ptr + which.to(tl.int64) * HD + offs, v.to(tl.float16), mask=in_w)


@triton.jit
def _project_kernel(
    src_ptr, mask_ptr, w_ptr, left_ptr, right_ptr, gate_ptr, M, NN, D,
    src_desc, w_desc, left_desc, right_desc, gate_desc,
    H: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_H: tl.constexpr,
    TMA: tl.constexpr, TMA_STORE: tl.constexpr, EMULATE: tl.constexpr,
):
    """One pair of BLOCK_H-channel projections of BLOCK_M rows of x̂, as [channels x rows] tiles
    (weights times x̂ᵀ): rows are contiguous in left, right and the gate ([B, H, N*N]), so the
    tiles' contiguous axis is memory's. Programs are numbered job-first within a row block, so the
    jobs of one block run side by side and share its x̂ through L2: jobs [0, 2·H/BLOCK_H) are
    (side, channel block), a projection and its gate (side 0 left, 1 right); the last H/(2·BLOCK_H)
    are the output gate, 2·BLOCK_H channels each. With TMA_STORE (N*N a multiple of BLOCK_M, so a
    row block lies in one batch element) each tile is stored as one TMA box of the [B*H, N*N] view."""
    SIDE_JOBS: tl.constexpr = H // BLOCK_H
    JOBS: tl.constexpr = 2 * SIDE_JOBS + H // (2 * BLOCK_H)
    pid = tl.program_id(0)
    job = pid % JOBS
    row0 = (pid // JOBS) * BLOCK_M
    rows = row0.to(tl.int64) + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    is_gate = job >= 2 * SIDE_JOBS
    side = job // SIDE_JOBS
    h0 = (job % SIDE_JOBS) * BLOCK_H
    g0 = (job - 2 * SIDE_JOBS) * 2 * BLOCK_H
    # Weight rows, stacked as [left, right, left gate, right gate, out gate] x [H, D].
    first = tl.where(is_gate, 4 * H + g0, side * H + h0)
    second = tl.where(is_gate, 4 * H + g0 + BLOCK_H, (side + 2) * H + h0)
    cs = tl.arange(0, BLOCK_H)
    wa = w_ptr + (first + cs)[:, None].to(tl.int64) * D
    wb = w_ptr + (second + cs)[:, None].to(tl.int64) * D
    acc_a = tl.zeros((BLOCK_H, BLOCK_M), dtype=tl.float32)
    acc_b = tl.zeros((BLOCK_H, BLOCK_M), dtype=tl.float32)
    for k0 in range(0, D, BLOCK_K):
        if TMA:  # out-of-range rows and columns of the tiles read as zeros
            xt = src_desc.load([row0, k0]).T
            acc_a = _mma(w_desc.load([first, k0]), xt, acc_a, EMULATE)
            acc_b = _mma(w_desc.load([second, k0]), xt, acc_b, EMULATE)
        else:
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < D
            xt = tl.load(src_ptr + rows[None, :] * D + ks[:, None], mask=row_ok[None, :] & k_ok[:, None], other=0.0)
            acc_a = _mma(tl.load(wa + ks[None, :], mask=k_ok[None, :], other=0.0), xt, acc_a, EMULATE)
            acc_b = _mma(tl.load(wb + ks[None, :], mask=k_ok[None, :], other=0.0), xt, acc_b, EMULATE)
    b0 = row0 // NN  # with TMA_STORE, the batch element of every row of the block
    # A name bound in both branches of a runtime `if` must have one type in both (the compiler
    # refuses it, the interpreter does not): hence gate_offs here and offs below.
    if is_gate:
        ga = tl.sigmoid(acc_a).to(tl.float16)
        gb = tl.sigmoid(acc_b).to(tl.float16)
        if TMA_STORE:
            gate_desc.store([b0 * H + g0, row0 - b0 * NN], ga)
            gate_desc.store([b0 * H + g0 + BLOCK_H, row0 - b0 * NN], gb)
        else:
            bidx = rows // NN
            gate_offs = (bidx * H * NN + (rows - bidx * NN))[None, :] + (g0 + cs)[:, None].to(tl.int64) * NN
            tl.store(gate_ptr + gate_offs, ga, mask=row_ok[None, :])
            tl.store(gate_ptr + gate_offs + BLOCK_H * NN, gb, mask=row_ok[None, :])
    else:
        m = tl.load(mask_ptr + rows, mask=row_ok, other=0.0)
        val = (acc_a * m[None, :] * tl.sigmoid(acc_b)).to(tl.float16)
        if TMA_STORE:
            if side == 0:
                left_desc.store([b0 * H + h0, row0 - b0 * NN], val)
            else:
                right_desc.store([b0 * H + h0, row0 - b0 * NN], val)
        else:
            bidx = rows // NN
            offs = (bidx * H * NN + (rows - bidx * NN))[None, :] + (h0 + cs)[:, None].to(tl.int64) * NN
            if side == 0:
                tl.store(left_ptr + offs, val, mask=row_ok[None, :])
            else:
                tl.store(right_ptr + offs, val, mask=row_ok[None, :])


@triton.jit
def _contract_kernel(
    left_ptr, right_ptr, out_ptr, N,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EMULATE: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    base = tl.program_id(2).to(tl.int64) * N * N  # one (b, h) matrix

    offs_i = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_j = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    i_ok = offs_i < N
    j_ok = offs_j < N
    # Both operands are row-major over k; R is read as a [K, N] tile so the product is L @ Rᵀ.
    a_ptrs = left_ptr + base + offs_i[:, None] * N + offs_k[None, :]
    b_ptrs = right_ptr + base + offs_j[None, :] * N + offs_k[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, N, BLOCK_K):
        k_ok = (k0 + offs_k) < N
        a = tl.load(a_ptrs, mask=i_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_ok[:, None] & j_ok[None, :], other=0.0)
        acc = _mma(a, b, acc, EMULATE)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    dst = out_ptr + base + offs_i[:, None] * N + offs_j[None, :]
    tl.store(dst, acc.to(out_ptr.dtype.element_ty), mask=i_ok[:, None] & j_ok[None, :])


@triton.jit
def _contract_tma_kernel(l_desc, r_desc, o_desc, N,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EMULATE: tl.constexpr):
    """_contract_kernel with its tiles loaded and stored through TMA descriptors of [B*H, N, N]
    (out-of-range rows and columns read as zeros and are not written)."""
    i0 = tl.program_id(0) * BLOCK_M
    j0 = tl.program_id(1) * BLOCK_N
    bh = tl.program_id(2)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, N, BLOCK_K):
        a = l_desc.load([bh, i0, k0]).reshape(BLOCK_M, BLOCK_K)
        b = r_desc.load([bh, j0, k0]).reshape(BLOCK_N, BLOCK_K)
        acc = _mma(a, b.T, acc, EMULATE)
    o_desc.store([bh, i0, j0], acc.to(o_desc.dtype).reshape(1, BLOCK_M, BLOCK_N))


@triton.jit
def _output_kernel(
    o_ptr, gate_ptr, nw_ptr, nb_ptr, w_ptr, y_ptr, M, NN, D, eps, o_desc, gate_desc, y_desc,
    H: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, TMA: tl.constexpr, EMULATE: tl.constexpr,
):
    """LayerNorm over H of O, affine, times the output gate (both [B, H, N*N]), then the output
    projection; y [B*N*N, D] in fp32. With TMA, the row block's O and gate are [H, BLOCK_M] boxes
    of the [B*H, N*N] views (N*N a multiple of BLOCK_M) and y leaves in [BLOCK_M, BLOCK_D] boxes."""
    row0 = tl.program_id(0) * BLOCK_M
    rows = row0.to(tl.int64) + tl.arange(0, BLOCK_M)
    hs = tl.arange(0, H)
    row_ok = rows < M
    ok = row_ok[:, None]
    b0 = row0 // NN
    bidx = rows // NN
    # O is [B, H, N*N]: for one h, consecutive rows are adjacent in memory.
    hmajor = (bidx * H * NN + (rows - bidx * NN))[:, None] + hs[None, :].to(tl.int64) * NN
    if TMA:
        o = o_desc.load([b0 * H, row0 - b0 * NN]).T.to(tl.float32)
    else:
        o = tl.load(o_ptr + hmajor, mask=ok, other=0.0).to(tl.float32)
    mean = tl.sum(o, axis=1) / H
    centered = o - mean[:, None]
    var = tl.sum(centered * centered, axis=1) / H
    w = tl.load(nw_ptr + hs)
    bias = tl.load(nb_ptr + hs)
    # The gate is loaded after O's statistics: loaded beside O, both tiles were live together and
    # the kernel ran 5-14 % slower on an H200 (251 registers per thread; docs/benchmarks.md).
    if TMA:
        gate = gate_desc.load([b0 * H, row0 - b0 * NN]).T.to(tl.float32)
    else:
        gate = tl.load(gate_ptr + hmajor, mask=ok, other=0.0).to(tl.float32)
    z = ((centered * tl.rsqrt(var + eps)[:, None] * w[None, :] + bias[None, :]) * gate).to(tl.float16)

    for d0 in range(0, D, BLOCK_D):
        ds = d0 + tl.arange(0, BLOCK_D)
        d_ok = ds < D
        wt = tl.load(w_ptr + ds[None, :] * H + hs[:, None], mask=d_ok[None, :], other=0.0)  # [H, BLOCK_D]
        y = _mma(z, wt, tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32), EMULATE)
        if TMA:
            y_desc.store([row0, d0], y)
        else:
            tl.store(y_ptr + rows[:, None] * D + ds[None, :], y, mask=ok & d_ok[None, :])


PACK_BLOCK = 1024
_PACKED = ("left_proj.weight", "right_proj.weight", "left_gate.weight", "right_gate.weight", "out_gate.weight",
           "to_out.weight")


_LAYOUTS: dict[tuple, tuple] = {}  # sizes -> the workspace's bytes and each intermediate's (offset, dtype, shape)


def _layout(bsz, n, d, h):
    """Where each intermediate lies in the workspace, 256-byte aligned: packed weights, x̂, left,
    right, the output gate, O. A function of the sizes and this file's constants only."""
    key = (bsz, n, d, h)
    hit = _LAYOUTS.get(key)
    if hit is None:
        f16 = torch.float16
        o_dtype = f16 if O_DTYPE == "fp16" else torch.float32
        hmaps = (bsz, h, n, n)
        parts, total = [], 0
        for dtype, shape in ((f16, (6 * h * d,)), (f16, (bsz * n * n, d)), (f16, hmaps), (f16, hmaps), (f16, hmaps),
                             (o_dtype, hmaps)):
            parts.append((total, dtype, shape))
            total += -(-math.prod(shape) * dtype.itemsize // 256) * 256
        hit = _LAYOUTS[key] = (total, parts)
    return hit


def _intermediates(bsz, n, d, h, device, raw):
    """(what must stay alive until the call returns, [pack, xn, left, right, gate, o]): tensors, or with
    `raw` their data pointers. Fresh on every call (ONE_WORKSPACE: one allocation, else one each)."""
    total, parts = _layout(bsz, n, d, h)
    if ONE_WORKSPACE:
        ws = torch.empty(total, dtype=torch.uint8, device=device)
        if raw:
            base = ws.data_ptr()
            return ws, [base + off for off, _, _ in parts]
        return ws, [ws[off:off + math.prod(shape) * dtype.itemsize].view(dtype).view(shape)
                    for off, dtype, shape in parts]
    tensors = [torch.empty(shape, dtype=dtype, device=device) for _, dtype, shape in parts]
    return tensors, [t.data_ptr() for t in tensors] if raw else tensors


def custom_kernel(data):  # no autograd context: every output is a fresh tensor written by Triton kernels
    x, mask, w, config = data
    bsz, n, _, d = x.shape
    h = config["hidden_dim"]
    m_rows = bsz * n * n
    nn = n * n
    hd = h * d
    emulate = x.device.type == "cpu"  # CPU tensors mean Triton's interpreter
    x = x.contiguous()

    mask_rows = (mask if mask.dtype == torch.float32 and mask.is_contiguous()  # the kernel reads it as [B*N*N]
                 else mask.reshape(m_rows).to(torch.float32).contiguous())
    inputs = (x, mask_rows, *[w[name].contiguous() for name in _PACKED],
              w["norm.weight"], w["norm.bias"], w["to_out_norm.weight"], w["to_out_norm.bias"])
    ptrs = [t.data_ptr() for t in inputs]
    call_key = _call_key(inputs, ptrs, bsz, n, d, h)
    # RAW_POINTERS: pointers as integers once this key's kernels have all been launched through Triton.
    stream = _current_stream() if RAW_POINTERS and call_key is not None and call_key in _READY else None
    x_, mask_, *weights, norm_w, norm_b, out_norm_w, out_norm_b = inputs if stream is None else ptrs

    # pack: the five input projections stacked as [5H, D], then the output projection [D, H], in fp16.
    # xn: x̂ [B*N*N, D]. left, right, gate: [B, H, N, N] fp16. o: [B, H, N, N] in O_DTYPE.
    keep, (pack, xn, left, right, gate, o) = _intermediates(bsz, n, d, h, x.device, stream is not None)
    f16 = torch.float16
    o_dtype = f16 if O_DTYPE == "fp16" else torch.float32
    if stream is None:
        w_in, w_out = pack[: 5 * hd].view(5 * h, d), pack[5 * hd:].view(d, h)
    else:
        w_in, w_out = pack, pack + 5 * hd * f16.itemsize
    ln_programs = _cdiv(m_rows, LN_BLOCK_M)
    _launch(_layernorm_kernel, (ln_programs + 6 * _cdiv(hd, PACK_BLOCK),),
            (x_, norm_w, norm_b, xn, m_rows, d, EPS, ln_programs, *weights, pack, hd,
             LN_BLOCK_M, 1 << (d - 1).bit_length(), PACK_BLOCK), _key("layernorm", call_key), stream,
            num_warps=LN_WARPS)

    block_h = min(PROJ_BLOCK_H, h // 2)  # an output-gate job takes 2·block_h channels
    jobs = 2 * (h // block_h) + h // (2 * block_h)
    tma = PROJ_TMA and (d * 2) % 16 == 0
    tma_store = tma and nn % PROJ_BLOCK_M == 0 and (nn * 2) % 16 == 0
    descs = ((_Desc(xn, f16, (m_rows, d), (d, 1), (PROJ_BLOCK_M, PROJ_BLOCK_K)),
              _Desc(w_in, f16, (5 * h, d), (d, 1), (block_h, PROJ_BLOCK_K))) if tma else (None, None))
    descs += tuple(_Desc(t, f16, (bsz * h, nn), (nn, 1), (block_h, PROJ_BLOCK_M)) if tma_store else None
                   for t in (left, right, gate))
    _launch(_project_kernel, (_cdiv(m_rows, PROJ_BLOCK_M) * jobs,),
            (xn, mask_, w_in, left, right, gate, m_rows, nn, d, *descs,
             h, PROJ_BLOCK_M, PROJ_BLOCK_K, block_h, tma, tma_store, emulate),
            _key("project", call_key), stream, num_warps=PROJ_WARPS, num_stages=PROJ_STAGES)

    grid = (_cdiv(n, BLOCK_M), _cdiv(n, BLOCK_N), bsz * h)
    if CONTRACT_TMA and (n * f16.itemsize) % 16 == 0 and (n * o_dtype.itemsize) % 16 == 0:
        def desc(t, dtype, rows, cols):
            return _Desc(t, dtype, (bsz * h, n, n), (nn, n, 1), (1, rows, cols))
        _launch(_contract_tma_kernel, grid,
                (desc(left, f16, BLOCK_M, BLOCK_K), desc(right, f16, BLOCK_N, BLOCK_K), desc(o, o_dtype, BLOCK_M, BLOCK_N), n,
                 BLOCK_M, BLOCK_N, BLOCK_K, emulate), _key("contract_tma", call_key), stream,
                num_warps=NUM_WARPS, num_stages=NUM_STAGES)
    else:
        _launch(_contract_kernel, grid, (left, right, o, n, BLOCK_M, BLOCK_N, BLOCK_K, emulate),
                _key("contract", call_key), stream, num_warps=NUM_WARPS, num_stages=NUM_STAGES)

    y = torch.empty((bsz, n, n, d), device=x.device, dtype=torch.float32)
    y_ = y if stream is None else y.data_ptr()
    tma = OUT_TMA and nn % OUT_BLOCK_M == 0 and (nn * o_dtype.itemsize) % 16 == 0 and (d * 4) % 16 == 0
    descs = ((_Desc(o, o_dtype, (bsz * h, nn), (nn, 1), (h, OUT_BLOCK_M)),
              _Desc(gate, f16, (bsz * h, nn), (nn, 1), (h, OUT_BLOCK_M)),
              _Desc(y_, torch.float32, (m_rows, d), (d, 1), (OUT_BLOCK_M, OUT_BLOCK_D))) if tma else (None, None, None))
    _launch(_output_kernel, (_cdiv(m_rows, OUT_BLOCK_M),),
            (o, gate, out_norm_w, out_norm_b, w_out, y_, m_rows, nn, d, EPS, *descs,
             h, OUT_BLOCK_M, OUT_BLOCK_D, tma, emulate), _key("output", call_key), stream, num_warps=OUT_WARPS)
    if stream is None and call_key is not None and DIRECT_LAUNCH and isinstance(_output_kernel, JITFunction):
        _READY.add(call_key)
    del keep  # the intermediates are freed here, after every launch that uses them was queued
    return y
