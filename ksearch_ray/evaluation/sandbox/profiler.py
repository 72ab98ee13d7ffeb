"""A candidate under Nsight Compute, inside its sandbox: the worker's side of a profile job.

The worker (process C of sandbox/zygote.py: its own namespaces, no capabilities, no_new_privs,
the candidate's filesystem view) runs `serve_profile`: it starts `ncu` as the wrapper of a fresh
Python (`python -m ksearch_ray.evaluation.sandbox.profiler JOB`), waits for it and reports ncu's
exit code. So ncu and the candidate's process have exactly the rights a candidate has in an
evaluation, and whatever they write stays in the job directory. The fresh Python (`main`) builds
the candidate, generates one workload's inputs from its seed, calls the candidate `warmup_calls`
times (compiles, autotuning, caches), then once between cudaProfilerStart and cudaProfilerStop:
that call is what ncu profiles (`--profile-from-start off`). It checks nothing and judges nothing:
a profile is evidence for the planner, never a score, and the evaluator reads ncu's log as
untrusted text (evaluation/ncu.py).

With `wait_for_turn` (evaluation.overlap), the fresh Python, once up (CUDA context, torch, the task),
leaves a mark in the job directory and waits on a FIFO there; the worker tells the evaluator (`Waiting`),
and passes the evaluator's Go on through the FIFO: the candidate is imported, warmed up and profiled only in
its turn on the device, while ncu's and Python's start-up overlap another candidate's evaluation.

The target's exit codes (the evaluator turns them into its own words): 0 profiled, 10 the build
failed, 11 a call raised, 12 the inputs could not be made, 13 it was not given its turn.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ksearch_ray.evaluation.sandbox.channel import Channel
from ksearch_ray.evaluation.sandbox.protocol import Go, Profiled, ProfileJob, Ready, Waiting, parse_command

BUILD_FAILED, CALL_FAILED, INPUTS_FAILED, TURN_FAILED = 10, 11, 12, 13
JOB_FILE = "profile_job.json"
TURN_FIFO, WAITING_MARK = "turn.fifo", "waiting.mark"


def serve_profile(chan: Channel, data: dict[str, Any]) -> int:
    """In the worker: ncu around a fresh Python that calls the candidate; then `Profiled`."""
    job = ProfileJob.model_validate(data)
    workdir = Path(job.workdir)
    spec = workdir / JOB_FILE
    spec.write_text(job.model_dump_json())  # before any candidate code runs; the target reads it first thing
    command = [job.ncu, *job.ncu_args, "--log-file", str(workdir / job.log_name),
               sys.executable, "-m", "ksearch_ray.evaluation.sandbox.profiler", str(spec)]
    if job.wait_for_turn:
        os.mkfifo(workdir / TURN_FIFO, 0o600)
    chan.send(Ready(setup_s=0.0))
    with open(workdir / "profiler.out", "wb") as out:
        # close_fds (the default): neither ncu nor the candidate inherits the job channel or the stopwatch pipe.
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=workdir)
        if job.wait_for_turn:
            _pass_turn(chan, proc, workdir)
        code = proc.wait()
    chan.send(Profiled(code=code))
    return 0


def _pass_turn(chan: Channel, proc: subprocess.Popen[bytes], workdir: Path) -> None:
    """Once the profiled process waits (its mark), say so to the evaluator, and pass its Go on through the
    FIFO. A process that ends first has nothing to wait for (it failed before the candidate's import)."""
    while not (workdir / WAITING_MARK).exists():
        if proc.poll() is not None:
            return
        time.sleep(0.01)
    chan.send(Waiting())
    command = parse_command(chan.recv())
    if not isinstance(command, Go):
        raise RuntimeError(f"the evaluator answered Waiting with {command.type!r}")
    while proc.poll() is None:
        try:  # there is a reader once the process has opened its end (open would block without one)
            fd = os.open(workdir / TURN_FIFO, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno != errno.ENXIO:
                raise
            time.sleep(0.01)
            continue
        try:
            os.write(fd, b"g")
        finally:
            os.close(fd)
        return


def _wait_for_turn(workdir: Path) -> bool:
    """In the profiled process, before the candidate's import: the mark, then the evaluator's Go."""
    (workdir / WAITING_MARK).write_text("")
    with open(workdir / TURN_FIFO, "rb") as turn:  # blocks until the worker opens the FIFO to write
        return turn.read(1) == b"g"


def main(spec: str) -> int:
    """The profiled process: build, inputs, warm-up, one profiled call."""
    import torch

    from ksearch_ray.evaluation.sandbox import integrity
    from ksearch_ray.evaluation.sandbox.build import load_entry
    from ksearch_ray.taskspec.task import Task

    job = ProfileJob.model_validate_json(Path(spec).read_text())
    task = Task.load(job.task_root)
    task.module  # noqa: B018  (the trusted reference module, before any candidate code)
    cuda = job.device == "cuda"
    if cuda:
        torch.cuda.init()
        torch.empty(1, device="cuda")
    if job.wait_for_turn and not _wait_for_turn(Path(job.workdir)):
        print("no turn on the device was given", file=sys.stderr)
        return TURN_FAILED
    try:
        entry = load_entry(Path(job.workdir) / "src", job.language, job.entry_file, job.entry_point,
                           f"ks_{job.solution_id}")
        prepare = getattr(sys.modules.get(f"ks_{job.solution_id}"), job.prepare, None) if job.prepare else None
    except BaseException as exc:  # noqa: BLE001  (the candidate's import: any failure is the build's)
        print(f"build failed: {type(exc).__name__}", file=sys.stderr)
        return BUILD_FAILED
    options = frozenset(job.options)
    try:
        with integrity.harness_numerics():
            inputs = task.generate_inputs(job.item.workload, job.item.seed, job.device, options)
    except Exception as exc:  # trusted code, but it runs after the candidate was imported
        print(f"inputs failed: {type(exc).__name__}", file=sys.stderr)
        return INPUTS_FAILED
    try:
        if prepare is not None:
            task.call(prepare, inputs)
        for _ in range(job.warmup_calls):
            task.call(entry, inputs)
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.profiler.start()
        task.call(entry, inputs)
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
    except BaseException as exc:  # noqa: BLE001  (the candidate's call)
        print(f"call failed: {type(exc).__name__}", file=sys.stderr)
        return CALL_FAILED
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    # A normal exit (not os._exit): ncu's library in this process finishes its work as the process ends.
    raise SystemExit(main(sys.argv[1]))
