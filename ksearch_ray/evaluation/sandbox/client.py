"""The evaluator's handle on its sandbox: a zygote process and the workers it forks.

The zygote runs with a scrubbed environment (no API keys, tokens or cloud credentials) and,
on the CPU path, with no GPU visible and Triton's interpreter on. Each worker runs in its own
namespaces where the host allows (isolation.py); on hosts that do not, the sandbox says once,
on standard error, which protections are lost, and `Isolation.REQUIRE` refuses to start.
Workers are killed by process group. If anything kills the zygote, the next job starts a new
one: a dead sandbox costs one candidate, never the evaluator.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ksearch_ray.evaluation.sandbox import leftovers
from ksearch_ray.evaluation.sandbox.channel import Channel
from ksearch_ray.evaluation.sandbox.isolation import PROTECTIONS, Isolation

_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE|SESSION|PRIVATE|CERT", re.IGNORECASE)
_SECRET_PREFIXES = ("AWS_", "AZURE_", "GOOGLE_", "GCP_", "GCLOUD_", "HF_", "HUGGING", "OPENAI", "ANTHROPIC",
                    "LITELLM", "RAY_", "GITHUB_", "GH_", "KSEARCH_")


def scrubbed_environment(device: str, visible_gpu: str | None = None) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items()
        if not _SECRET_NAME.search(k) and not k.upper().startswith(_SECRET_PREFIXES)
    }
    package_parent = str(Path(__file__).resolve().parents[3])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH", "")) if p)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
        env["CUDA_VISIBLE_DEVICES"] = ""
    else:
        env.pop("TRITON_INTERPRET", None)
        if visible_gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible_gpu
    return env


def default_work_root() -> Path:
    """A fresh private folder for one sandbox, outside any run directory and the home:
    under $XDG_RUNTIME_DIR (per-user, on most desktops) or /tmp/ksearch-<uid>."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime) and os.access(runtime, os.W_OK):
        base = Path(runtime) / "ksearch"
    else:
        base = Path(tempfile.gettempdir()) / f"ksearch-{os.getuid()}"
    base.mkdir(mode=0o700, exist_ok=True)
    info = base.lstat()
    # /tmp is shared: a folder of that name made by someone else (or a link) must not be used.
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise SandboxError(f"{base} is not a private folder of this user; remove it or set XDG_RUNTIME_DIR")
    leftovers.sweep(base)  # folders of sandboxes whose process died (a driver killed with SIGKILL)
    folder = Path(tempfile.mkdtemp(prefix="sandbox-", dir=base))
    leftovers.claim(folder)
    return folder


class SandboxError(Exception):
    """The sandbox itself (not a candidate) failed: the zygote would not start."""


@dataclass
class WorkerHandle:
    pid: int
    chan: Channel
    clock: int  # read end of the stopwatch pipe (non-blocking)
    status: tuple[int, int] | None = None  # once reaped


@dataclass
class IsolationReport:
    """What this host gave the sandbox, as the zygote found it at start."""

    isolated: bool = False
    problem: str | None = None  # why the namespaces are not in use, if they are not
    clock_problem: str | None = None  # why the native stopwatch is not in use, if it is not

    def warnings(self, requested: Isolation) -> list[str]:
        out = []
        if requested is Isolation.OFF:
            out.append("sandbox isolation is OFF (--isolation off): candidates run with the user's full rights; lost: "
                       + "; ".join(PROTECTIONS))
        elif not self.isolated:
            out.append(f"sandbox isolation is unavailable on this host ({self.problem}); lost: " + "; ".join(PROTECTIONS)
                       + ". Use --isolation require to refuse to run without it.")
        if self.clock_problem:
            out.append(f"native stopwatch unavailable ({self.clock_problem}): timings pass through Python objects "
                       "in the candidate's process (the wall-clock, floor and re-timing checks still apply)")
        return out


def _pipe_for_records() -> tuple[int, int]:
    r, w = os.pipe()
    with contextlib.suppress(OSError):
        fcntl.fcntl(w, 1031, 1 << 20)  # F_SETPIPE_SZ: room for every record of a workload
    os.set_blocking(r, False)
    return r, w


class Sandbox:
    def __init__(self, device: str, work_root: Path, *, startup_timeout: float = 300.0,
                 isolation: Isolation = Isolation.BEST_EFFORT):
        self.device = device
        self.work_root = Path(work_root).resolve()  # the worker chdirs into job dirs below it from elsewhere
        self.work_root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.startup_timeout = startup_timeout
        self.isolation = isolation
        self.report = IsolationReport()
        self._warned: set[str] = set()
        self.visible_gpu = self._current_gpu() if device == "cuda" else None
        self._proc: subprocess.Popen[bytes] | None = None
        self._ctrl: socket.socket | None = None
        self.zygote_starts = 0

    @staticmethod
    def _current_gpu() -> str | None:
        # Ray pins an actor to its GPU through CUDA_VISIBLE_DEVICES; keep that pinning.
        return os.environ.get("CUDA_VISIBLE_DEVICES")

    # --- zygote lifecycle -----------------------------------------------------------------

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def healthy(self) -> bool:
        """Alive and answering: a zygote killed a moment ago may not have been reaped yet."""
        if not self.alive():
            return False
        try:
            return bool(self._request({"cmd": "ping"}).get("pong"))
        except (OSError, ConnectionError, ValueError):
            self.close()
            return False

    def _start_zygote(self) -> None:
        self.close()
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        log = open(self.work_root / "zygote.log", "ab")  # noqa: SIM115  (owned by the child process)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "ksearch_ray.evaluation.sandbox.zygote", str(child.fileno()), self.device,
                 self.isolation.value],
                pass_fds=[child.fileno()],
                env=scrubbed_environment(self.device, self.visible_gpu),
                cwd=self.work_root,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        finally:
            child.close()
            log.close()
        self._ctrl = parent
        parent.settimeout(self.startup_timeout)
        try:
            hello = json.loads(parent.recv(65536) or b"{}")
        except (TimeoutError, ValueError):
            hello = {}
        if not hello.get("ready"):
            tail = (self.work_root / "zygote.log").read_text(errors="replace")[-2000:]
            self.close()
            raise SandboxError(f"sandbox zygote failed to start: {tail.strip().splitlines()[-1] if tail.strip() else 'no output'}")
        self.zygote_starts += 1
        self.report = IsolationReport(bool(hello.get("isolated")), hello.get("isolation_problem"), hello.get("clock_problem"))
        if self.isolation is Isolation.REQUIRE and not self.report.isolated:
            self.close()
            raise SandboxError(f"isolation required (--isolation require) but unavailable on this host: {self.report.problem}")
        for line in self.report.warnings(self.isolation):
            if line not in self._warned:  # loud, once per evaluator
                self._warned.add(line)
                print(f"WARNING: {line}", file=sys.stderr, flush=True)

    def ensure_started(self) -> IsolationReport:
        """Start the zygote now (it probes the host's isolation): warnings and refusals come at start."""
        if not self.alive():
            self._start_zygote()
        return self.report

    def _request(self, message: dict[str, Any], fds: list[int] | None = None) -> dict[str, Any]:
        assert self._ctrl is not None
        self._ctrl.settimeout(10.0)
        if fds:
            socket.send_fds(self._ctrl, [json.dumps(message).encode()], fds)
        else:
            self._ctrl.send(json.dumps(message).encode())
        data = self._ctrl.recv(65536)
        if not data:
            raise ConnectionError("zygote closed its control socket")
        return json.loads(data)

    # --- workers ----------------------------------------------------------------------------

    def start(self, job: dict[str, Any]) -> WorkerHandle:
        for attempt in (1, 2):
            if not self.alive():
                self._start_zygote()
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            records, records_w = _pipe_for_records()
            try:
                reply = self._request({"cmd": "run"}, [theirs.fileno(), records_w])
            except (OSError, ConnectionError, ValueError):
                ours.close()
                os.close(records)
                if attempt == 2:
                    raise
                self.close()  # a zygote that cannot answer is replaced, once
                continue
            finally:
                theirs.close()
                os.close(records_w)
            key = os.urandom(32)
            ours.sendall(key)
            chan = Channel(ours, key)
            chan.send(job)
            return WorkerHandle(reply["pid"], chan, records)
        raise SandboxError("unreachable")

    def kill(self, worker: WorkerHandle) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(worker.pid, signal.SIGKILL)

    def reap(self, worker: WorkerHandle) -> tuple[int, int]:
        """(exit code, signal number) of a finished worker; (-1, 0) if the zygote is gone."""
        if worker.status is not None:  # reap may come twice (a crash, then the evaluator's cleanup)
            return worker.status
        worker.chan.close()
        os.close(worker.clock)
        worker.status = (-1, 0)
        if not self.alive():
            return worker.status
        try:
            reply = self._request({"cmd": "wait", "pid": worker.pid})
        except (OSError, ConnectionError, ValueError):
            self.close()
            return worker.status
        worker.status = (int(reply["code"]), int(reply["signal"]))
        return worker.status

    def close(self) -> None:
        if self._ctrl is not None:
            with contextlib.suppress(OSError):
                self._ctrl.close()
            self._ctrl = None
        if self._proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=10)
            self._proc = None
