"""The evaluator's handle on its sandbox: a zygote process and the workers it forks.

The zygote runs with an allow-listed environment (what a kernel needs: PATH, locale, CUDA, Triton;
never API keys, tokens, credentials or URLs with passwords) and,
on the CPU path, with no GPU visible and Triton's interpreter on. Each worker runs in its own
namespaces where the host allows (isolation.py); on hosts that do not, the sandbox says once,
on standard error, which protections are lost, and `Isolation.REQUIRE` refuses to start. The same
goes for the process limit where the host cannot enforce it (a host-root zygote, whose candidates
RLIMIT_NPROC may not bind, without a pids cgroup: sandbox/pids.py).
Workers are killed by process group. If anything kills the zygote, the next job starts a new
one: a dead sandbox costs one candidate, never the evaluator.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ksearch_ray.evaluation.sandbox import leftovers
from ksearch_ray.evaluation.sandbox.channel import Channel
from ksearch_ray.evaluation.sandbox.isolation import PROTECTIONS, Isolation
from ksearch_ray.evaluation.sandbox.resources import Resources, read_tail
from ksearch_ray.private_dir import PrivateDirError, check_private, private_dir
from ksearch_ray.text import SECRET_NAME, URL_USERINFO

# What a kernel needs from the environment, by name: the rest of the evaluator's environment (API keys,
# cloud credentials, database and index URLs, proxies, Ray's own variables) never reaches a candidate.
_ALLOWED_NAMES = frozenset({
    "PATH", "LANG", "LANGUAGE", "TZ", "TERM", "USER", "LOGNAME", "SHELL", "TMPDIR",
    "LD_LIBRARY_PATH", "LIBRARY_PATH", "CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH", "PKG_CONFIG_PATH",
    "CC", "CXX", "CFLAGS", "CXXFLAGS", "LDFLAGS", "MAX_JOBS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS", "PYTHONHASHSEED", "PYTHONPATH", "FLASHINFER_WORKSPACE_BASE",
})
_ALLOWED_PREFIXES = ("LC_", "CUDA_", "CUDNN_", "NVIDIA_", "NCCL_", "NVCC_", "CUTLASS_", "TRITON_", "TORCH_CUDA_",
                     "TORCHINDUCTOR_", "FLASHINFER_JIT_", "PYTORCH_")
# Even an allowed name is dropped when it looks like a credential (the redactor's own rule, broader).
_SECRET_NAME = re.compile(rf"{SECRET_NAME.pattern}|AUTH|COOKIE|SESSION|CERT", re.IGNORECASE)


def allowed_variable(name: str, value: str, declared: frozenset[str] = frozenset(),
                     refused: frozenset[str] = frozenset()) -> bool:
    """Whether the candidate may see `name`: a name a kernel needs (or the task declares), never one
    the run refuses (its API key variable), one that looks like a credential, or a URL with userinfo."""
    if name in refused or _SECRET_NAME.search(name) or URL_USERINFO.match(value):
        return False
    return name in _ALLOWED_NAMES or name.startswith(_ALLOWED_PREFIXES) or name in declared


def scrubbed_environment(device: str, visible_gpu: str | None = None, *, declared: frozenset[str] = frozenset(),
                         refused: frozenset[str] = frozenset()) -> dict[str, str]:
    """The candidate's environment: an allow-list of the evaluator's (see `allowed_variable`)."""
    env = {k: v for k, v in os.environ.items() if allowed_variable(k, v, declared, refused)}
    package_parent = str(Path(__file__).resolve().parents[3])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH", "")) if p)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
        env["CUDA_VISIBLE_DEVICES"] = ""
        # One thread for PyTorch's CPU ops unless the user says otherwise: on a loaded 2-core machine a
        # two-thread op waits for its slower thread, and TriMul's baseline measured 270-650 ms (noise ±137 %
        # and ±279 % from ten) against 20-118 ms with one thread (±92 % and ±87 %), alternating, minutes apart.
        env.setdefault("OMP_NUM_THREADS", "1")
    else:
        env.pop("TRITON_INTERPRET", None)
        if visible_gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible_gpu
    return env


def declared_environment(names: list[str], refused: frozenset[str] = frozenset()) -> dict[str, str]:
    """The values of the variables a task declares, where set and allowed (never a credential)."""
    return {n: os.environ[n] for n in names if n in os.environ and allowed_variable(n, os.environ[n], frozenset(names), refused)}


def default_work_root() -> Path:
    """A fresh private folder for one sandbox, outside any run directory and the home:
    under $XDG_RUNTIME_DIR (per-user, on most desktops) or /tmp/ksearch-<uid>."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime) and os.access(runtime, os.W_OK):
        base = Path(runtime) / "ksearch"
    else:
        base = Path(tempfile.gettempdir()) / f"ksearch-{os.getuid()}"
    # /tmp is shared: a folder of that name made by someone else (or a link) must not be used.
    try:
        private_dir(base)
    except PrivateDirError as exc:
        raise SandboxError(f"sandbox root refused: {exc} (or set XDG_RUNTIME_DIR)") from None
    leftovers.sweep(base)  # folders of sandboxes whose process died (a driver killed with SIGKILL)
    folder = Path(tempfile.mkdtemp(prefix="sandbox-", dir=base))
    leftovers.claim(folder)
    return folder


GPUMODE_TASK_MODULE = '''"""The names GPUMode submissions import (`from task import input_t, output_t`): types only."""
from typing import Any

import torch

input_t = tuple[Any, ...]
output_t = torch.Tensor
'''


def job_dir(work_root: Path, solution_id: str, sources: dict[str, str], *, gpumode: bool = False) -> Path:
    """A fresh job directory under `work_root` with the solution's files in its `src/`; ValueError for a file
    name that is not a plain one (a path, a hidden file). `gpumode`: the task's interface is GPUMode's, whose
    submissions import their type names from the harness's `task` module: one is written beside them."""
    workdir = Path(work_root) / "jobs" / f"{solution_id}-{os.urandom(4).hex()}"
    src = workdir / "src"
    src.mkdir(parents=True)
    for name, text in sources.items():
        if "/" in name or name.startswith("."):
            raise ValueError(f"solution file name {name!r} is not a plain file name")
        (src / name).write_text(text)
    if gpumode and "task.py" not in sources:
        (src / "task.py").write_text(GPUMODE_TASK_MODULE)
    return workdir


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
    processes_problem: str | None = None  # why the process limit does not hold, if it does not

    @classmethod
    def of(cls, hello: dict[str, Any], processes: int) -> IsolationReport:
        """From the zygote's first message, for a sandbox whose candidates may have `processes`."""
        lost = None
        if processes and hello.get("root_candidates") and not hello.get("pids_cgroup"):
            lost = (f"candidates may run as the host's root, whom the kernel exempts from RLIMIT_NPROC, and no pids "
                    f"cgroup can be made ({hello.get('pids_problem')}): the limit of {processes} processes "
                    "(evaluation.limits.processes) does not hold, and a fork bomb can exhaust the host's processes")
        return cls(bool(hello.get("isolated")), hello.get("isolation_problem"), hello.get("clock_problem"), lost)

    def refusal(self, requested: Isolation) -> str | None:
        """Why `requested` refuses to evaluate on this host, if it does."""
        if requested is not Isolation.REQUIRE:
            return None
        if not self.isolated:
            return f"isolation required (--isolation require) but unavailable on this host: {self.problem}"
        if self.processes_problem:
            return f"isolation required (--isolation require) but the process limit cannot be enforced: {self.processes_problem}"
        return None

    def warnings(self, requested: Isolation) -> list[str]:
        out = []
        if requested is Isolation.OFF:
            out.append("sandbox isolation is OFF (--isolation off): candidates run with the user's full rights; lost: "
                       + "; ".join(PROTECTIONS))
        elif not self.isolated:
            out.append(f"sandbox isolation is unavailable on this host ({self.problem}); lost: " + "; ".join(PROTECTIONS)
                       + ". Use --isolation require to refuse to run without it.")
        if self.processes_problem:
            out.append(f"{self.processes_problem}. Use --isolation require to refuse to run without the limit.")
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
                 isolation: Isolation = Isolation.BEST_EFFORT, resources: Resources | None = None,
                 refused: frozenset[str] = frozenset(), triton_compiles: bool = False):
        """`resources`: every worker's limits (sandbox/resources.py). `refused`: environment variables that
        never reach a candidate whatever their name (the run's API key variable). `triton_compiles`: on the
        CPU, Triton compiles for a GPU rather than interpreting (build workers, evaluation/builder.py): the
        zygote imports it so, since Triton's own library functions are made interpreted or not at import."""
        self.device = device
        self.triton_compiles = triton_compiles
        self.work_root = Path(work_root).resolve()  # the worker chdirs into job dirs below it from elsewhere
        self.work_root.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:  # the zygote loads its native stopwatch from here: nobody else may write it
            check_private(self.work_root)
        except PrivateDirError as exc:
            raise SandboxError(f"sandbox folder refused: {exc}") from None
        self.startup_timeout = startup_timeout
        self.isolation = isolation
        self.resources = resources or Resources()
        self.refused = refused
        self.report = IsolationReport()
        self._warned: set[str] = set()
        self.visible_gpu = self._current_gpu() if device == "cuda" else None
        self._proc: subprocess.Popen[bytes] | None = None
        self._ctrl: socket.socket | None = None
        self.pids_cgroup: Path | None = None  # the zygote's folder of pids cgroups (sandbox/pids.py), if any
        # The control socket is request/reply: one exchange at a time (the judge's thread starts
        # reference workers, sandbox/reference_worker.py, while this thread runs candidates).
        self._lock = threading.RLock()
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

    def _environment(self) -> dict[str, str]:
        env = scrubbed_environment(self.device, self.visible_gpu, refused=self.refused)
        if self.triton_compiles:
            env.pop("TRITON_INTERPRET", None)
        return env

    def _start_zygote(self) -> None:
        self.close()
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        log = open(self.work_root / "zygote.log", "ab")  # noqa: SIM115  (owned by the child process)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "ksearch_ray.evaluation.sandbox.zygote", str(child.fileno()), self.device,
                 self.isolation.value],
                pass_fds=[child.fileno()],
                env={**self._environment(), "HOME": str(self.work_root)},  # its tools write nothing into the user's home
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
            tail = read_tail(self.work_root / "zygote.log", 2000)
            self.close()
            raise SandboxError(f"sandbox zygote failed to start: {tail.strip().splitlines()[-1] if tail.strip() else 'no output'}")
        self.zygote_starts += 1
        self.pids_cgroup = Path(hello["pids_cgroup"]) if hello.get("pids_cgroup") else None
        self.report = IsolationReport.of(hello, self.resources.processes)
        refusal = self.report.refusal(self.isolation)
        if refusal is not None:
            self.close()
            raise SandboxError(refusal)
        for line in self.report.warnings(self.isolation):
            if line not in self._warned:  # loud, once per evaluator
                self._warned.add(line)
                print(f"WARNING: {line}", file=sys.stderr, flush=True)

    def ensure_started(self) -> IsolationReport:
        """Start the zygote now (it probes the host's isolation): warnings and refusals come at start."""
        with self._lock:
            if not self.alive():
                self._start_zygote()
        return self.report

    def _request(self, message: dict[str, Any], fds: list[int] | None = None) -> dict[str, Any]:
        with self._lock:
            if self._ctrl is None:
                raise ConnectionError("the zygote is gone")
            self._ctrl.settimeout(10.0)
            if fds:
                socket.send_fds(self._ctrl, [json.dumps(message).encode()], fds)
            else:
                self._ctrl.send(json.dumps(message).encode())
            data = self._ctrl.recv(65536)
        if not data:
            raise ConnectionError("zygote closed its control socket")
        reply: dict[str, Any] = json.loads(data)
        return reply

    # --- workers ----------------------------------------------------------------------------

    def start(self, job: dict[str, Any], environment: dict[str, str] | None = None) -> WorkerHandle:
        """A worker for `job`; `environment`: variables the task declares (`declared_environment`), set
        before the job's code runs."""
        with self._lock:
            return self._start(job, environment)

    def _start(self, job: dict[str, Any], environment: dict[str, str] | None) -> WorkerHandle:
        for attempt in (1, 2):
            if not self.alive():
                self._start_zygote()
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            records, records_w = _pipe_for_records()
            try:
                reply = self._request({"cmd": "run", "processes": self.resources.processes}, [theirs.fileno(), records_w])
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
            # A takes these two off the job (zygote.py) before anything of the candidate's runs.
            chan.send({**job, "resources": dataclasses.asdict(self.resources), "environment": environment or {}})
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
        with self._lock:
            self._close()

    def _close(self) -> None:
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
        if self.pids_cgroup is not None:  # the zygote's cgroups, with whatever a candidate left in them
            leftovers.sweep_cgroups(self.pids_cgroup.parent)
            self.pids_cgroup = None
