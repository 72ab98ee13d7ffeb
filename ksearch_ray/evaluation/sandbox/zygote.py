"""The zygote: a pre-imported Python that forks one fresh worker per candidate.

Started by `Sandbox` with `python -m ksearch_ray.evaluation.sandbox.zygote FD DEVICE ISOLATION`
and a scrubbed environment. It imports torch and Triton once (seconds) but never touches CUDA,
so each fork (milliseconds) is safe and gets a process no earlier candidate ran in.

Per candidate (see isolation.py): A, forked here, starts its own session, dies with the zygote
and, when isolation is on, creates the namespaces (this process writes A's uid/gid maps: only a
process outside the new user namespace may map the host's `nobody`); A forks B, PID 1 of the new
PID namespace, which builds the candidate's root and reaps; B forks C, which drops privileges and
runs the harness (worker.serve). Before A goes on, this process moves it into a pids cgroup of its
own where the host has one (pids.py): the process limit holds even where C stays the host's root.
Without isolation A is a subreaper that forks C directly and kills whatever C left behind. The evaluator kills A's process group; B dies with A, and every
process in the namespace dies with B.

Control messages (one JSON object per SOCK_SEQPACKET datagram, trusted side only):
  evaluator -> {"cmd": "run", "processes": P} + job socket and clock pipe fds  ;  zygote -> {"pid": N}
  evaluator -> {"cmd": "wait", "pid": N}                          ;  zygote -> {"pid": N, "code": C, "signal": S}
  evaluator -> {"cmd": "ping"}                                    ;  zygote -> {"pong": true}
The first message, unasked: {"ready": true, "pid": N, "isolated": bool, "isolation_problem": str|null,
"clock_problem": str|null, "root_candidates": bool, "pids_cgroup": str|null, "pids_problem": str|null}.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import select
import signal
import socket
import struct
import sys
import tempfile
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ksearch_ray.evaluation.sandbox import isolation as iso
from ksearch_ray.evaluation.sandbox import leftovers, resources
from ksearch_ray.evaluation.sandbox.pids import PidsCgroups

SETUP_FAILED = 97  # B's exit code when the namespace could not be set up (a sandbox fault)


def _reply(ctrl: socket.socket, message: dict[str, Any]) -> None:
    ctrl.send(json.dumps(message).encode())


def _exit_like(status: int) -> None:
    """End this process the way a child with wait status `status` ended (signal included)."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


@dataclass
class Prepared:
    """What A learned from the job: what C runs, and what C's filesystem view holds."""

    body: Callable[[], int]
    read_only: list[str] = field(default_factory=list)
    read_write: list[str] = field(default_factory=list)
    logs: str | None = None  # C's stdout.log and stderr.log go here, through the watching parent; none: inherited
    limits: resources.Resources = field(default_factory=resources.Resources)


class Jail:
    """How this zygote starts a candidate's process tree."""

    def __init__(self, device: str, isolated: bool, pids: PidsCgroups | None = None):
        self.device = device
        self.isolated = isolated
        self.pids = pids  # a cgroup per worker, where the host has one
        self.plan = iso.build_plan(device) if isolated else iso.MountPlan()

    def root_candidates(self) -> bool:
        """Whether this jail's candidates run as the host's root, whom RLIMIT_NPROC does not bind:
        a host-root zygote without namespaces, or one whose GPU nodes are not open to `nobody`.
        (A job whose own files only their owner may read stays root too: isolation.candidate_uid.)"""
        return resources.host_root() and (not self.isolated or self.plan.sandbox_uid is None)

    def spawn(self, prepare: Callable[[], Prepared], processes: int = 0) -> int:
        """Fork A; returns its pid once A is inside its namespaces (if any) and its pids cgroup (if
        any), capped at `processes` of the candidate's (0: none). A calls `prepare`."""
        sync_r, sync_w = os.pipe()
        go_r, go_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.close(sync_r)
                os.close(go_w)
                code = self._process_a(prepare, sync_w, go_r)
            except BaseException:  # noqa: BLE001  (A's last words belong in the zygote log)
                traceback.print_exc()
                sys.stderr.flush()
            finally:
                os._exit(code)
        os.close(sync_w)
        os.close(go_r)
        try:
            ok = b"g"
            if self.isolated and os.read(sync_r, 1) == b"u":
                try:
                    iso.write_id_maps(pid, self.plan)
                except OSError as exc:
                    print(f"uid/gid maps for {pid}: {exc}", file=sys.stderr, flush=True)
                    ok = b"x"
            elif self.isolated:
                ok = b"x"  # A died before its namespaces
            if ok == b"g" and self.pids is not None:
                # A and B are the sandbox's own (trusted, one thread each): the limit is the candidate's.
                trusted = 2 if self.isolated else 1
                try:
                    self.pids.enter(pid, processes + trusted if processes else 0)
                except OSError as exc:
                    print(f"pids cgroup for {pid}: {exc}", file=sys.stderr, flush=True)
                    ok = b"x"
            with contextlib.suppress(BrokenPipeError):
                os.write(go_w, ok)
        finally:
            os.close(sync_r)
            os.close(go_w)
        return pid

    def _process_a(self, prepare: Callable[[], Prepared], sync_w: int, go_r: int) -> int:
        os.setsid()
        iso.die_with_parent()
        if self.isolated:
            iso.unshare_namespaces()
            os.write(sync_w, b"u")
        if os.read(go_r, 1) != b"g":  # the zygote has written the id maps and moved A into its cgroup
            return SETUP_FAILED
        os.close(sync_w)
        os.close(go_r)
        job = prepare()
        if not self.isolated:
            iso.become_subreaper()
            status = self._fork_c(job, stop=_stop_descendants)
            iso.kill_descendants(os.getpid())
            _exit_like(status)
        ro, rw = self.plan.with_job(job.read_only, job.read_write)
        uid = iso.candidate_uid(self.plan, job.read_only)
        report_r, report_w = os.pipe()
        alive_r, alive_w = os.pipe()  # B sees EOF here once A is gone
        b = os.fork()
        if b == 0:
            code = SETUP_FAILED
            try:
                os.close(report_r)
                os.close(alive_w)
                code = self._process_b(job, ro, rw, uid, report_w, alive_r)
            except BaseException:  # noqa: BLE001
                traceback.print_exc()
                sys.stderr.flush()
            finally:
                os._exit(code)
        os.close(report_w)
        _, b_status = os.waitpid(b, 0)
        reported = os.read(report_r, 4)
        if len(reported) == 4:
            _exit_like(struct.unpack("i", reported)[0])
        _exit_like(b_status)
        return 1

    def _process_b(self, job: Prepared, ro: list[str], rw: list[str], uid: int | None, report_w: int,
                   alive_r: int) -> int:
        iso.die_with_parent()
        if select.select([alive_r], [], [], 0)[0]:
            return 1  # A died before the death signal was armed
        iso.build_root(self.plan, ro, rw, tmpfs_mb=job.limits.disk_mb)
        if uid is not None:
            iso.chown_tree(rw, uid)
        status = self._fork_c(job, stop=resources.stop_namespace, drop=True, uid=uid)
        os.write(report_w, struct.pack("i", status))
        return 0  # as PID 1, B's exit takes every process left in the namespace with it

    def _fork_c(self, job: Prepared, stop: Callable[[int], None], drop: bool = False, uid: int | None = None) -> int:
        """Fork C, which runs `job.body` within the job's limits; watch it (output, disk) and reap
        everything until it ends. Returns C's wait status (or the limit's, when it was stopped)."""
        pipes = [os.pipe(), os.pipe()] if job.logs else []
        # The log files are opened here, before C exists (C cannot put a link in their place first),
        # and C never holds them (it could write past the cap through them).
        logs = {r: open(os.path.join(job.logs, name), "wb", buffering=0)  # noqa: SIM115  (closed by watch)
                for (r, _w), name in zip(pipes, ("stdout.log", "stderr.log"), strict=True)} if job.logs else {}
        c = os.fork()
        if c == 0:
            code = 1
            try:
                for log in logs.values():
                    log.close()
                for target, (r, w) in zip((1, 2), pipes, strict=False):
                    os.close(r)
                    os.dup2(w, target)
                    os.close(w)
                if drop:
                    iso.drop_privileges(uid)
                resources.apply_limits(job.limits, own_namespace=self.isolated)
                code = job.body()
            except BaseException:  # noqa: BLE001
                traceback.print_exc()
                sys.stderr.flush()
            finally:
                os._exit(code)
        for _r, w in pipes:
            os.close(w)
        return resources.watch(c, logs, job.limits, job.read_write, stop)

    def probe(self) -> str | None:
        """Run a trivial body through the whole jail once; None if it works, else what failed."""
        with tempfile.TemporaryDirectory(prefix="probe-", dir=os.getcwd()) as tmp:
            out = os.path.join(tmp, "out")
            os.makedirs(out)
            if self.plan.sandbox_uid is not None:
                os.chown(out, self.plan.sandbox_uid, self.plan.sandbox_uid)
            pid = self.spawn(lambda: Prepared(lambda: _probe_body(self.device, out), [], [out]))
            _, status = os.waitpid(pid, 0)
            if self.pids is not None:
                self.pids.leave(pid)
            try:
                with open(os.path.join(out, "result")) as f:
                    text = f.read()
            except OSError:
                text = ""
            if text == "ok" and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
                return None
            return text or f"the sandbox set-up failed (wait status {status}; details in zygote.log)"


def _stop_descendants(child: int) -> None:
    """Without a PID namespace (A is a subreaper): kill C and whatever C started."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(child, signal.SIGKILL)
    iso.kill_descendants(os.getpid())


def _probe_body(device: str, out: str) -> int:
    problems = []
    if len([p for p in os.listdir("/proc") if p.isdigit()]) > 3:
        problems.append("the host's processes are visible")
    if device == "cuda":
        try:
            os.close(os.open("/dev/nvidiactl", os.O_RDWR))
        except OSError as exc:
            problems.append(f"cannot open /dev/nvidiactl inside the sandbox ({exc.strerror})")
    with open(os.path.join(out, "result"), "w") as f:
        f.write("; ".join(problems) or "ok")
    return 0


def _prepare_job(ctrl: socket.socket, job_fd: int, clock_fd: int) -> Prepared:
    """In A: take the job off the socket."""
    from ksearch_ray.evaluation.sandbox.channel import Channel

    ctrl.close()  # the candidate must not be able to talk to the zygote
    sock = socket.socket(fileno=job_fd)
    key = b""
    while len(key) < 32:
        chunk = sock.recv(32 - len(key))
        if not chunk:
            raise ConnectionError("evaluator closed the job socket")
        key += chunk
    chan = Channel(sock, key)
    job = chan.recv()

    def body() -> int:
        from ksearch_ray.evaluation.sandbox.worker import serve

        return serve(chan, job, clock_fd)

    # A build job (ksearch_ray.evaluation.builder) has sources in its work directory and no task files.
    limits = resources.Resources.of(job.pop("resources", None))
    os.environ.update(job.pop("environment", None) or {})  # what the task declares (Sandbox.start checked it)
    readable = [job["task_root"]] if job.get("task_root") else []
    if job.get("type") == "profile":  # the profiler's own install tree, read-only (where no system directory has it)
        readable.append(os.path.dirname(os.path.realpath(job["ncu"])))
    return Prepared(body, readable, [job["workdir"], job["triton_cache_dir"]], logs=job["workdir"], limits=limits)


def warm_triton() -> None:
    """What every worker that compiles or loads a Triton kernel would otherwise work out itself, once: Triton's
    own key (a hash of its installed sources and library: 0.2-0.3 s on a 2-core CPU, before a worker's first kernel,
    even one its cache holds) and its compiler's modules. Nothing here touches CUDA."""
    import importlib

    try:
        for where in ("triton.runtime.cache", "triton.compiler.compiler"):  # newer releases, then older ones
            key = getattr(importlib.import_module(where), "triton_key", None)
            if key is not None:
                key()
                return
        raise LookupError("no triton_key in this Triton")
    except Exception as exc:  # noqa: BLE001  (a Triton without these: its workers work it out themselves)
        print(f"zygote: Triton's key was not computed ahead ({type(exc).__name__}: {exc})", file=sys.stderr, flush=True)


def main(ctrl_fd: int, device: str, mode: iso.Isolation) -> None:
    from pathlib import Path

    import torch  # noqa: F401  (the whole point: pay for these imports once)
    import triton  # noqa: F401

    import ksearch_ray.evaluation.sandbox.worker  # noqa: F401  (captures the harness's private references pre-candidate)
    import ksearch_ray.taskspec.task  # noqa: F401
    from ksearch_ray.evaluation.sandbox import clock

    if device == "cuda" or not os.environ.get("TRITON_INTERPRET"):
        warm_triton()
    ctrl = socket.socket(fileno=ctrl_fd)
    iso.become_subreaper()  # whatever a worker leaves behind comes back here, to be killed
    clock.load(Path.cwd() / "native")  # before the plan: the stopwatch's folder stays out of the candidate's view
    pids, pids_problem = PidsCgroups.open()
    if pids is not None:
        leftovers.sweep_cgroups(pids.parent)  # of zygotes killed with SIGKILL
    problem = None
    jail = Jail(device, isolated=False, pids=pids)
    if mode is not iso.Isolation.OFF:
        try:
            jail = Jail(device, isolated=True, pids=pids)
            problem = jail.probe()
        except (OSError, iso.IsolationError) as exc:
            problem = str(exc)
        if problem is not None:
            jail = Jail(device, isolated=False, pids=pids)
    # Everything imported so far (torch, Triton, pydantic, this package) out of the collector's reach: a
    # worker's collections then walk the candidate's objects only, as in a process that imported less, and
    # never write to the pages it shares with this process (a full collection after a fork copied each of
    # them, inside whichever timed call it fell in). Python's documentation advises freezing before a fork.
    gc.collect()
    gc.freeze()
    _reply(ctrl, {"ready": True, "pid": os.getpid(), "isolated": jail.isolated, "isolation_problem": problem,
                  "clock_problem": clock.problem, "root_candidates": jail.root_candidates(),
                  "pids_cgroup": str(pids.home) if pids is not None else None, "pids_problem": pids_problem})
    live: set[int] = set()  # workers started and not yet waited for (a reference worker outlives candidates)
    while True:
        data, fds, _, _ = socket.recv_fds(ctrl, 65536, 4)
        if not data:
            return  # the evaluator is gone
        msg = json.loads(data)
        if msg["cmd"] == "run":
            job_fd, clock_fd = fds[0], fds[1]
            pid = jail.spawn(lambda: _prepare_job(ctrl, job_fd, clock_fd),  # noqa: B023  (runs before the loop goes on)
                             processes=int(msg.get("processes", 0)))
            os.close(job_fd)
            os.close(clock_fd)
            live.add(pid)
            _reply(ctrl, {"pid": pid})
        elif msg["cmd"] == "wait":
            try:
                _, status = os.waitpid(msg["pid"], 0)
            except ChildProcessError:
                status = 255 << 8
            live.discard(msg["pid"])
            iso.kill_descendants(os.getpid(), spare=live)  # orphans of a worker killed before its own clean-up
            if pids is not None and not pids.leave(msg["pid"]):
                print(f"the pids cgroup of worker {msg['pid']} could not be removed", file=sys.stderr, flush=True)
            sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0
            code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -1
            _reply(ctrl, {"pid": msg["pid"], "code": code, "signal": sig})
        elif msg["cmd"] == "ping":
            _reply(ctrl, {"pong": True})
        elif msg["cmd"] == "exit":
            return


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], iso.Isolation(sys.argv[3]))
