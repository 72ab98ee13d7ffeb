"""The sandboxed side of an evaluation: runs in a process forked from the zygote for one candidate.

It builds the candidate, calls it on inputs it generates from the seeds it is given, writes
the outputs to files for the evaluator to judge, and times it. It never sees an expected
output: the evaluator computes references itself, in its own process, after the fact.

Timed calls are measured by the native stopwatch (clock.py): its records go from C to a pipe
the evaluator reads, never through this process's Python objects. The messages below carry
counts, files and hashes, no times.

Protocol (framed by channel.Channel):
  worker -> ready {setup_s} ; built {seconds} | fail {status, message, log}
  worker -> output {workload, file, sha256, wall_ms}   (one per correctness workload)
  worker -> checked
  evaluator -> time {workloads, mode, ...} | retime {workloads} | stop
  time:   worker -> tick {n} ... timing {index, count, file, sha256, seed_index} ... done
  retime: per workload, evaluator -> prepare {index} ; worker -> prepared {method}
          evaluator -> run {kind: flush|call, reps} ; worker -> ran      (timed by the evaluator)
          evaluator -> output ; worker -> output {file, sha256}
          evaluator -> finish ; worker -> done
"""

from __future__ import annotations

import hashlib
import os
import sys
import traceback
from pathlib import Path
from typing import Any

import torch

from ksearch_ray.evaluation.sandbox import clock, integrity
from ksearch_ray.evaluation.sandbox.build import BuildError, load_entry
from ksearch_ray.evaluation.sandbox.channel import Channel
from ksearch_ray.evaluation.seeds import call_seed

_perf = integrity.perf_counter
_save = torch.save
_sync = torch.cuda.synchronize


class CandidateFailure(Exception):
    def __init__(self, status: str, message: str, log: str = ""):
        super().__init__(message)
        self.status = status
        self.message = message
        self.log = log


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _candidate_traceback(exc: BaseException, candidate_dir: Path) -> str:
    """Traceback frames from the candidate's own files only, plus the error line."""
    frames = [
        f"  {Path(fs.filename).name}:{fs.lineno} in {fs.name}: {(fs.line or '').strip()}"
        for fs in traceback.extract_tb(exc.__traceback__)
        if str(candidate_dir) in fs.filename
    ]
    lines = frames[-8:] + [f"{type(exc).__name__}: {str(exc).strip()[:1500]}"]
    return "\n".join(lines)


class Worker:
    def __init__(self, chan: Channel, job: dict[str, Any]):
        self.chan = chan
        self.job = job
        self.workdir = Path(job["workdir"])
        self.src = self.workdir / "src"
        self.device = job["device"]
        self.options = frozenset(job.get("options", []))
        self.cuda = self.device == "cuda"
        from ksearch_ray.taskspec.task import Task

        self.task = Task.load(job["task_root"])
        self.task.module  # noqa: B018  (load the trusted reference module before any candidate code)
        self.guard: integrity.Guard | None = None
        self.entry: Any = None
        self.prepare: Any = None  # a trusted baseline's untimed setup function (see set_up)
        self.current: str | None = None  # workload being run, for failure messages

    # --- helpers ----------------------------------------------------------------------------

    def sync(self) -> None:
        if self.cuda:
            _sync()

    def integrity_check(self, when: str) -> None:
        assert self.guard is not None
        problems = self.guard.check_and_restore()
        threads = self.guard.lingering_threads()
        if threads:
            problems.append(f"left threads running: {', '.join(threads)}")
        if problems:
            raise CandidateFailure("INTEGRITY_VIOLATION", f"{when}: " + "; ".join(problems))

    def inputs_for(self, workload: dict[str, Any], seed: int) -> dict[str, Any]:
        from ksearch_ray.taskspec.task import Workload

        try:
            with integrity.harness_numerics():
                return self.task.generate_inputs(Workload.model_validate(workload), seed, self.device, self.options)
        except Exception as exc:  # trusted code, but it runs after the candidate was imported
            raise CandidateFailure(
                "CRASHED",
                f"input generation failed (a broken task bundle, or a candidate that patched torch): "
                f"{type(exc).__name__}: {str(exc)[:300]}",
                traceback.format_exc()[-2000:],
            ) from None

    def set_up(self, inputs: dict[str, Any]) -> None:
        """A trusted baseline's untimed per-input setup (its `prepare`), before that input set's calls."""
        if self.prepare is not None:
            self.call(inputs, self.prepare)
            self.sync()

    def call(self, inputs: dict[str, Any], function: Any = None) -> Any:
        try:
            return self.task.call(function or self.entry, inputs)
        except CandidateFailure:
            raise
        except SystemExit as exc:
            raise CandidateFailure("CRASHED", f"the candidate called sys.exit({exc.code!r}) instead of returning") from None
        except Exception as exc:  # the candidate boundary: any exception becomes a status
            status = "COMPILE_ERROR" if type(exc).__name__ in {"CompilationError", "CompileTimeAssertionFailure"} else "RUNTIME_ERROR"
            if "out of memory" in str(exc).lower():
                status = "RUNTIME_ERROR"
            raise CandidateFailure(status, f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ''}",
                                   _candidate_traceback(exc, self.src)) from None

    def check_outputs(self, result: Any, inputs: dict[str, Any], pristine: dict[str, Any]) -> dict[str, torch.Tensor]:
        """Integrity checks that only the candidate's own process can make."""
        try:
            outputs = self.task.normalize_outputs(result)
        except ValueError as exc:
            raise CandidateFailure("INCORRECT_SHAPE", str(exc)) from None
        checked = {}
        for name, value in outputs.items():
            if not isinstance(value, torch.Tensor):
                raise CandidateFailure("INCORRECT_SHAPE", f"output `{name}` is a {type(value).__name__}, not a tensor")
            if not integrity.is_plain_tensor(value):
                raise CandidateFailure("INTEGRITY_VIOLATION", f"output `{name}` is a tensor subclass ({type(value).__name__})")
            alias = integrity.aliases_any(value, inputs)
            if alias is not None:
                raise CandidateFailure("INTEGRITY_VIOLATION", f"output `{name}` shares memory with input `{alias}`")
            checked[name] = value
        for name, value in inputs.items():
            if isinstance(value, torch.Tensor) and not integrity.bitwise_equal(value, pristine[name]):
                raise CandidateFailure("INTEGRITY_VIOLATION", f"the candidate modified its input `{name}`")
        return checked

    def save(self, outputs: dict[str, torch.Tensor], stem: str) -> tuple[str, str]:
        path = self.workdir / f"{stem}.pt"
        _save({k: v.detach().to("cpu") for k, v in outputs.items()}, path)
        return str(path), _sha256(path)

    # --- stages -------------------------------------------------------------------------------

    def build(self) -> None:
        t0 = _perf()
        try:
            self.entry = load_entry(
                self.src, self.job["language"], self.job["entry_file"], self.job["entry_point"], f"ks_{self.job['solution_id']}",
                prebuilt=self.job.get("prebuilt"),
            )
        except BuildError as exc:
            raise CandidateFailure("COMPILE_ERROR", "build failed", str(exc)) from None
        except SyntaxError as exc:
            raise CandidateFailure("COMPILE_ERROR", f"SyntaxError: {exc.msg} ({Path(exc.filename or '').name}:{exc.lineno})",
                                   (exc.text or "").rstrip()) from None
        except SystemExit as exc:
            raise CandidateFailure("CRASHED", f"the candidate called sys.exit({exc.code!r}) at import") from None
        except Exception as exc:  # import-time failure of candidate code
            raise CandidateFailure("COMPILE_ERROR", f"import failed: {type(exc).__name__}: {exc}",
                                   _candidate_traceback(exc, self.src)) from None
        if self.job.get("prepare"):  # set by the evaluator for a task's own bundled solution only
            module = sys.modules.get(f"ks_{self.job['solution_id']}")
            self.prepare = getattr(module, self.job["prepare"], None)
            if not callable(self.prepare):
                raise CandidateFailure("COMPILE_ERROR", f"{self.job['entry_file']} defines no callable `{self.job['prepare']}`")
        self.integrity_check("at import")
        self.chan.send({"type": "built", "seconds": _perf() - t0})

    def correctness(self) -> None:
        for item in self.job["check"]:
            self.current = item["workload"]["name"]
            inputs = self.inputs_for(item["workload"], item["seed"])
            pristine = {k: v.clone() for k, v in inputs.items() if isinstance(v, torch.Tensor)}
            self.set_up(inputs)
            self.sync()
            t0 = _perf()
            result = self.call(inputs)
            self.sync()
            wall_ms = (_perf() - t0) * 1e3
            self.integrity_check(f"workload {item['workload']['name']}")
            outputs = self.check_outputs(result, inputs, pristine)
            path, digest = self.save(outputs, f"check_{item['index']}")
            self.chan.send({"type": "output", "index": item["index"], "file": path, "sha256": digest, "wall_ms": wall_ms})
            del inputs, pristine, result, outputs
        self.chan.send({"type": "checked"})

    def timing(self, cmd: dict[str, Any]) -> None:
        items = cmd["workloads"]
        fresh = cmd["mode"] == "fresh"
        flush = self._l2_flusher() if (self.cuda and cmd.get("flush_l2", True)) else None
        # Warm-up over every benchmark shape first (compilation, autotuning, caches).
        for item in items:
            self.current = item["workload"]["name"]
            inputs = self.inputs_for(item["workload"], call_seed(item["seed"], 0))
            self.set_up(inputs)
            for _ in range(cmd.get("warmup_calls", 2)):
                self.call(inputs)
            self.sync()
            self.integrity_check(f"warm-up of {item['workload']['name']}")
        for item in items:
            self._time_one(item, fresh, flush, cmd)
        self.current = None
        self.chan.send({"type": "done"})

    def _time_one(self, item: dict[str, Any], fresh: bool, flush: Any, cmd: dict[str, Any]) -> None:
        name = self.current = item["workload"]["name"]
        max_calls, target_err = cmd.get("max_calls", 100), cmd.get("target_rel_err", 1e-3)
        max_total_ms, max_wall_s = cmd.get("max_total_s", 10.0) * 1e3, cmd.get("max_wall_s", 120.0)
        watch = clock.stopwatch()
        watch.reset()
        seed_index = 0
        inputs = self.inputs_for(item["workload"], call_seed(item["seed"], 0))
        self.set_up(inputs)
        start_wall = _perf()
        result: Any = None
        n = 0
        for i in range(max_calls):
            if fresh and i > 0:  # new inputs and weights for every call, generated outside the timed region
                del result
                seed_index = i
                inputs = self.inputs_for(item["workload"], call_seed(item["seed"], i))
                self.set_up(inputs)
            if flush is not None:
                flush()
            self.sync()
            watch.begin()
            result = self.call(inputs)
            if watch.end() != 0:
                raise CandidateFailure("RUNTIME_ERROR", f"a CUDA error surfaced while timing call {i} of {name}")
            n = i + 1
            self.integrity_check(f"timed call {i} of {name}")
            self.chan.send({"type": "tick", "n": n})
            if watch.should_stop(target_err, max_total_ms) or (n >= 3 and _perf() - start_wall > max_wall_s):
                break
        pristine = {k: v.clone() for k, v in inputs.items() if isinstance(v, torch.Tensor)}
        outputs = self.check_outputs(result, inputs, pristine)
        path, digest = self.save(outputs, f"timed_{item['index']}")
        self.chan.send({"type": "timing", "index": item["index"], "count": n, "file": path, "sha256": digest,
                        "seed_index": seed_index})

    def retime(self, cmd: dict[str, Any]) -> None:
        """A second, independent measurement, clocked by the evaluator (see evaluation/retime.py)."""
        items = {item["index"]: item for item in cmd["workloads"]}
        flush = self._l2_flusher() if self.cuda else (lambda: None)
        graph: Any = None
        inputs: dict[str, Any] = {}
        result: Any = None
        while True:
            msg = self.chan.recv()
            if msg["cmd"] == "prepare":
                item = items[msg["index"]]
                self.current = item["workload"]["name"]
                graph = None
                inputs = self.inputs_for(item["workload"], call_seed(item["seed"], 0))
                self.set_up(inputs)
                for _ in range(2):
                    result = self.call(inputs)
                self.sync()
                graph, result = self._capture(flush, inputs, result) if self.cuda else (None, result)
                self.integrity_check(f"preparing the re-timing of {self.current}")
                self.chan.send({"type": "prepared", "method": "graph" if graph else "calls"})
            elif msg["cmd"] == "run":
                result = self._run_reps(msg["kind"], int(msg["reps"]), flush, graph, inputs, result)
                self.integrity_check(f"re-timing {self.current}")
                self.chan.send({"type": "ran"})
            elif msg["cmd"] == "output":
                pristine = {k: v.clone() for k, v in inputs.items() if isinstance(v, torch.Tensor)}
                outputs = self.check_outputs(result, inputs, pristine)
                path, digest = self.save(outputs, f"retimed_{msg['index']}")
                self.chan.send({"type": "output", "index": msg["index"], "file": path, "sha256": digest, "wall_ms": 0.0})
            else:
                self.current = None
                self.chan.send({"type": "done"})
                return

    def _capture(self, flush: Any, inputs: dict[str, Any], result: Any) -> tuple[Any, Any]:
        """(graph of one flush + call, its output), or (None, result) where the call cannot be captured."""
        graph = {"call": torch.cuda.CUDAGraph(), "flush": torch.cuda.CUDAGraph()}
        try:
            with torch.cuda.graph(graph["call"]):
                flush()
                out = self.task.call(self.entry, inputs)
            with torch.cuda.graph(graph["flush"]):
                flush()
        except Exception:  # a call that syncs, allocates on the host or plans per call: timed as calls
            self.sync()
            return None, result
        graph["call"].replay()
        self.sync()
        return graph, out

    def _run_reps(self, kind: str, reps: int, flush: Any, graph: Any, inputs: dict[str, Any], result: Any) -> Any:
        for _ in range(reps):
            if graph is not None:
                graph[kind].replay()
            else:
                flush()
                if kind == "call":
                    result = self.call(inputs)
        self.sync()
        return result

    def _l2_flusher(self) -> Any:
        # Twice the H100/H200 L2 (50/60 MB): writing it evicts whatever the last call left there.
        buf = torch.empty(128 * 1024 * 1024 // 4, dtype=torch.int32, device="cuda")
        return lambda: buf.zero_()


def _redirect_output(workdir: Path) -> None:
    for fd, name in ((1, "stdout.log"), (2, "stderr.log")):
        f = os.open(workdir / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(f, fd)
        os.close(f)
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
    _redirect_output(workdir)
    os.environ["TRITON_CACHE_DIR"] = job["triton_cache_dir"]
    os.environ["TORCH_EXTENSIONS_DIR"] = str(workdir / "torch_extensions")
    os.environ["HOME"] = str(workdir)
    _private_flashinfer_workspace(workdir)
    if job.get("kind") == "build":  # a build ahead of the evaluation (ksearch_ray.evaluation.builder)
        from ksearch_ray.evaluation.sandbox.build import serve_build

        return serve_build(chan, job)
    t0 = _perf()
    try:
        worker = Worker(chan, job)
        if worker.cuda:
            torch.cuda.init()
            torch.empty(1, device="cuda")  # context creation belongs to sandbox overhead, not to the candidate
        try:
            clock.stopwatch().start(clock_fd, worker.cuda, torch.cuda.current_stream().cuda_stream if worker.cuda else 0)
        except RuntimeError as exc:
            print(f"sandbox fault: {exc}", file=sys.stderr, flush=True)
            return 98  # before "ready": the evaluator reports a sandbox fault, not a candidate failure
        worker.guard = integrity.Guard()
        chan.send({"type": "ready", "setup_s": _perf() - t0})
        worker.build()
        worker.correctness()
        cmd = chan.recv()
        if cmd.get("cmd") == "time":
            worker.timing(cmd)
        elif cmd.get("cmd") == "retime":
            worker.retime(cmd)
    except CandidateFailure as failure:
        where = worker.current if "worker" in locals() else None
        chan.send({"type": "fail", "status": failure.status, "message": failure.message, "log": failure.log, "workload": where})
    sys.stdout.flush()
    sys.stderr.flush()
    return 0
