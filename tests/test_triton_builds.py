"""Triton builds off the GPU: a Python candidate's Triton kernels compiled for sm_90 on a CPU build worker,
in the sandbox, and carried to its evaluation, which then only loads them.

Real compiles throughout (Triton's CUDA backend and the ptxas its wheel ships, with a stand-in driver
for a GPU that is not there); real sandbox workers, a real local Ray for the pool. What a CPU cannot
show is a GPU worker loading the kernels: experiments/triton_builds.py measures that on the H200.
"""

from __future__ import annotations

import asyncio
import ctypes.util
import io
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
import torch
from local_backends import settings

from ksearch_ray.distributed.pool import RayEvaluatorPool
from ksearch_ray.evaluation.buildcache import BuildCache, BuildTarget, probe_toolchain
from ksearch_ray.evaluation.builder import Builder
from ksearch_ray.evaluation.describe import EvaluatorInfo, gpu_facts
from ksearch_ray.evaluation.evaluator import Evaluator
from ksearch_ray.evaluation.sandbox.protocol import (
    GpuFacts,
    Progress,
    TritonBuildJob,
    TritonBuilt,
    parse_report,
)
from ksearch_ray.evaluation.sandbox.triton_build import (
    OnTheGpu,
    _build_naming_libcuda,
    from_spec,
    input_spec,
    launchers_per_signature,
    stand_in_libcuda,
)
from ksearch_ray.evaluation.tritoncache import (
    PackError,
    compiled_since,
    kernel_dirs,
    kernel_stamps,
    launcher_dirs,
    pack,
    triton_build_key,
    unpack,
)
from ksearch_ray.models import Solution, Status
from ksearch_ray.run.backends import BUILDER
from ksearch_ray.taskspec.task import find_task

DATA = Path(__file__).parent / "data"
TOY = find_task("toy_axpy", [str(DATA)])
SEED = TOY.solution("triton_seed")
SM90 = BuildTarget(archs=("9.0a",))


def variant(solution: Solution, old: str, new: str) -> Solution:
    text = solution.sources[solution.entry_file]
    assert old in text
    return Solution(**{**solution.model_dump(), "sources": {solution.entry_file: text.replace(old, new)}})


# tl.arange's range must be a power of two: the interpreter runs this, Triton's compiler refuses it.
NOT_A_POWER_OF_TWO = variant(SEED, "tl.arange(0, BLOCK)", "tl.arange(0, BLOCK - 1)")
# Host code that needs the GPU before its launch: nothing of it can be compiled ahead.
NEEDS_A_GPU = variant(SEED, "    y = torch.empty_like(x)\n", "    torch.cuda.current_stream()\n    y = torch.empty_like(x)\n")


def test_trimuls_seed_is_compiled_at_the_gpus_shapes_and_another_worker_finds_every_kernel(builder: Builder,
                                                                                           tmp_path: Path) -> None:
    """The TriMul seed's kernels for all seven benchmark shapes (inputs of up to 3 GB, as meta tensors),
    compiled for sm_90; a second worker elsewhere, its cache unpacked from the first's pack, compiles nothing."""
    task = find_task("trimul")
    solution = task.solution("triton_fused")
    record, data = builder.build_triton(solution, SM90, task, "benchmarks")
    assert record.status is Status.PASSED and record.kind == "triton" and not record.cached, record.message
    assert record.not_built == {} and record.kernels >= 4 and data
    # Another job directory, another process: Triton's keys hold nothing of where the code was compiled.
    cache = tmp_path / "other-worker-cache"
    assert unpack(data, cache) == record.kernels
    before, launchers = kernel_stamps(cache), launcher_dirs(cache)
    # Triton finds a kernel through its group file's absolute paths: they must lead into this cache, not the build's.
    for folder in before:
        [group] = (cache / folder).glob("__grp__*.json")
        paths = json.loads(group.read_text())["child_paths"].values()
        assert paths and all(Path(p).parent == cache / folder and Path(p).is_file() for p in paths), paths
    # Each kernel signature's host launcher, compiled here too where Triton makes one (3.6, the GPUs' version: a GPU
    # worker would build each with gcc, about 1 s); Triton 3.9 has none to make.
    assert bool(launchers) == launchers_per_signature() and not launchers & set(before)
    for folder in launchers:  # each names libcuda, which the GPU's host has (see the stand-in test below)
        [module] = (cache / folder).iterdir()
        assert "[libcuda.so.1]" in subprocess.run(["readelf", "-d", str(module)], capture_output=True, text=True).stdout
    workdir = builder._workdir(solution)
    job = TritonBuildJob(workdir=str(workdir), triton_cache_dir=str(cache), task_root=str(task.root),
                         solution_id=solution.id, entry_file=solution.entry_file, entry_point=solution.entry_point,
                         capability=90, workloads=task.workloads("benchmarks", "cuda"))
    worker = builder.sandbox.start(job.model_dump(mode="json"))
    try:
        while isinstance(report := parse_report(worker.chan.recv(300)), Progress):  # a compile, a workload called
            pass
    finally:
        builder.sandbox.kill(worker)
        builder.sandbox.reap(worker)
    assert isinstance(report, TritonBuilt) and report.launches >= 7 * 4 and not report.not_built
    # Every launch found its kernel: none was compiled again (Triton would write it into the same folder, anew).
    assert kernel_stamps(cache) == before and compiled_since(before, cache) == 0
    assert launcher_dirs(cache) == launchers  # and its launcher under the same key
    t0 = time.perf_counter()
    again, same = builder.build_triton(solution, SM90, task, "benchmarks")
    assert again.cached and same == data and time.perf_counter() - t0 < 0.5


def test_a_gpumode_submission_that_imports_the_harness_task_module_builds(builder: Builder) -> None:
    """GPUMode's template starts `from task import input_t, output_t`: the build worker has that module, as the
    evaluation's worker does, or every such candidate would be a false compile error before any GPU saw it."""
    task = find_task("trimul")
    seed = task.solution("triton_seed")
    text = seed.sources[seed.entry_file]
    templated = Solution(**{**seed.model_dump(), "sources": {
        seed.entry_file: "from task import input_t, output_t\n" + text}})
    record, _ = builder.build_triton(templated, SM90, task, "benchmarks")
    assert record.status is Status.PASSED and record.kernels >= 3, record.message


def test_a_triton_compile_error_is_the_candidates_verdict_and_is_cached(builder: Builder) -> None:
    record, data = builder.build_triton(NOT_A_POWER_OF_TWO, SM90, TOY, "benchmarks")
    assert record.status is Status.COMPILE_ERROR and data is None
    assert record.message.startswith("CompilationError") and "axpy.py" in record.log
    again, _ = builder.build_triton(NOT_A_POWER_OF_TWO, SM90, TOY, "benchmarks")
    assert again.cached and again.status is Status.COMPILE_ERROR


def test_host_code_that_needs_the_gpu_is_left_to_the_evaluations_worker(builder: Builder) -> None:
    record, data = builder.build_triton(NEEDS_A_GPU, SM90, TOY, "benchmarks")
    assert record.status is Status.PASSED and record.kernels == 0 and data is not None
    assert set(record.not_built) == {"n1000", "n4096"}
    assert all("axpy.py" in why and "Error" in why for why in record.not_built.values()), record.not_built
    # Module-level code that asks the GPU (an SM count, say) fails only here: not a verdict, the GPU's worker judges it.
    asks_at_import = variant(SEED, "NUM_WARPS = 4", "NUM_WARPS = 4\nSMS = torch.cuda.get_device_properties(0).multi_processor_count")
    imported, _ = builder.build_triton(asks_at_import, SM90, TOY, "benchmarks")
    assert imported.status is Status.PASSED and imported.kernels == 0
    assert set(imported.not_built) == {"n1000", "n4096"} and all(w.startswith("import failed") for w in imported.not_built.values())
    # A syntax error is the same on every machine: that is the build's verdict.
    broken, _ = builder.build_triton(variant(SEED, "def run(x, a, b):", "def run(x, a, b)"), SM90, TOY, "benchmarks")
    assert broken.status is Status.COMPILE_ERROR and broken.message.startswith("SyntaxError")
    # A task whose input generator needs values (.item()) is generated for real and kept as shapes only.
    good, _ = builder.build_triton(SEED, SM90, TOY, "benchmarks")
    assert good.not_built == {} and good.kernels == 2  # n1000 and n4096: Triton's divisible-by-16 specialization


def test_host_code_that_hangs_is_a_build_timeout_after_its_idle_limit_and_not_cached(tmp_path: Path) -> None:
    """A build waits for compiles and calls; one that reports neither for `triton_idle_s` ends as a TIMEOUT (the
    evaluation's worker then judges the hang on the GPU), long before the build's own limit, and is not cached."""
    hangs = variant(SEED, "    y = torch.empty_like(x)\n", "    while True:\n        pass\n")
    b = Builder(tmp_path / "builder", BuildCache(tmp_path / "cache"), triton_idle_s=3.0)
    try:
        t0 = time.monotonic()
        record, data = b.build_triton(hangs, SM90, TOY, "benchmarks")
        assert record.status is Status.TIMEOUT and data is None and "no progress in 3 s" in record.message
        assert time.monotonic() - t0 < 60
        assert b.cache.get(record.key) is None
    finally:
        b.close()


BRANCHES_ON_THE_DEVICE = variant(SEED, """def run(x, a, b):
    y = torch.empty_like(x)""", """def run(x, a, b):
    # Host code that asks where its tensors are, as LLM-written code often does: on the GPU it takes the first
    # branch; a build that showed it CPU (or meta) tensors would compile the second, which Triton refuses.
    on_gpu = x.is_cuda and x.device.type == "cuda" and x.get_device() == 0 and torch.cuda.is_available()
    if not on_gpu:
        _axpy[(1,)](x, a, x, b, 1, BLOCK=3, num_warps=NUM_WARPS)  # BLOCK 3: not a power of two
    y = torch.empty(x.shape, device=x.device, dtype=x.dtype)
    assert y.is_cuda and torch.empty_like(x).is_cuda and x[1:].is_cuda""")


def test_host_code_sees_its_tensors_on_the_gpu_and_takes_the_gpus_branches(builder: Builder) -> None:
    record, _ = builder.build_triton(BRANCHES_ON_THE_DEVICE, SM90, TOY, "benchmarks")
    assert record.status is Status.PASSED and record.kernels == 2 and record.not_built == {}, record.message


H200 = GpuFacts(name="NVIDIA H200", major=9, minor=0, multi_processor_count=132, total_memory=141 * 2**30)
ASKS_THE_DEVICE = variant(SEED, """    _axpy[(triton.cdiv(n, BLOCK),)](""", """    sms = torch.cuda.get_device_properties(x.device).multi_processor_count  # persistent-kernel code asks this
    assert torch.cuda.get_device_capability() == (9, 0) and sms == 132
    _axpy[(triton.cdiv(n, BLOCK),)](""")


def test_host_code_that_asks_the_gpu_its_properties_is_answered_with_the_evaluators(builder: Builder) -> None:
    told, _ = builder.build_triton(ASKS_THE_DEVICE, SM90, TOY, "benchmarks", H200)
    assert told.status is Status.PASSED and told.kernels == 2 and told.not_built == {}, told.not_built
    untold, _ = builder.build_triton(ASKS_THE_DEVICE, SM90, TOY, "benchmarks")  # evaluators of several GPU kinds
    assert untold.kernels == 0 and set(untold.not_built) == {"n1000", "n4096"}


def test_the_decode_seed_that_launches_through_its_compiled_kernels_is_built_whole(builder: Builder) -> None:
    """GQA decode's seed asks the SM count and, after each kernel's first launch, launches through the compiled
    kernel's own launcher (its host work per call): both kernels of every workload compile."""
    task = find_task("gqa_paged_decode_h32_kv4_d128_ps1")
    record, _ = builder.build_triton(task.solution("triton_splitkv"), SM90, task, "feedback", H200)
    assert record.status is Status.PASSED and record.not_built == {} and record.kernels >= 4, record.not_built


def test_the_evaluators_gpu_is_told_only_when_they_all_have_the_same_one() -> None:
    def info(name: str, sms: int) -> EvaluatorInfo:
        return EvaluatorInfo(device="cuda", name=name, hardware="", compute_capability="9.0", sm_count=sms,
                             memory_gib=139.8, l2_cache_mib=60.0)

    facts = gpu_facts([info("NVIDIA H200", 132), info("NVIDIA H200", 132)])
    assert facts is not None and (facts.major, facts.minor, facts.multi_processor_count) == (9, 0, 132)
    assert facts.L2_cache_size == 60 * 2**20
    assert gpu_facts([info("NVIDIA H200", 132), info("NVIDIA H100 PCIe", 114)]) is None
    assert gpu_facts([EvaluatorInfo(device="cpu", name="cpu", hardware="")]) is None and gpu_facts([]) is None


def test_a_packaged_tasks_inputs_are_shaped_once_by_the_trusted_builder_and_nobody_elses(builder: Builder) -> None:
    """The builder works out a packaged task's input shapes itself, once, and hands them to every build job: a
    worker then skips the generator (MLA's makes its inputs for real: 15-25 s a build). A task from outside the
    package gets none: its generator runs only in the sandbox."""
    task = find_task("trimul")
    workloads = task.workloads("benchmarks", "cuda")
    specs = builder._input_specs(task, workloads)
    assert set(specs) == {w.name for w in workloads}
    rebuilt = from_spec(specs[workloads[0].name])
    axes = workloads[0].axes
    x = rebuilt["x"]
    assert isinstance(x, OnTheGpu) and x.is_cuda and tuple(x.shape) == (axes["B"], axes["N"], axes["N"], axes["D"])
    assert x.dtype == torch.float32 and x.as_subclass(torch.Tensor).is_meta
    assert builder._input_specs(TOY, TOY.workloads("benchmarks", "cuda")) == {}
    # The round trip keeps strides, offsets and scalars.
    view = torch.empty(64, dtype=torch.float16, device="meta")[8:].as_strided((4, 7), (1, 8), 8)
    back = from_spec(input_spec({"v": view, "n": 3, "s": [1.5, None]}))
    assert back["v"].stride() == (1, 8) and back["v"].storage_offset() == 8 and back["v"].data_ptr() == 16
    assert back["n"] == 3 and back["s"] == [1.5, None]


def test_the_build_key_covers_sources_target_triton_torch_and_workloads() -> None:
    tc = probe_toolchain()
    workloads = TOY.workloads("benchmarks", "cuda")
    base = triton_build_key(SEED, SM90, tc, TOY.name, workloads)
    assert base == triton_build_key(SEED.model_copy(update={"name": "renamed"}), SM90, tc, TOY.name, workloads)
    others = {
        triton_build_key(variant(SEED, "BLOCK = 128", "BLOCK = 256"), SM90, tc, TOY.name, workloads),
        triton_build_key(SEED, BuildTarget(archs=("8.0",)), tc, TOY.name, workloads),
        triton_build_key(SEED, SM90, tc.model_copy(update={"torch": "0.0"}), TOY.name, workloads),
        triton_build_key(SEED, SM90, tc, TOY.name, workloads[:1]),
        triton_build_key(SEED, SM90, tc, "another_task", workloads),
        triton_build_key(SEED, SM90, tc, TOY.name, workloads, H200),
    }
    assert base not in others and len(others) == 6


def _kernel(cache: Path, name: str) -> Path:
    folder = cache / name
    folder.mkdir(parents=True)
    (folder / "_k.cubin").write_bytes(b"\x7fELF" + os.urandom(64))
    (folder / "__grp___k.json").write_text(json.dumps({"child_paths": {"_k.cubin": str(folder / "_k.cubin")}}))
    return folder


def test_a_pack_carries_only_kernel_files(tmp_path: Path) -> None:
    """What a hostile build leaves in its Triton cache: links, a pipe, deeper folders, odd names."""
    cache = tmp_path / "cache"
    folder = _kernel(cache, "AAAA")
    (folder / "passwd.cubin").symlink_to("/etc/passwd")
    os.mkfifo(folder / "pipe.json")
    (folder / "deeper").mkdir()
    (folder / "deeper" / "x.cubin").write_text("x")
    (folder / "bad name.cubin").write_text("x")
    (cache / "LINKED").symlink_to(folder)  # a kernel folder that is a link is no kernel
    (cache / "no-group").mkdir()
    (cache / "no-group" / "_k.cubin").write_text("half a kernel")
    data, kernels = pack(cache)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        assert sorted(tar.getnames()) == ["AAAA/__grp___k.json", "AAAA/_k.cubin"]
    assert kernels == 1
    launcher = cache / "LAUNCHER"  # a kernel signature's launcher travels with the kernels
    launcher.mkdir()
    (launcher / "__triton_launcher.cpython-311-x86_64-linux-gnu.so").write_bytes(b"\x7fELF")
    data, kernels = pack(cache)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        assert sorted(tar.getnames()) == ["AAAA/__grp___k.json", "AAAA/_k.cubin",
                                          "LAUNCHER/__triton_launcher.cpython-311-x86_64-linux-gnu.so"]
    assert kernels == 1
    # Triton's compiled helper modules (a folder without a group file) travel only when asked for.
    helper = cache / "HELPER"
    helper.mkdir()
    (helper / "cuda_utils.cpython-311-x86_64-linux-gnu.so").write_bytes(b"\x7fELF")
    everything, folders = pack(cache, kernels_only=False)
    with tarfile.open(fileobj=io.BytesIO(everything)) as tar:
        assert "HELPER/cuda_utils.cpython-311-x86_64-linux-gnu.so" in tar.getnames() and folders == 4
    (tmp_path / "link").symlink_to(cache)
    with pytest.raises(PackError, match="not a folder"):
        pack(tmp_path / "link")
    with pytest.raises(PackError, match="exceed"):
        pack(cache, limit=10)


def test_unpacking_points_each_group_file_into_its_own_cache_and_refuses_one_that_points_elsewhere(tmp_path: Path) -> None:
    """Triton finds a kernel through its group file's absolute paths: a build's name its own folder, gone on the GPU
    node, and a hostile build's could name anything. Unpacked, they name the files in the cache they land in."""
    source = tmp_path / "built"
    folder = _kernel(source, "AAAA")
    (folder / "__grp___k.json").write_text(json.dumps({"child_paths": {
        "_k.cubin": "/some/build/job/triton/AAAA/_k.cubin", "_k.json": "/etc/passwd"}}))
    data, _ = pack(source)
    cache = tmp_path / "worker-cache"
    assert unpack(data, cache) == 1
    group = json.loads((cache / "AAAA" / "__grp___k.json").read_text())
    assert group == {"child_paths": {"_k.cubin": str(cache / "AAAA" / "_k.cubin"), "_k.json": str(cache / "AAAA" / "_k.json")}}
    for children in ({"../../x": "/tmp/x"}, [], None):
        (folder / "__grp___k.json").write_text(json.dumps({"child_paths": children}))
        data, _ = pack(source)
        fresh = tmp_path / f"fresh-{len(str(children))}"
        with pytest.raises(PackError, match="group file in AAAA is malformed"):
            unpack(data, fresh)
        assert not list(fresh.rglob("__grp__*"))  # nothing of a refused group file is left for Triton to read
    (folder / "__grp___k.json").write_text("not json")
    with pytest.raises(PackError, match="malformed"):
        unpack(pack(source)[0], tmp_path / "fresh-text")


def test_unpacking_never_follows_a_link_a_worker_planted_and_keeps_files_already_there(tmp_path: Path) -> None:
    source = tmp_path / "built"
    _kernel(source, "AAAA")
    data, _ = pack(source)
    # An earlier worker of the same candidate made its kernel folder a link into the user's files.
    victim = tmp_path / "victim"
    victim.mkdir()
    cache = tmp_path / "worker-cache"
    cache.mkdir()
    (cache / "AAAA").symlink_to(victim)
    with pytest.raises(PackError):
        unpack(data, cache)
    assert list(victim.iterdir()) == []
    # A file already there is kept (a worker's own compile of the same key wrote it).
    clean = tmp_path / "clean"
    _kernel(clean, "AAAA")
    kept = (clean / "AAAA" / "_k.cubin").read_bytes()
    assert unpack(data, clean) == 1 and (clean / "AAAA" / "_k.cubin").read_bytes() == kept
    # A pack that names a path outside its cache is refused whole.
    evil = io.BytesIO()
    with tarfile.open(fileobj=evil, mode="w:gz") as tar:
        member = tarfile.TarInfo("../escaped")
        member.size = 1
        tar.addfile(member, io.BytesIO(b"x"))
    with pytest.raises(PackError, match="not a kernel's file"):
        unpack(evil.getvalue(), tmp_path / "fresh")
    assert not (tmp_path / "escaped").exists()


def test_an_evaluation_puts_the_builds_kernels_in_its_triton_cache_and_refuses_anothers(builder: Builder,
                                                                                         tmp_path: Path) -> None:
    record, data = builder.build_triton(SEED, SM90, TOY, "benchmarks")
    assert data is not None
    evaluator = Evaluator("cpu", work_root=tmp_path / "evaluator")
    try:
        result = evaluator.evaluate(TOY, SEED, workload_set="tests", timed=False, prebuilt=(record, data))
        assert result.passed, result.message
        assert result.triton_prebuilt == 2 and result.triton_compiled is None  # the CPU path interprets
        assert kernel_dirs(tmp_path / "evaluator" / "cache" / SEED.id / "triton") and result.triton_not_built == {}
        other = variant(SEED, "NUM_WARPS = 4", "NUM_WARPS = 8")
        with pytest.raises(ValueError, match="not this solution's build"):
            evaluator.evaluate(TOY, other, workload_set="tests", timed=False, prebuilt=(record, data))
    finally:
        evaluator.close()


# --- the pool: Triton builds on CPU tasks, ahead of the evaluators --------------------------------------


@pytest.mark.slow
def test_the_pools_triton_build_reaches_the_evaluator_and_a_compile_error_takes_none(
        ray_session, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU path interprets, so the pool would build no Triton kernels for it: here it is told its
    evaluators are sm_90 GPUs. The build task, Ray's object store, the evaluator actor and its sandbox are real."""
    monkeypatch.setattr(RayEvaluatorPool, "_gpus_compile_triton", lambda self: True)
    monkeypatch.setattr(RayEvaluatorPool, "_target", lambda self: SM90)
    config = settings(task="toy_axpy", task_dirs=[str(DATA)], device="cpu", evaluators=1, build_cpus=1,
                      scratch_dir=str(tmp_path / "scratch"), triton_builds=True)

    async def go() -> tuple:
        pool = RayEvaluatorPool(config, f"t{time.time_ns()}")
        try:
            good = await pool.evaluate(SEED, "tests")
            broken = await pool.evaluate(NOT_A_POWER_OF_TWO, "tests")
            plain = await pool.evaluate(TOY.solution("good"), "tests")  # PyTorch only: no build to wait for
            return good, broken, plain, pool
        finally:
            pool.release()

    (good, good_index), (broken, broken_index), (plain, _), pool = asyncio.run(go())
    assert good.passed and good_index == 0 and good.triton_prebuilt == 2, (good.message, good.triton_not_built)
    assert broken.status is Status.COMPILE_ERROR and broken_index == BUILDER and "CompilationError" in broken.message
    assert plain.passed and plain.triton_prebuilt is None
    assert pool.builds == 2 and set(pool.busy_s) == {0}


def test_a_build_worker_inherits_tritons_key_from_its_zygote_and_yields_the_cpus(builder: Builder) -> None:
    """A build runs at a nice value of 10 or more, so that a measurement on the same host comes first. Triton's key (a hash of its installed files, 0.2-0.3 s here) is worked out once in the zygote, not in every
    worker before its first kernel: this candidate refuses to import in a worker that would compute it."""
    checks = variant(SEED, "import torch\n", "import torch\nfrom triton.runtime.cache import triton_key\n"
                     "assert triton_key.cache_info().currsize == 1, 'this worker would hash Triton itself'\n"
                     "import os\nassert os.nice(0) >= 10, 'a build that competes with measurements for the CPUs'\n")
    record, _ = builder.build_triton(checks, SM90, TOY, "benchmarks")
    assert record.status is Status.PASSED and record.kernels == 2, record.message


def test_a_c_module_built_against_the_stand_in_libcuda_loads_where_the_real_one_is(tmp_path: Path) -> None:
    """A build's launchers are linked against an empty stand-in libcuda. A linker that drops unused libraries
    (Debian's and Ubuntu's default) would leave libcuda out of the module's needs, and the GPU worker's load
    would fail on the first CUDA symbol (so it would build the launcher again): Triton's own build does that
    here, the build worker's does not. `fake` plays the driver's libcuda."""
    from triton.runtime import build

    stub = stand_in_libcuda(tmp_path / "stub")
    (tmp_path / "m.c").write_text("int cuInit(unsigned int);\nint f(void) { return cuInit(0); }\n")
    (tmp_path / "fake.c").write_text("int cuInit(unsigned int flags) { return 7; }\n")
    (tmp_path / "fake").mkdir()
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(tmp_path / "fake" / "libcuda.so.1"),
                    str(tmp_path / "fake.c")], check=True)
    loads, needs = {}, {}
    for how in ("ours", "tritons"):
        (tmp_path / how).mkdir()
        args = ("m", str(tmp_path / "m.c"), str(tmp_path / how), [str(stub)], [], ["libcuda.so.1"])
        module = _build_naming_libcuda(*args) if how == "ours" else build._build(*args, [])
        loaded = subprocess.run([sys.executable, "-c", f"import ctypes; print(ctypes.CDLL({module!r}).f())"],
                                env={**os.environ, "LD_LIBRARY_PATH": str(tmp_path / "fake")}, capture_output=True, text=True)
        loads[how] = loaded.stdout.strip() or loaded.stderr.strip().splitlines()[-1]
        needs[how] = "[libcuda.so.1]" in subprocess.run(["readelf", "-d", module], capture_output=True, text=True).stdout
    assert loads["ours"] == "7" and needs["ours"], loads
    if not needs["tritons"]:  # this machine's linker drops unused libraries, as Debian's and Ubuntu's do
        assert "undefined symbol: cuInit" in loads["tritons"], loads


def test_a_build_host_without_a_c_compiler_builds_the_kernels_and_leaves_the_launchers(tmp_path: Path) -> None:
    """No gcc on PATH: the stand-in libcuda cannot be made; the build goes on with the kernels alone (one line
    on stderr), as before launchers were built, rather than failing."""
    code = ("import sys; from pathlib import Path\n"
            "from ksearch_ray.evaluation.sandbox.triton_build import stand_in_driver\n"
            "from triton.runtime.driver import driver\n"
            f"stand_in_driver(90, launchers=Path({str(tmp_path / 'libcuda')!r}))\n"
            "print(type(driver.active).__name__, driver.active.launcher_cls.__name__)\n")
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PATH": str(tmp_path / "nothing-here")},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["StandIn", "_NoLaunch"], done.stdout
    if launchers_per_signature():
        assert "no stand-in libcuda" in done.stderr, done.stderr[-1000:]


@pytest.mark.skipif(ctypes.util.find_library("cuda") is not None, reason="this host has a libcuda: the helper compiles")
def test_a_driver_helper_that_cannot_be_compiled_ahead_leaves_it_to_the_workers(tmp_path: Path, caplog) -> None:
    """No libcuda on this machine: the evaluator's one attempt fails, says so in one line, and is not repeated."""
    evaluator = Evaluator("cpu", work_root=tmp_path / "evaluator", start=False)
    try:
        evaluator.triton_helper_ahead = True  # as a GPU evaluator with evaluation.triton_helper_ahead has it
        assert evaluator.triton_helper() is None and evaluator.triton_helper() is None
        warnings = [r.getMessage() for r in caplog.records if "driver helper" in r.getMessage()]
        assert len(warnings) == 1 and "CalledProcessError" in warnings[0] and "libcuda" in warnings[0], warnings
    finally:
        evaluator.close()


def test_the_driver_helper_compiled_ahead_is_tritons_cuda_utils_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where a libcuda can be linked against (a stand-in here; the driver's own on a GPU host), the evaluator's
    process compiles Triton's driver helper into a pack of its own, for each new candidate's cache."""
    monkeypatch.setenv("TRITON_LIBCUDA_PATH", str(stand_in_libcuda(tmp_path / "libcuda")))
    evaluator = Evaluator("cpu", work_root=tmp_path / "evaluator", start=False)
    try:
        evaluator.triton_helper_ahead = True
        data = evaluator.triton_helper()
        assert data is not None
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            names = tar.getnames()
        assert len(names) == 1 and names[0].split("/")[1].startswith("cuda_utils."), names
    finally:
        evaluator.close()


def test_an_evaluator_keeps_the_triton_caches_of_the_solutions_it_used_last(tmp_path: Path) -> None:
    """One cache per candidate would grow without bound in a long search: the least recently used go."""
    evaluator = Evaluator("cpu", work_root=tmp_path / "evaluator", start=False)
    try:
        evaluator.triton_caches_kept = 2
        a, b, c, d = (variant(SEED, "BLOCK = 128", f"BLOCK = {n}") for n in (64, 256, 512, 1024))
        for solution in (a, b, c):
            (evaluator._triton_cache_dir(solution) / "KERNEL").mkdir()
        caches = tmp_path / "evaluator" / "cache"
        assert sorted(p.name for p in caches.iterdir()) == sorted([b.id, c.id])
        evaluator._triton_cache_dir(b)  # used again: now the newest
        evaluator._triton_cache_dir(d)
        assert sorted(p.name for p in caches.iterdir()) == sorted([b.id, d.id])
        assert (caches / b.id / "triton" / "KERNEL").is_dir()
    finally:
        evaluator.close()


def test_a_build_worker_sees_no_secret_of_the_builders_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A canary key in the build task's environment: the candidate's import, which reads the environment and
    puts what it finds in its failure, gets nothing, and the record (which reaches events and prompts) holds none."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-canary-build-4242")
    monkeypatch.setenv("DATABASE_URL", "postgres://u:canarypw@h/db")
    snoops = variant(SEED, "import torch\n", "import os\nimport torch\nraise RuntimeError('found ' + "
                     "os.environ.get('OPENAI_API_KEY', 'no key') + ' and ' + os.environ.get('DATABASE_URL', 'no url'))\n")
    b = Builder(tmp_path / "builder", BuildCache(tmp_path / "cache"))
    try:
        record, _ = b.build_triton(snoops, SM90, TOY, "benchmarks")
    finally:
        b.close()
    said = " ".join(record.not_built.values()) + record.message + record.log
    assert record.status is Status.PASSED and "import failed" in said and "found " in said  # it did look
    assert "sk-canary" not in said and "canarypw" not in said
