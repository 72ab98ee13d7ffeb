"""Building CUDA/C++ candidates ahead of their evaluation, on a CPU: the trusted side of a build job.

A `Builder` owns a node's build cache and a sandbox of the evaluators' kind (the same zygote,
fork, scrubbed environment and authenticated channel; no GPU visible). A build runs
candidate-supplied sources through the compiler, so it runs there, never in this process:

    Builder.build(solution, target)
      key = sha256(sources, flags, target archs, toolchain)   cache hit -> (record, library), done
      fork a sandboxed worker: compile into its job directory (sandbox.build.serve_build)
      wait for `built` / `fail` (or a timeout, or its death); kill its process group
      read the library the worker left, hash it, cache it (compile errors too), return it

The library is returned as bytes: the Ray task that calls this (ksearch_ray.actors.build_task)
puts it in the object store, from which the evaluator's node fetches it.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from ksearch_ray.evaluation.buildcache import (
    BuildCache,
    BuildRecord,
    BuildTarget,
    build_key,
    module_name_for,
    probe_toolchain,
    sha256_bytes,
)
from ksearch_ray.evaluation.sandbox.build import build_flags
from ksearch_ray.evaluation.sandbox.channel import ChannelClosed, ChannelForgery, ChannelTimeout
from ksearch_ray.evaluation.sandbox.handle import Sandbox, job_dir
from ksearch_ray.evaluation.sandbox.isolation import Isolation
from ksearch_ray.evaluation.sandbox.protocol import (
    BuildJob,
    Built,
    Fail,
    GpuFacts,
    Progress,
    ProtocolError,
    TritonBuildJob,
    TritonBuilt,
    parse_report,
)
from ksearch_ray.evaluation.sandbox.resources import LOG_TAIL_BYTES, Resources, read_tail
from ksearch_ray.evaluation.settings import Limits
from ksearch_ray.evaluation.tritoncache import PackError, capability_of, triton_build_key
from ksearch_ray.evaluation.tritoncache import pack as pack_kernels
from ksearch_ray.models import Solution, Status
from ksearch_ray.taskspec.spec import Workload
from ksearch_ray.taskspec.task import Task
from ksearch_ray.text import Redactor, clip


class Builder:
    """Builds one solution at a time in its own sandbox; many Builders may share one cache directory."""

    def __init__(self, work_root: Path, cache: BuildCache, *, timeout_s: float = 900.0, max_jobs: int = 1, node: str = "",
                 isolation: Isolation = Isolation.BEST_EFFORT, triton_idle_s: float = 60.0):
        """`triton_idle_s`: a Triton build that reports nothing (no kernel compiled, no workload called) this long
        is a TIMEOUT, and its evaluation's worker compiles the kernels itself (and judges the hang, if it is one)."""
        self.work_root = Path(work_root)
        self.cache = cache
        self.timeout_s = timeout_s
        self.max_jobs = max_jobs
        self.triton_idle_s = triton_idle_s
        self._specs: dict[tuple[str, str], Any] = {}  # (task root, workload) -> its inputs' shapes (trusted tasks)
        self.node = node
        # A build needs no GPU, and sees none; it has a candidate's limits (the defaults: compilers need no more).
        # Its Triton compiles for the evaluators' GPU (Triton builds), never interprets.
        self.sandbox = Sandbox("cpu", self.work_root, resources=Resources(**Limits().resources()), isolation=isolation,
                               triton_compiles=True)
        self.redact = Redactor.from_environment()

    def close(self) -> None:
        self.sandbox.close()

    def key(self, solution: Solution, target: BuildTarget) -> str:
        return build_key(solution, target, probe_toolchain(), build_flags())

    def build(self, solution: Solution, target: BuildTarget) -> tuple[BuildRecord, bytes | None]:
        """The build of `solution` for `target`: from this node's cache, or compiled now (and cached)."""
        key = self.key(solution, target)
        hit = self.cache.get(key)
        if hit is not None:
            record, library = hit
            return record.model_copy(update={"solution_id": solution.id}), library
        record, library = self._compile(solution, target, key)
        self.cache.put(record, library)
        return record, library

    def build_triton(self, solution: Solution, target: BuildTarget, task: Task, workload_set: str,
                     gpu: GpuFacts | None = None) -> tuple[BuildRecord, bytes | None]:
        """The Triton kernels of `solution` (a Python candidate) compiled for `target`'s GPUs, as each
        workload of `workload_set` (its GPU variant) launches them: from this node's cache, or compiled
        now (and cached). The bytes are a pack of the kernels (evaluation/tritoncache.py). `gpu`: the
        evaluators' GPU, which the candidate's host code is told of when it asks."""
        if not target.archs:
            raise ValueError("a Triton build needs the evaluators' GPU architectures (BuildTarget.archs)")
        workloads = task.workloads(workload_set, "cuda")
        key = triton_build_key(solution, target, probe_toolchain(), task.name, workloads, gpu)
        hit = self.cache.get(key)
        if hit is not None:
            record, pack = hit
            return record.model_copy(update={"solution_id": solution.id}), pack
        record, pack = self._compile_triton(solution, target, task, workloads, key, gpu)
        self.cache.put(record, pack)
        return record, pack

    def _compile(self, solution: Solution, target: BuildTarget, key: str) -> tuple[BuildRecord, bytes | None]:
        module = module_name_for(key)
        record = BuildRecord(key=key, solution_id=solution.id, status=Status.PASSED, module_name=module,
                             toolchain=probe_toolchain(), target=target, built_on=self.node)
        workdir = self._workdir(solution)
        job = BuildJob(workdir=str(workdir), triton_cache_dir=str(workdir / "triton"), module_name=module,
                       archs=list(target.archs), max_jobs=self.max_jobs)
        library = None
        try:
            if isinstance(self._run(record, [job], workdir, Built), Built):
                path = workdir / "build" / f"{module}.so"
                if not path.is_file():
                    record.status, record.message = Status.CRASHED, "the build reported success but left no library"
                else:
                    library = path.read_bytes()
                    record.sha256, record.size = sha256_bytes(library), len(library)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        return record, library

    def _compile_triton(self, solution: Solution, target: BuildTarget, task: Task, workloads: list[Workload],
                        key: str, gpu: GpuFacts | None) -> tuple[BuildRecord, bytes | None]:
        record = BuildRecord(key=key, solution_id=solution.id, status=Status.PASSED, module_name=f"ks_{solution.id}",
                             toolchain=probe_toolchain(), target=target, built_on=self.node, kind="triton")
        workdir = job_dir(self.work_root, solution.id, solution.sources, gpumode=task.definition.interface == "gpumode")
        inputs = self._input_specs(task, workloads)
        jobs = [TritonBuildJob(workdir=str(workdir), triton_cache_dir=str(workdir / "triton"), task_root=str(task.root),
                               solution_id=solution.id, entry_file=solution.entry_file, entry_point=solution.entry_point,
                               capability=capability, workloads=workloads,
                               gpu=gpu if gpu is not None and gpu.major * 10 + gpu.minor == capability else None,
                               inputs=inputs or None)
                for capability in sorted({capability_of(arch) for arch in target.archs})]
        pack = None
        try:
            report = self._run(record, jobs, workdir, TritonBuilt, idle_s=self.triton_idle_s)
            if isinstance(report, TritonBuilt):
                names = {w.name for w in workloads}  # the report is the candidate's process's: keep what is plausible
                record.not_built = {name: self.redact(clip(why, 300)) for name, why in report.not_built.items() if name in names}
                try:
                    pack, record.kernels = pack_kernels(workdir / "triton")
                except (PackError, OSError) as exc:  # left by the candidate's process: its doing
                    limit = isinstance(exc, PackError) and exc.over_limit
                    record.status = Status.RESOURCE_LIMIT if limit else Status.INTEGRITY_VIOLATION
                    record.message, pack = f"the compiled kernels were not kept: {exc}", None
                else:
                    record.sha256, record.size = sha256_bytes(pack), len(pack)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        return record, pack

    def _input_specs(self, task: Task, workloads: list[Workload]) -> dict[str, Any]:
        """Each workload's inputs as shapes (`triton_build.input_spec`), for a task of the package's own: made here
        once per workload (its generator is trusted code) and kept, so that a build worker skips the generator,
        which makes some tasks' inputs for real on its one CPU thread (MLA's: 15-25 s a build). Another task's
        generator runs only in the sandbox, so its workloads get none. A generator that fails here: none either."""
        if not task.trusted:
            return {}
        from ksearch_ray.evaluation.sandbox.triton_build import input_spec, meta_inputs

        specs = {}
        for workload in workloads:
            key = (str(task.root), workload.model_dump_json())
            if key not in self._specs:
                try:
                    self._specs[key] = input_spec(meta_inputs(task, workload))
                except Exception:  # noqa: BLE001  (the worker makes them itself, and says why it cannot)
                    self._specs[key] = None
            if self._specs[key] is not None:
                specs[workload.name] = self._specs[key]
        return specs

    def _workdir(self, solution: Solution) -> Path:
        return job_dir(self.work_root, solution.id, solution.sources)

    def _run(self, record: BuildRecord, jobs: Sequence[BaseModel], workdir: Path, success: type[BaseModel],
             idle_s: float | None = None) -> BaseModel | None:
        """Run `jobs` one after another in sandboxed workers (one per job) and read each one's report into
        `record` (a failure's status and message); the last report when every job reported `success`.
        `idle_s`: the job reports progress, and this long without any is a TIMEOUT (a candidate's host code
        that loops, where a Triton build waits for nothing else); the whole stays within `timeout_s`."""
        t0 = time.monotonic()
        report: BaseModel | None = None
        for job in jobs:
            worker = self.sandbox.start(job.model_dump(mode="json"))
            report = None
            try:
                deadline = time.monotonic() + self.timeout_s
                while True:
                    wait = deadline - time.monotonic()
                    limit = wait if idle_s is None else min(wait, idle_s)
                    msg = parse_report(worker.chan.recv(max(limit, 0.001)))
                    if not isinstance(msg, Progress) or idle_s is None:
                        break
                if isinstance(msg, Fail):
                    # Whatever status a compromised worker claims, a failed build is a compile error.
                    record.status, record.message, record.log = Status.COMPILE_ERROR, clip(msg.message, 500), msg.log
                elif not isinstance(msg, success):
                    record.status, record.message = Status.INTEGRITY_VIOLATION, f"unexpected message {msg.type!r} from the build"
                else:
                    report = msg
            except ProtocolError as exc:
                record.status, record.message = Status.INTEGRITY_VIOLATION, f"malformed message from the build ({exc})"
            except ChannelTimeout:
                record.status, record.message = Status.TIMEOUT, (
                    f"the build gave no result in {self.timeout_s:.0f} s" if idle_s is None or time.monotonic() >= deadline
                    else f"the build made no progress in {idle_s:.0f} s")
            except ChannelClosed:
                record.status, record.message, record.log = Status.CRASHED, "the build process died", _tail(workdir)
            except ChannelForgery as exc:
                record.status, record.message = Status.INTEGRITY_VIOLATION, f"forged message on the build channel ({exc})"
            finally:
                # Nothing the candidate started may still run while its output is read.
                self.sandbox.kill(worker)
                self.sandbox.reap(worker)
            if report is None:
                break
        record.seconds = time.monotonic() - t0
        record.message, record.log = self.redact(record.message), self.redact(record.log)  # candidate output, in
        return report


def _tail(workdir: Path) -> str:
    tails = []
    for name in ("stderr.log", "stdout.log"):
        text = read_tail(workdir / name, LOG_TAIL_BYTES).strip()  # never the whole log: a candidate's output is hostile
        if text:
            tails.append(text[-1500:])
    return "\n".join(tails)
