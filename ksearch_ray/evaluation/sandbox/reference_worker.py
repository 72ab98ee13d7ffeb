"""A sandboxed worker that computes the references of a task from outside the package.

A bundle that did not ship with the package (a --task-dir, KSEARCH_TASK_PATH, a converted
FlashInfer-Bench --dataset) brings code: its input generator and its reference. That code runs
here, in a worker of the same sandbox as a candidate (its own namespaces, scrubbed environment,
job directory), never in the evaluator. The worker serves one task for as long as the evaluator
keeps it: per request it generates the inputs of a seed, computes the reference with TF32 off, and
hands the outputs over exactly as a candidate's are (sandbox/handover.py); the evaluator's judge
only compares. No candidate code ever runs in this process, and no candidate can reach it: each
worker has its own namespaces, and a candidate's worker is a different process tree.
"""

from __future__ import annotations

import os
import traceback
from typing import Any

import torch

from ksearch_ray.evaluation.judge import reference_precision
from ksearch_ray.evaluation.sandbox.channel import Channel, ChannelClosed, ChannelForgery
from ksearch_ray.evaluation.sandbox.handover import Exporter, HandoverError
from ksearch_ray.evaluation.sandbox.integrity import perf_counter
from ksearch_ray.evaluation.sandbox.protocol import (
    Fail,
    Output,
    ProtocolError,
    Ready,
    ReferenceCmd,
    ReferenceJob,
    StopCmd,
    Taken,
    parse_command,
)
from ksearch_ray.models import Status
from ksearch_ray.taskspec.task import Task
from ksearch_ray.text import clip


def _fail(chan: Channel, what: str, exc: BaseException, workload: str | None = None) -> None:
    chan.send(Fail(status=Status.RUNTIME_ERROR, message=f"{what}: {type(exc).__name__}: {clip(str(exc), 300)}",
                   log=traceback.format_exc()[-2000:], workload=workload))


def _tensors(outputs: dict[str, Any]) -> dict[str, torch.Tensor]:
    for name, value in outputs.items():
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"the reference's output `{name}` is a {type(value).__name__}, not a tensor")
    return {name: value.detach() for name, value in outputs.items()}


def serve_reference(chan: Channel, raw: dict[str, Any]) -> int:
    """Serve reference requests until told to stop (or the evaluator goes); returns the exit code."""
    t0 = perf_counter()
    job = ReferenceJob.model_validate(raw)
    cuda = job.device == "cuda"
    if cuda:
        torch.cuda.init()
        torch.empty(1, device="cuda")
    exporter = Exporter(job.device, device_handover=job.device_handover)
    try:
        task = Task.load(job.task_root)
        task.module  # noqa: B018  (the task's reference.py: its import-time code runs here, sandboxed)
    except Exception as exc:  # the task's own code: whatever it raises is reported, not raised
        _fail(chan, "the task's reference.py could not be loaded", exc)
        return 0
    chan.send(Ready(setup_s=perf_counter() - t0))
    while True:
        try:
            cmd = parse_command(chan.recv())
        except (ProtocolError, ChannelClosed, ChannelForgery):  # the evaluator is gone, or this is not it
            return 0
        if isinstance(cmd, StopCmd):
            return 0
        if not isinstance(cmd, ReferenceCmd):
            chan.send(Fail(status=Status.INTEGRITY_VIOLATION, message=f"unexpected command {cmd.type!r}"))
            return 0
        name = cmd.workload.name
        try:
            with torch.no_grad():
                inputs = task.generate_inputs(cmd.workload, cmd.seed, job.device, frozenset(cmd.options))
                with reference_precision():
                    outputs = _tensors(task.reference(inputs))
                del inputs
                if cuda:
                    torch.cuda.synchronize()
                handover, fds = exporter.export(outputs)
        except (Exception, HandoverError) as exc:  # the task's own code: a failure is this request's answer
            _fail(chan, f"the task's reference failed on workload {name}", exc, workload=name)
            continue
        try:
            chan.send(Output(index=0, handover=handover), fds)
        finally:
            for fd in fds:
                os.close(fd)
        # Device memory this process can still write: the evaluator copies it before anything else happens.
        if handover.transport == "cuda_vmm" and not isinstance(parse_command(chan.recv()), Taken):
            return 0
