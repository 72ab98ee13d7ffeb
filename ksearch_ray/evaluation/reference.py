"""References of a task from outside the package, computed in the sandbox (the evaluator's end).

The judge computes a trusted task's references in the evaluator's own process (judge.py). A task
that did not ship with the package (`Task.trusted` is false) brings its own input generator and
reference, which are as untrusted as a candidate: they run in a worker of the evaluator's sandbox
(sandbox/reference_worker.py), one per task, kept for as long as the judge is. The judge asks it for
the reference of one (workload, seed, options) and receives the outputs through the same sealed
hand-over a candidate's come through (sandbox/handover.py), as tensors of this process; it only
compares. Candidates never share that worker's process, namespaces or job directory.

When that worker dies (it dies with the zygote, which a candidate without isolation can kill), it
is started again once. Anything else that goes wrong there is the task's doing, not the candidate's:
a `ReferenceFailure`, which like any SandboxError is no verdict on the candidate.
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import threading
import uuid
from pathlib import Path
from typing import TypeVar

import torch
from pydantic import BaseModel

from ksearch_ray.evaluation.sandbox.channel import ChannelClosed, ChannelForgery, ChannelTimeout
from ksearch_ray.evaluation.sandbox.handle import Sandbox, SandboxError, WorkerHandle, declared_environment
from ksearch_ray.evaluation.sandbox.handover import HandoverError, Importer
from ksearch_ray.evaluation.sandbox.protocol import (
    Fail,
    Output,
    Progress,
    ProtocolError,
    Ready,
    ReferenceCmd,
    ReferenceJob,
    StopCmd,
    Taken,
    parse_report,
)
from ksearch_ray.taskspec.spec import Workload
from ksearch_ray.taskspec.task import Task
from ksearch_ray.text import clip

M = TypeVar("M", bound=BaseModel)


class ReferenceFailure(SandboxError):
    """The task's own code (reference or input generator), run sandboxed, gave no reference."""


class _WorkerGone(Exception):
    pass


class SandboxedReference:
    """A sandboxed worker computing the references of one untrusted task, on request (thread-safe)."""

    def __init__(self, sandbox: Sandbox, task: Task, work_root: Path, *, setup_s: float, idle_s: float,
                 device_handover: bool = True):
        self.sandbox, self.task = sandbox, task
        self.work_root = Path(work_root)
        self.setup_s, self.idle_s = setup_s, idle_s
        self.device_handover = device_handover
        self.importer = Importer(sandbox.device)
        self.starts = 0
        self._worker: WorkerHandle | None = None
        self._workdir: Path | None = None
        self._lock = threading.Lock()

    def ensure_started(self) -> None:
        with self._lock:
            if self._worker is None:
                self._start()

    def compute(self, workload: Workload, seed: int, options: frozenset[str]) -> dict[str, torch.Tensor]:
        """The reference outputs of `workload` on the inputs of `seed`, as tensors of this process."""
        with self._lock:
            for attempt in (1, 2):
                if self._worker is None:
                    self._start()
                try:
                    return self._request(ReferenceCmd(workload=workload, seed=seed, options=sorted(options)))
                except _WorkerGone as gone:
                    words = self._last_words()
                    self._stop()
                    if attempt == 2:
                        raise ReferenceFailure(f"the task's reference worker died twice ({gone}){words}") from None
            raise AssertionError("unreachable")

    def close(self) -> None:
        with self._lock:
            if self._worker is not None:
                with contextlib.suppress(OSError, ChannelClosed):
                    self._worker.chan.send(StopCmd())
            self._stop()
            self.importer.release()

    # --- internals ----------------------------------------------------------------------------

    def _start(self) -> None:
        tag = hashlib.sha256(str(self.task.root).encode()).hexdigest()[:12]
        self._workdir = self.work_root / "references" / f"{tag}-{uuid.uuid4().hex[:8]}"
        self._workdir.mkdir(parents=True)
        cache = self.work_root / "cache" / f"reference-{tag}" / "triton"
        cache.mkdir(parents=True, exist_ok=True)
        job = ReferenceJob(workdir=str(self._workdir), triton_cache_dir=str(cache), task_root=str(self.task.root),
                           device="cuda" if self.sandbox.device == "cuda" else "cpu",
                           device_handover=self.device_handover)
        self._worker = self.sandbox.start(job.model_dump(mode="json"),
                                          declared_environment(self.task.definition.environment, self.sandbox.refused))
        self.starts += 1
        try:
            self._receive(self.setup_s, "start-up", Ready)
        except _WorkerGone as gone:
            words = self._last_words()
            self._stop()
            raise ReferenceFailure(f"the task's reference worker did not start ({gone}){words}") from None
        except ReferenceFailure:
            self._stop()
            raise

    def _request(self, cmd: ReferenceCmd) -> dict[str, torch.Tensor]:
        assert self._worker is not None
        try:
            self._worker.chan.send(cmd)
        except (OSError, ChannelClosed) as exc:
            raise _WorkerGone(f"{type(exc).__name__}") from None
        out = self._receive(self.idle_s, f"the reference of {cmd.workload.name}", Output)
        try:
            fds = self._worker.chan.take_fds(out.handover.fds)
            outputs = self.importer.take(out.handover, fds)
        except (ChannelForgery, HandoverError) as exc:
            self._stop()
            raise ReferenceFailure(f"the task's reference worker handed over something else: {exc}") from None
        if out.handover.transport == "cuda_vmm":
            self._worker.chan.send(Taken())
        return outputs

    def _receive(self, limit: float, phase: str, expect: type[M]) -> M:
        assert self._worker is not None
        while True:
            try:
                msg = parse_report(self._worker.chan.recv(limit))
            except ChannelClosed:
                raise _WorkerGone("its channel closed") from None
            except ChannelTimeout:
                self._stop()
                raise ReferenceFailure(f"the task's reference gave no sign of progress for {limit:.0f} s during {phase}") from None
            except (ChannelForgery, ProtocolError) as exc:
                self._stop()
                raise ReferenceFailure(f"the task's reference worker sent a bad message during {phase}: {exc}") from None
            if isinstance(msg, Progress):
                continue
            if isinstance(msg, Fail):
                raise ReferenceFailure(msg.message + self._last_words())
            if isinstance(msg, expect):
                return msg
            self._stop()
            raise ReferenceFailure(f"the task's reference worker sent {msg.type!r} during {phase}")

    def _last_words(self) -> str:
        if self._workdir is None:
            return ""
        with contextlib.suppress(OSError):
            text = (self._workdir / "stderr.log").read_text(errors="replace").strip()
            if text:
                return f"; its last output: {clip(text.splitlines()[-1], 300)}"
        return ""

    def _stop(self) -> None:
        if self._worker is not None:
            self.sandbox.kill(self._worker)
            self.sandbox.reap(self._worker)
            self._worker = None
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None
