"""The sandboxed side of an evaluation: runs in a process forked from the zygote for one candidate.

`serve` sets the process up (its job directory, output logs, caches, CUDA context, the native
stopwatch, the integrity guard), then runs the harness (sandbox/harness.py: build, correctness)
and the command that follows (sandbox/timer.py: timing or re-timing), all in the protocol of
sandbox/protocol.py. Timed calls are measured by the native stopwatch (clock.py): its records go
from C to a pipe the evaluator reads, never through this process's Python objects, and the
messages carry counts and hand-overs, no times.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch

from ksearch_ray.evaluation.sandbox import clock, integrity
from ksearch_ray.evaluation.sandbox.channel import Channel
from ksearch_ray.evaluation.sandbox.handover import Exporter
from ksearch_ray.evaluation.sandbox.harness import CandidateFailure, Worker
from ksearch_ray.evaluation.sandbox.protocol import Fail, Go, Job, Ready, RetimeCmd, StopCmd, TimeCmd
from ksearch_ray.evaluation.sandbox.timer import run_retime, run_timing
from ksearch_ray.models import Status
from ksearch_ray.text import clip

_perf = integrity.perf_counter
BUILD_NICENESS = 10
"""Added to a build worker's nice value (builds run beside measurements on a GPU host without build nodes)."""


def _redirect_output() -> None:
    """Python's streams onto fds 1 and 2: pipes the sandbox's parent process drains into stdout.log and
    stderr.log of the job directory, up to the output limit (sandbox/resources.py)."""
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115


def _private_flashinfer_workspace(workdir: Path) -> None:
    """FlashInfer writes into its JIT cache even when every module is built, and the shared cache is
    read-only in the sandbox (warm it first: experiments/flashinfer_warmup.py). At import it opens
    <ver>/<arch>/flashinfer_jit.log; at a module's first use it locks cached_ops/tmp/<module>.lock,
    rewrites generated sources and build.ninja where they differ, and runs ninja in the module's
    directory. So this worker gets a workspace of its own: real directories down to cached_ops/ and
    generated/ (its own log and lock files go there), each module in them a link to the shared one.
    FlashInfer resolves links when it writes build.ninja, so the file it makes equals the shared one
    and ninja, finding nothing to do, writes nothing; a module the warm-up did not build is built
    here, in the worker's own directory (slow, but no failure)."""
    base = os.environ.get("FLASHINFER_WORKSPACE_BASE")
    if not base or not os.path.isdir(base) or os.access(base, os.W_OK):
        return
    mine = workdir / "flashinfer_workspace"
    shared = Path(base) / ".cache" / "flashinfer"
    own = mine / ".cache" / "flashinfer"
    own.mkdir(parents=True)
    if shared.is_dir():
        _mirror_flashinfer_dir(shared, own)
    os.environ["FLASHINFER_WORKSPACE_BASE"] = str(mine)


_FLASHINFER_OWN_DIRS = {"cached_ops", "generated"}  # made real in the mirror; their modules stay links


def _mirror_flashinfer_dir(shared: Path, own: Path, depth: int = 0) -> None:
    """`own` mirrors `shared`: directories down to cached_ops/ and generated/ are real (the version
    and architecture levels; without a GPU FlashInfer leaves the architecture level out), the rest links."""
    for entry in shared.iterdir():
        target = own / entry.name
        if entry.name in _FLASHINFER_OWN_DIRS and entry.is_dir():
            target.mkdir()
            for module in entry.iterdir():
                if not (entry.name == "cached_ops" and module.name == "tmp"):  # locks: this worker's own
                    (target / module.name).symlink_to(module)
        elif entry.is_dir() and not entry.is_symlink() and depth < 2:  # <version>/, <version>/<arch>/
            target.mkdir()
            _mirror_flashinfer_dir(entry, target, depth + 1)
        elif entry.suffix != ".log":  # logs: this worker's own
            target.symlink_to(entry)


def serve(chan: Channel, job: dict[str, Any], clock_fd: int) -> int:
    """Run one job to the end; returns the process exit code."""
    workdir = Path(job["workdir"])
    os.chdir(workdir)
    _redirect_output()
    os.environ["TRITON_CACHE_DIR"] = job["triton_cache_dir"]
    os.environ["TORCH_EXTENSIONS_DIR"] = str(workdir / "torch_extensions")
    os.environ["HOME"] = str(workdir)
    _private_flashinfer_workspace(workdir)
    if job.get("type") in ("build", "triton_build"):
        # A build shares its host with the evaluators where the cluster has no build nodes: it yields the CPUs to a
        # measurement (a call's timing includes its host work), never the other way round.
        os.nice(BUILD_NICENESS)
    if job.get("type") == "build":  # a build ahead of the evaluation (ksearch_ray.evaluation.builder)
        from ksearch_ray.evaluation.sandbox.build import serve_build

        return serve_build(chan, job)
    if job.get("type") == "triton_build":  # a Triton candidate's kernels compiled on a CPU (evaluation/builder.py)
        from ksearch_ray.evaluation.sandbox.triton_build import serve_triton_build

        return serve_triton_build(chan, job)
    if job.get("type") == "reference":  # an untrusted task's references (evaluation/reference.py)
        from ksearch_ray.evaluation.sandbox.reference_worker import serve_reference

        return serve_reference(chan, job)
    if job.get("type") == "profile":  # one call under Nsight Compute (evaluation/profiling.py)
        from ksearch_ray.evaluation.sandbox.profiler import serve_profile

        return serve_profile(chan, job)
    t0 = _perf()
    worker: Worker | None = None
    try:
        worker = Worker(chan, Job.model_validate(job))
        if worker.cuda:
            torch.cuda.init()
            torch.empty(1, device="cuda")  # context creation belongs to sandbox overhead, not to the candidate
        try:
            clock.stopwatch().start(clock_fd, worker.cuda, torch.cuda.current_stream().cuda_stream if worker.cuda else 0)
        except RuntimeError as exc:
            print(f"sandbox fault: {exc}", file=sys.stderr, flush=True)
            return 98  # before "ready": the evaluator reports a sandbox fault, not a candidate failure
        worker.exporter = Exporter(worker.device, device_handover=worker.job.device_handover,
                                   expect_bytes=worker.job.handover_bytes)
        worker.guard = integrity.Guard(worker.task_functions())
        if worker.cuda:
            worker.report_compiles()
        chan.send(Ready(setup_s=_perf() - t0))
        if worker.job.wait_for_turn:  # the evaluator's go: this candidate's turn on the device
            turn = worker.receive()
            if isinstance(turn, StopCmd):
                return 0
            if not isinstance(turn, Go):
                raise RuntimeError(f"the evaluator answered Ready with {turn.type!r}")
        worker.build()
        worker.correctness()
        cmd = worker.receive()
        if isinstance(cmd, TimeCmd):
            run_timing(worker, cmd)
        elif isinstance(cmd, RetimeCmd):
            run_retime(worker, cmd)
    except CandidateFailure as failure:
        status, message = failure.status, failure.message
        if status.passed:  # the candidate raised the harness's own exception with a verdict of its choosing
            status, message = Status.INTEGRITY_VIOLATION, f"the candidate raised a failure that claims PASSED ({clip(message, 200)})"
        chan.send(Fail(status=status, message=message, log=failure.log,
                       workload=worker.current if worker is not None else None))
    sys.stdout.flush()
    sys.stderr.flush()
    return 0
