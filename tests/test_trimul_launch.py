"""The TriMul seed's direct launches (issue 44): after a kernel's first launch through Triton, the seed
hands its TMA descriptors to Triton's compiled launcher itself, each built once per address. These
tests check, without a GPU, that the compiled launcher gets exactly what Triton's own launch path
would give it, and that a cached descriptor is reused only for the same address, shape and strides.

Triton's own path is Triton's code (its CudaLauncher and descriptor wrapper), around a launcher that
records its arguments; the one driver call (encoding a descriptor) is replaced by one that returns
its inputs. The comparison needs Triton 3.6's launcher layout (the H200's Triton): with another
Triton the seed launches through `kernel.run`, which the last test checks. To run the 3.6 half on
this machine: `pip install --no-deps --target /tmp/t36 triton==3.6.0` and
`PYTHONPATH=/tmp/t36 python -m pytest -q tests/test_trimul_launch.py`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest
import torch
import triton
import triton.backends.nvidia.driver as nv

from ksearch_ray.taskspec.task import load_module_file

ROOT = Path(__file__).resolve().parent.parent
SEED = ROOT / "tasks" / "trimul" / "solutions" / "triton_fused" / "submission.py"
TRITON_36 = getattr(nv, "_BASE_ARGS_FORMAT", None) == "iiiKKppOOOOOO" and hasattr(nv, "CudaLauncher") \
    and nv.make_tensordesc_arg.__code__.co_argcount == 2
needs_36 = pytest.mark.skipif(not TRITON_36, reason=f"Triton {triton.__version__}'s launcher is not 3.6's layout")

# A kernel (ptr, desc, n, constexpr, desc) as Triton's signature and descriptor metadata describe it.
SIGNATURE = {"p": "*fp16", "a": "tensordesc<fp16[64, 32]>", "n": "i32", "C": "constexpr", "b": "tensordesc<fp32[1, 64, 64]>"}
META = [{"swizzle": 3, "elem_size": 2, "elem_type": 6, "block_size": [64, 32], "fp4_padded": False},
        {"swizzle": 3, "elem_size": 4, "elem_type": 7, "block_size": [1, 64, 64], "fp4_padded": False}]


@pytest.fixture()
def seed() -> ModuleType:
    return load_module_file(SEED, "trimul_launch_seed")


@pytest.fixture()
def encodes(monkeypatch) -> list[tuple]:
    """Triton's descriptor encoding (a driver call) made to return its inputs, counting the calls."""
    calls: list[tuple] = []

    def fill(*args):
        calls.append(args)
        return ("tensormap", *[tuple(a) if isinstance(a, list) else a for a in args])

    utils = SimpleNamespace(fill_tma_descriptor=fill)
    monkeypatch.setattr(triton.runtime.driver, "_active", SimpleNamespace(utils=utils))
    return calls


def _kernel(launches: list[tuple]) -> SimpleNamespace:
    """A compiled kernel whose launcher is Triton's own CudaLauncher and descriptor wrapper around a
    recorder of what reaches the compiled launcher."""
    run = object.__new__(nv.CudaLauncher)  # its __init__ compiles a C module: the rest is Triton's
    run.launch = nv.wrap_handle_tensordesc(lambda *a: launches.append(a), SIGNATURE, META)
    run.num_ctas = 1
    run.global_scratch_size = run.profile_scratch_size = 0
    run.global_scratch_align = run.profile_scratch_align = 1
    run.launch_cooperative_grid, run.launch_pdl = False, False
    return SimpleNamespace(run=run, function=1234, packed_metadata=(4, 1, 0), name="fake", launch_metadata=lambda *a: None)


def _plain(call: tuple) -> tuple:
    """A recorded launch with each tensor as its data pointer (what the launcher reads of it)."""
    return tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in call)


def _args(seed: ModuleType, a: torch.Tensor, b: torch.Tensor) -> tuple:
    return (a, seed._Desc(a, a.dtype, (64, 96), (96, 1), (64, 32)), 7, 16,
            seed._Desc(b, b.dtype, (2, 64, 64), (4096, 64, 1), (1, 64, 64)))


@needs_36
def test_the_compiled_launcher_gets_what_tritons_own_launch_path_gives_it(seed, encodes):
    a, b = torch.zeros(64 * 96, dtype=torch.float16), torch.zeros(2 * 64 * 64)
    args = _args(seed, a, b)
    ours: list[tuple] = []
    seed._Compiled(_kernel(ours), args).launch((3, 2), 99, args)
    tritons: list[tuple] = []
    k = _kernel(tritons)
    k.run(3, 2, 1, 99, k.function, k.packed_metadata, None, None, None, *seed._jit_args(args))
    assert len(ours) == len(tritons) == 1
    # Pointers: Triton passes the tensor (its launcher reads data_ptr()); both descriptors expanded alike.
    assert _plain(ours[0]) == _plain(tritons[0])
    assert [c[0] for c in encodes] == [a.data_ptr(), b.data_ptr()] * 2
    # RAW_POINTERS: the same launch with every pointer an integer reaches the launcher unchanged.
    raw = (a.data_ptr(), *(seed._Desc(d.base.data_ptr(), *d[1:]) for d in (args[1],)), 7, 16,
           seed._Desc(b.data_ptr(), *args[4][1:]))
    seed._Compiled(_kernel(ours), raw).launch((3, 2), 99, raw)
    assert _plain(ours[1]) == _plain(tritons[0])


@needs_36
def test_a_descriptor_is_encoded_once_per_address_shape_and_strides(seed, encodes):
    store = torch.zeros(2 * 64 * 96, dtype=torch.float16)
    b = torch.zeros(2 * 64 * 64)
    launches: list[tuple] = []
    first = _args(seed, store[: 64 * 96], b)
    compiled = seed._Compiled(_kernel(launches), first)
    compiled.launch((1,), 0, first)
    assert len(encodes) == 2
    # Another tensor at the same address (new contents do not matter): nothing encoded again.
    again = store[: 64 * 96].clone()
    store[: 64 * 96].copy_(again + 1)
    compiled.launch((1,), 0, _args(seed, store[: 64 * 96].view(64, 96), b))
    assert len(encodes) == 2 and _plain(launches[1]) == _plain(launches[0])
    # Another address, or the same address with another shape: encoded again, with what it now is.
    moved = _args(seed, store[64 * 96:], b)
    compiled.launch((1,), 0, moved)
    assert len(encodes) == 3 and encodes[-1][0] == store[64 * 96:].data_ptr()
    reshaped = (*first[:4], seed._Desc(b, b.dtype, (1, 64, 64), (4096, 64, 1), (1, 64, 64)))
    compiled.launch((1,), 0, reshaped)
    assert len(encodes) == 4 and encodes[-1][5] == [1, 64, 64]


class _UnknownLauncher:
    """A compiled kernel's `run` of a layout the seed does not know: it records its calls."""

    global_scratch_size = profile_scratch_size = 0

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def launch(self, *args) -> None:
        raise AssertionError("the seed called an unknown launcher's inner function")

    def __call__(self, *args) -> None:
        self.calls.append(args)


def test_with_another_triton_launcher_the_kernel_is_launched_through_kernel_run(seed):
    run = _UnknownLauncher()
    kernel = SimpleNamespace(run=run, function=1, packed_metadata=(4, 1, 0), name="fake", launch_metadata=lambda *a: None)
    a, b = torch.zeros(64 * 96, dtype=torch.float16), torch.zeros(2 * 64 * 64)
    args = _args(seed, a, b)
    compiled = seed._Compiled(kernel, args)
    assert compiled.direct is None
    compiled.launch((3,), 5, args)
    [call] = run.calls
    assert call[:5] == (3, 1, 1, 5, 1)
    descs = [x for x in call if isinstance(x, seed.TensorDescriptor)]
    assert [d.base.data_ptr() for d in descs] == [a.data_ptr(), b.data_ptr()]
    assert [list(d.shape) for d in descs] == [[64, 96], [2, 64, 64]]


@needs_36
@pytest.mark.parametrize("settings", [(), ("--set", "RAW_POINTERS=False")], ids=["defaults", "tensor-pointers"])
def test_every_launch_of_a_seed_call_hands_the_launcher_what_tritons_own_path_does(settings):
    # The seed's kernels compiled for sm_90 and called on three kinds of input (experiments/trimul_launch_check.py);
    # with tensors for pointers, each launch's compiled kernel is also checked against the one Triton's JIT picks.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([*env.get("PYTHONPATH", "").split(os.pathsep), str(ROOT)])
    proc = subprocess.run([sys.executable, str(ROOT / "experiments" / "trimul_launch_check.py"), *settings],
                          capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    # 5 of its 8 calls direct (the others are a new shape or specialization), 4 launches each
    assert sum("direct" in ln and "equal to Triton's own path" in ln for ln in lines) == 20, proc.stdout
    picked = sum("the kernel Triton's JIT picks" in ln for ln in lines)
    assert picked == (20 if settings else 5), proc.stdout  # by default only the contraction has no raw pointer


def test_the_workspace_addresses_are_those_of_its_views(seed):
    # RAW_POINTERS passes base + offset where the other path passes a view of the workspace.
    keep, views = seed._intermediates(2, 24, 64, 128, torch.device("cpu"), False)
    total, parts = seed._layout(2, 24, 64, 128)
    assert keep.numel() == total
    assert [v.data_ptr() - keep.data_ptr() for v in views] == [off for off, _, _ in parts]
    assert [(v.dtype, tuple(v.shape)) for v in views] == [(dt, shape) for _, dt, shape in parts]
    ends = [off + v.numel() * v.element_size() for (off, _, _), v in zip(parts, views, strict=True)]
    assert all(end <= nxt for end, (nxt, _, _) in zip(ends, parts[1:], strict=False)) and ends[-1] <= total
    assert all(off % 256 == 0 for off, _, _ in parts)
