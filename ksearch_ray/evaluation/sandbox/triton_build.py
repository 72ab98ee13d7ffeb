"""Compiling a Triton candidate's kernels for the evaluators' GPU on a CPU: the sandboxed side of a
Triton build job (evaluation/builder.py, `Builder.build_triton`).

The worker calls the candidate once per workload of the set it will be evaluated on, with inputs of
the GPU's shapes, dtypes, strides and alignment that hold no data (meta tensors, from the task's own
input generator run under PyTorch's fake tensors, that tell the candidate's host code they are on the
GPU: `OnTheGpu`, so it takes the branches it takes there), while Triton's active driver is a stand-in for a
CUDA device of the evaluators' compute capability. Every Triton launch becomes a compile
(`warmup=True`): Triton's frontend, LLVM and the ptxas it ships write each kernel into the job's
Triton cache under the key a GPU worker computes for the same launch (source, specialization,
target, options), and nothing is launched. The evaluation's worker, given a copy of that cache,
only loads the kernels.

What cannot be built this way is left to the evaluation's worker, which compiles it as it always
did: a call that needs values (`.item()`, a page table read on the host), the GPU itself
(`torch.cuda` calls, an autotuner's benchmark) or anything else that stops it. The report names
each such workload and why. A Triton compile error is the candidate's verdict here, as on the GPU
(`harness.call_failure`), before any GPU time is spent on it.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import traceback
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from ksearch_ray.evaluation.sandbox.harness import CandidateFailure, call_failure, import_candidate
from ksearch_ray.evaluation.sandbox.protocol import Fail, GpuFacts, Progress, TritonBuildJob, TritonBuilt
from ksearch_ray.models import Status
from ksearch_ray.text import clip


def stand_in_driver(capability: int, torch_device: str = "meta", launchers: Path | None = None) -> bool:
    """Make Triton's active driver a CUDA driver for a device of `capability` (90: sm_90) that is not
    there: it answers the target, device and stream questions a compile asks, and loads nothing.
    `torch_device`: the device it names as the active one (where the inputs are). `launchers`: a folder
    of this process's own; given, each compiled kernel's host launcher (a C module Triton builds with
    the system's compiler for the kernel's signature) is compiled into the Triton cache too, linked
    against a stand-in libcuda made there, so the GPU's worker need not build it. Returns whether it is
    (not where this Triton has no such launchers, or no C compiler is here)."""
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.driver import CudaDriver
    from triton.runtime.driver import driver

    if launchers is not None and not launchers_per_signature():
        launchers = None
    if launchers is not None:
        import subprocess

        import triton

        try:
            triton.knobs.nvidia.libcuda_path = str(stand_in_libcuda(launchers))
            triton.knobs.build.impl = _build_naming_libcuda
        except (OSError, subprocess.SubprocessError) as exc:  # no C compiler here: the kernels alone, as before
            print(f"no stand-in libcuda ({type(exc).__name__}: {exc}); the GPU's workers build the launchers",
                  file=sys.stderr)
            launchers = None

    class StandIn(CudaDriver):  # type: ignore[misc]
        def __init__(self) -> None:  # CudaDriver's own would load libcuda
            self.backend = "cuda"
            # For host code that takes a compiled kernel's launcher (`compiled.run`) and launches through it itself:
            # loading "succeeds" and launching does nothing, as a launch does everywhere in a build.
            self.launcher_cls = _NoLaunch if launchers is None else _BuildsLauncher
            self.utils = _NoDevice(capability)

        def get_current_target(self) -> Any:
            return GPUTarget("cuda", capability, 32)  # NVIDIA's warp is 32 wide, as CudaDriver reports

        def get_current_device(self) -> int:
            return 0

        def get_current_stream(self, device: int | None = None) -> int:
            return 0

        def get_device_capability(self, device: int = 0) -> tuple[int, int]:
            return divmod(capability, 10)

        def get_active_torch_device(self) -> Any:
            return torch.device(torch_device)

    driver.set_active(StandIn())
    return launchers is not None


MAX_SHARED = {80: 166912, 86: 101376, 87: 166912, 89: 101376, 90: 232448, 100: 232448, 120: 101376}
"""Shared memory a block may have (the opt-in maximum), by compute capability, as CUDA reports it."""


class _NoLaunch:
    """A compiled kernel's launcher in a build: it takes every launch and runs nothing."""

    def __init__(self, src: Any, metadata: Any) -> None:
        self.global_scratch_size = self.profile_scratch_size = 0
        self.global_scratch_align = self.profile_scratch_align = 1
        self.launch_cooperative_grid = self.launch_pdl = False

    def launch(self, *args: Any, **kwargs: Any) -> None:
        return None

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        return None


def launchers_per_signature() -> bool:
    """Whether this Triton compiles a C launcher for each kernel signature (3.6 does, a gcc -O3 compile
    each; 3.9 launches every kernel through one module of its driver)."""
    import triton.backends.nvidia.driver as nv

    return hasattr(nv, "make_launcher")


def stand_in_libcuda(folder: Path) -> Path:
    """An empty shared library named libcuda.so.1 in `folder` (returned): modules Triton links against
    it name libcuda.so.1 and find the real one on the GPU's host."""
    import subprocess

    folder.mkdir(parents=True, exist_ok=True)
    stub = folder / "libcuda.so.1"
    if not stub.exists():
        empty = folder / "empty.c"
        empty.write_text("")
        subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(stub), str(empty)],
                       check=True, capture_output=True, timeout=60)
    return folder


def _build_naming_libcuda(name: str, src: str, srcdir: str, library_dirs: list[str], include_dirs: list[str],
                          libraries: list[str]) -> str:
    """Triton's own C build (its `knobs.build.impl` hook), with the libraries linked even though the
    stand-in defines none of their symbols: a linker that drops unused libraries (`--as-needed`, the
    default of Debian's and Ubuntu's) would leave libcuda out of the module's needs, and on the GPU its
    load would fail on the first CUDA symbol, so the worker would build it again."""
    import triton
    from triton.runtime import build

    hook, triton.knobs.build.impl = triton.knobs.build.impl, None  # Triton's _build calls the hook when set
    try:
        flags = ["-Wl,--no-as-needed", *[f"-l:{lib}" if ".so" in lib else f"-l{lib}" for lib in libraries]]
        return str(build._build(name, src, srcdir, library_dirs, include_dirs, [], flags))
    finally:
        triton.knobs.build.impl = hook


class _BuildsLauncher(_NoLaunch):
    """_NoLaunch, after Triton's own launcher class has compiled this kernel's launcher into the cache.
    Loading it fails here (no driver: the stand-in libcuda holds nothing) or is never used; either way
    the module is in the cache, under the key the GPU's worker computes from the same source."""

    def __init__(self, src: Any, metadata: Any) -> None:
        super().__init__(src, metadata)
        from triton.backends.nvidia.driver import CudaLauncher

        try:
            CudaLauncher(src, metadata)
        except ImportError:  # written to the cache, not loadable here
            pass
        except Exception as exc:  # noqa: BLE001  (no compiler, no Python headers: the GPU's worker builds it)
            print(f"a kernel's launcher was not built here ({type(exc).__name__}: {str(exc)[:200]}); "
                  "the GPU's worker builds it", file=sys.stderr)


class _NoDevice:
    """The driver's utilities for a device that is not there: a kernel "loads" (no module, no function)."""

    def __init__(self, capability: int) -> None:
        self.capability = capability

    def get_device_properties(self, device: int = 0) -> dict[str, int]:
        return {"max_shared_mem": MAX_SHARED.get(self.capability, 232448), "max_num_regs": 65536, "warpSize": 32}

    def load_binary(self, name: str, kernel: bytes, shared: int, device: int) -> tuple[int, int, int, int, int]:
        return 0, 0, 0, 0, 1024  # module, function, registers, spills, most threads a block may have

    def unload_module(self, module: Any) -> None:
        return None


def _storage_elements(tensor: torch.Tensor) -> int:
    """Elements of the storage under `tensor` (at least one): what a view's strides and offset index into."""
    return max(1, tensor.untyped_storage().nbytes() // max(1, tensor.element_size()))


def shaped_like(value: Any) -> Any:
    """`value` with every tensor replaced by a meta tensor of its shape, strides, storage offset and
    dtype: a meta tensor's data_ptr() is its byte offset, so Triton's 16-byte alignment test sees what
    a GPU allocation (512-byte aligned) gives."""
    if isinstance(value, torch.Tensor):
        elements = _storage_elements(value)
        base = torch.empty(elements, dtype=value.dtype, device="meta")
        return base.as_strided(value.shape, value.stride(), value.storage_offset())
    if isinstance(value, dict):
        return {k: shaped_like(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(shaped_like(v) for v in value)
    return value


_CUDA = torch.device("cuda", 0)
# The getters torch hands __torch_function__ for `tensor.device` and `tensor.is_cuda`: a new method-wrapper on each
# access, equal (not identical) to these.
_DEVICE = vars(torch._C.TensorBase)["device"].__get__
_IS_CUDA = vars(torch._C.TensorBase)["is_cuda"].__get__


def _is_cuda(device: Any) -> bool:
    try:
        return torch.device(device).type == "cuda"
    except (RuntimeError, TypeError):
        return False


def on_the_gpu(value: Any) -> Any:
    """`value` with every meta tensor in it made an `OnTheGpu` one."""
    if isinstance(value, torch.Tensor) and value.is_meta and not isinstance(value, OnTheGpu):
        return value.as_subclass(OnTheGpu)
    if isinstance(value, dict):
        return {k: on_the_gpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(on_the_gpu(v) for v in value)
    return value


def _meta_kwargs(kwargs: dict[str, Any] | None) -> dict[str, Any]:
    kwargs = dict(kwargs or {})
    if kwargs.get("device") is not None and _is_cuda(kwargs["device"]):
        kwargs["device"] = "meta"
    return kwargs


class OnTheGpu(torch.Tensor):
    """A meta tensor that tells the candidate's host code it is on the GPU (`device`, `is_cuda`, `get_device`),
    so that code takes the branches it takes on the evaluators, not a CPU or interpreter path; what it makes
    from one, or asks for on the GPU, is a meta tensor that says so too. Torch's own code (run with the
    subclass's hooks off) and Triton see a meta tensor: shapes, strides, dtype, data_ptr() its byte offset."""

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func == _DEVICE:
            return _CUDA
        if func == _IS_CUDA:
            return True
        if func is torch.Tensor.get_device:
            return 0
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.to:
            args = tuple("meta" if isinstance(a, (str, torch.device)) and _is_cuda(a) else a for a in args)
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **_meta_kwargs(kwargs))
        return on_the_gpu(out)


class _GpuIsMeta(torch.overrides.TorchFunctionMode):
    """A tensor asked for on the GPU (`torch.empty(..., device="cuda")`) is an `OnTheGpu` meta tensor."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if kwargs and kwargs.get("device") is not None and _is_cuda(kwargs["device"]):
            return on_the_gpu(func(*args, **_meta_kwargs(kwargs)))
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def _as_on_the_gpu(gpu: GpuFacts | None) -> Iterator[None]:
    """While the candidate runs: tensors it asks for on the GPU are `OnTheGpu` ones, `torch.cuda.is_available()`
    says yes, and with `gpu` (the evaluators' GPU) torch.cuda answers what the code asks of the device (its
    properties, capability, name; one device, device 0), as on the evaluators. What else it asks of torch.cuda
    (a stream, a synchronize) fails here, and the evaluation's worker compiles that workload's kernels."""
    answers: dict[str, Any] = {"is_available": lambda: True}
    if gpu is not None:
        props = types.SimpleNamespace(**gpu.model_dump())
        answers.update(get_device_properties=lambda device=None: props,
                       get_device_capability=lambda device=None: (gpu.major, gpu.minor),
                       get_device_name=lambda device=None: gpu.name, device_count=lambda: 1, current_device=lambda: 0)
    saved = {name: getattr(torch.cuda, name) for name in answers}
    for name, answer in answers.items():
        setattr(torch.cuda, name, answer)
    try:
        with _GpuIsMeta():
            yield
    finally:
        for name, original in saved.items():
            setattr(torch.cuda, name, original)


def input_spec(value: Any) -> Any:
    """A task's inputs as plain data: each tensor as {"tensor": [shape, stride, storage offset, storage elements,
    dtype]}, lists and dicts kept, scalars as they are. ValueError for anything else."""
    if isinstance(value, torch.Tensor):
        elements = _storage_elements(value)
        return {"tensor": [list(value.shape), list(value.stride()), value.storage_offset(), elements,
                           str(value.dtype).removeprefix("torch.")]}
    if isinstance(value, dict):
        if "tensor" in value:
            raise ValueError("an input dict with a key named 'tensor'")
        return {str(k): input_spec(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [input_spec(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise ValueError(f"an input of type {type(value).__name__}")


def from_spec(spec: Any) -> Any:
    """`input_spec`'s data as meta tensors that say they are on the GPU (`OnTheGpu`)."""
    if isinstance(spec, dict) and set(spec) == {"tensor"}:
        shape, stride, offset, elements, dtype = spec["tensor"]
        kind = getattr(torch, str(dtype), None)
        if not isinstance(kind, torch.dtype):
            raise ValueError(f"not a dtype: {dtype!r}")
        base = torch.empty(int(elements), dtype=kind, device="meta")
        return base.as_strided(shape, stride, int(offset)).as_subclass(OnTheGpu)
    if isinstance(spec, dict):
        return {k: from_spec(v) for k, v in spec.items()}
    if isinstance(spec, list):
        return [from_spec(v) for v in spec]
    return spec


def meta_inputs(task: Any, workload: Any) -> dict[str, Any]:
    """The task's inputs for `workload` at the GPU's shapes, as meta tensors. Its generator runs under
    fake tensors (shapes only, so even TriMul's 3 GB inputs cost nothing), or, where it needs values
    (`.item()`, indices read on the host), for real on the CPU. Seed 0: a shape that depends on the
    seed only costs a kernel the evaluation's worker compiles itself."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    try:
        with FakeTensorMode(allow_non_fake_inputs=True):
            inputs = task.generate_inputs(workload, 0, "cpu")
    except Exception:  # noqa: BLE001  (values were needed: make them, then keep only their shapes)
        inputs = task.generate_inputs(workload, 0, "cpu")
    return dict(on_the_gpu(shaped_like(inputs)))


def _where(exc: BaseException, src: Path) -> str:
    """ ' (at file.py:line)': the innermost frame in the candidate's files, else the innermost of all."""
    frames = traceback.extract_tb(exc.__traceback__)
    own = [f for f in frames if f.filename.startswith(str(src))]
    chosen = own or frames
    return f" (at {Path(chosen[-1].filename).name}:{chosen[-1].lineno})" if chosen else ""


class _Launches:
    """Triton's launch turned into a compile for as long as the build runs; each one is progress."""

    def __init__(self, chan: Any, launchers: bool = False) -> None:
        """`launchers`: each compiled kernel's launcher is built too (the driver's launcher class builds it)."""
        from triton.runtime.jit import JITFunction

        self.count = 0
        run = JITFunction.run

        def compile_only(fn: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
            self.count += 1
            args = tuple(a.as_subclass(torch.Tensor) if isinstance(a, OnTheGpu) else a for a in args)  # plain meta
            kwargs = {k: v.as_subclass(torch.Tensor) if isinstance(v, OnTheGpu) else v for k, v in kwargs.items()}
            kernel = run(fn, *args, grid=grid, warmup=True, **kwargs)
            if launchers:
                getattr(kernel, "run", None)  # a compiled kernel's launcher is made when first asked for: now
            chan.send(Progress(what=f"compiled {getattr(fn, '__name__', 'a kernel')}"[:120]))
            return kernel

        JITFunction.run = compile_only


def serve_triton_build(chan: Any, job: dict[str, Any]) -> int:
    """Compile the candidate's kernels for every workload of the job, report, exit. The trusted
    builder reads the Triton cache after this process is gone."""
    from ksearch_ray.taskspec.task import Task

    spec = TritonBuildJob.model_validate(job)
    if os.environ.get("TRITON_INTERPRET"):  # the sandbox's fault, not the candidate's: the build crashes
        raise RuntimeError("this sandbox runs Triton's interpreter: a Triton build needs Sandbox(triton_compiles=True)")
    t0 = time.perf_counter()
    task = Task.load(spec.task_root)
    task.module  # noqa: B018  (the task's own code loads before any of the candidate's)
    src = Path(spec.workdir) / "src"
    current: str | None = None
    try:
        launchers = stand_in_driver(spec.capability, launchers=Path(spec.workdir) / "libcuda")
        launches = _Launches(chan, launchers=launchers)
        built: list[str] = []
        not_built: dict[str, str] = {}
        try:
            with _as_on_the_gpu(spec.gpu):  # module-level code too
                entry = import_candidate(src, "python", spec.entry_file, spec.entry_point, spec.solution_id)
        except CandidateFailure as refused:
            if refused.message.startswith("SyntaxError"):  # the same on every machine: the candidate's verdict
                raise
            # Its import may have wanted what only the GPU's worker has (a device's properties, say): that worker
            # imports it again and judges it; here, nothing is built.
            why = clip(refused.message, 300)
            chan.send(TritonBuilt(seconds=time.perf_counter() - t0, launches=0, built=[],
                                  not_built={w.name: why for w in spec.workloads}))
            return 0
        for workload in spec.workloads:
            current = workload.name
            chan.send(Progress(what=f"calling on {workload.name}"[:120]))
            try:
                given = spec.inputs.get(workload.name) if spec.inputs else None
                inputs = from_spec(given) if given is not None else meta_inputs(task, workload)
            except Exception as exc:  # the task's own generator failed here: the GPU worker compiles these
                not_built[workload.name] = clip(f"its inputs could not be made: {type(exc).__name__}: {exc}".splitlines()[0], 300)
                continue
            try:
                with _as_on_the_gpu(spec.gpu):
                    entry(*task.arguments(inputs))
            except (Exception, SystemExit) as exc:
                stopped = call_failure(exc, src)
                if stopped.status is Status.COMPILE_ERROR:
                    raise CandidateFailure(stopped.status, stopped.message, stopped.log) from None
                not_built[workload.name] = clip(f"{stopped.message}{_where(exc, src)}", 300)
                continue
            built.append(workload.name)
        chan.send(TritonBuilt(seconds=time.perf_counter() - t0, launches=launches.count, built=built, not_built=not_built))
    except CandidateFailure as failure:
        status, message = failure.status, failure.message
        if status.passed:  # the candidate raised the harness's exception with a verdict of its choosing
            status, message = Status.INTEGRITY_VIOLATION, f"the candidate raised a failure that claims PASSED ({clip(message, 200)})"
        chan.send(Fail(status=status, message=message, log=failure.log, workload=current))
    sys.stdout.flush()
    sys.stderr.flush()
    return 0
