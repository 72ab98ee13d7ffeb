"""What happens around a timed call in the worker (issue 39's reproduction check): between the
stopwatch's begin and end nothing of the harness's runs, only the candidate's call, as in GPUMode's
eval.py (start event, `custom_kernel(data)`, end event); the evaluator is not woken after every timed
call; the collector of a worker forked from the zygote does not walk the zygote's imports; and a worker
that waits for a timed call's verdict can wait on the CPU, as eval.py's process does while it checks.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from ksearch_ray.evaluation.evaluator import Evaluator
from ksearch_ray.evaluation.sandbox import clock, harness, integrity, timer
from ksearch_ray.evaluation.sandbox.channel import Channel
from ksearch_ray.evaluation.sandbox.handover import Exporter
from ksearch_ray.evaluation.sandbox.protocol import Tick, TimeCmd, WorkItem
from ksearch_ray.evaluation.settings import Limits, TimingPolicy
from ksearch_ray.evaluation.worker_session import Session
from ksearch_ray.models import Status
from ksearch_ray.taskspec.task import Task, find_task, solution_from_file

DATA = Path(__file__).parent / "data"


class TracingStopwatch:
    """The stopwatch's interface; `inside` is true between begin and end."""

    def __init__(self, calls: int):
        self.calls, self.n, self.inside = calls, 0, False

    def start(self, fd: int, cuda: bool, stream: int) -> None:
        pass

    def reset(self) -> None:
        self.n = 0

    def begin(self) -> None:
        self.inside = True

    def end(self) -> int:
        self.inside = False
        self.n += 1
        return 0

    def should_stop(self, min_calls: int, target_rel_err: float, max_total_ms: float) -> bool:
        return self.n >= self.calls


class Sent:
    """A worker's channel that keeps what is sent."""

    def __init__(self) -> None:
        self.messages: list[Any] = []

    def send(self, message: Any, fds: Any = ()) -> None:
        self.messages.append(message)


def cpu_worker(task: Task, entry: Any, tmp_path: Path) -> harness.Worker:
    """The harness's Worker as serve() sets it up, on the CPU, without a sandbox around it."""
    w = harness.Worker.__new__(harness.Worker)
    w.chan = Sent()  # type: ignore[assignment]
    w.task, w.entry, w.prepare, w.current = task, entry, None, None
    w.device, w.cuda, w.options, w.src = "cpu", False, frozenset(), tmp_path
    w.guard, w.exporter = integrity.Guard(), Exporter("cpu")
    w._quiet_since, w._quiet_calls = time.perf_counter(), 0
    return w


def harness_work_in_timed_calls(task: Task, entry: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                calls: int = 5, workload_set: str = "benchmarks") -> list[str]:
    """Every Python function the harness called between a timed call's begin and end (the candidate's own
    calls, from inside its entry point, excepted), by a profile hook over the worker's call timing."""
    watch = TracingStopwatch(calls)
    monkeypatch.setattr(clock, "stopwatch", lambda: watch)
    w = cpu_worker(task, entry, tmp_path)
    [workload] = task.workloads(workload_set, "cpu")[:1]
    cmd = TimeCmd(mode="fresh", workloads=[WorkItem(index=0, workload=workload, seed=7)], max_calls=calls,
                  min_calls=1, target_rel_err=1e-3, max_total_s=60.0, max_wall_s=60.0, warmup_calls=0,
                  flush_l2=False, graphs=False, recheck=False)
    entry_code = getattr(entry, "__code__", None)
    skip = {TracingStopwatch.end.__code__}
    found: list[str] = []

    def candidates(frame: Any) -> bool:
        while frame is not None:
            if frame.f_code is entry_code:
                return True
            frame = frame.f_back
        return False

    def profile(frame: Any, event: str, arg: Any) -> None:
        if not watch.inside or event not in ("call", "c_call"):
            return
        if event == "call" and frame.f_code in skip:
            return
        if not candidates(frame):
            found.append(frame.f_code.co_qualname if event == "call" else f"{getattr(arg, '__qualname__', arg)} (builtin)")

    sys.setprofile(profile)
    try:
        timer._time_calls(w, item=cmd.workloads[0], cmd=cmd, flush=None)
    finally:
        sys.setprofile(None)
    assert watch.n == calls
    return found


@pytest.mark.parametrize("task_name", ["toy", "trimul"])
def test_between_the_stopwatch_begin_and_end_runs_the_candidates_call_alone(task_name, tmp_path, monkeypatch):
    """GPUMode's loop times `custom_kernel(data)` with `data` made before its start event; the harness's
    calling convention (TriMul's data tuple, packed by the task), its exception boundary and the stopwatch's
    Python wrappers ran inside the window before (Worker.call, Task.call, pack_data)."""
    task = Task.load(DATA / "toy") if task_name == "toy" else find_task("trimul")
    if task_name == "toy":
        def entry(x, a, b):
            return a * x + b
    else:
        def entry(data):
            x, mask, weights, config = data
            return x * 1.0
    found = harness_work_in_timed_calls(task, entry, tmp_path, monkeypatch,
                                        workload_set="smoke-cpu" if task_name == "trimul" else "benchmarks")
    assert found == [], f"the harness ran {found} inside timed calls"


def test_a_candidate_that_raises_in_a_timed_call_is_still_a_status(tmp_path, monkeypatch):
    toy = Task.load(DATA / "toy")
    calls = []

    def entry(x, a, b):
        calls.append(1)
        if len(calls) == 3:
            raise ValueError("third call")
        return a * x + b

    with pytest.raises(harness.CandidateFailure) as caught:
        harness_work_in_timed_calls(toy, entry, tmp_path, monkeypatch)
    assert caught.value.status is Status.RUNTIME_ERROR and caught.value.message == "ValueError: third call"

    def leave(x, a, b):
        raise SystemExit(3)

    with pytest.raises(harness.CandidateFailure) as exited:
        harness_work_in_timed_calls(toy, leave, tmp_path, monkeypatch)
    assert exited.value.status is Status.CRASHED and "sys.exit(3)" in exited.value.message


def test_the_native_stopwatch_is_called_without_a_python_frame_and_records_the_calls_host_time(tmp_path):
    lib, problem = clock.build_native(tmp_path)
    if lib is None:
        pytest.skip(problem or "no native stopwatch")
    watch = clock.NativeStopwatch(lib)
    assert watch.begin is watch.lib.ks_begin and watch.end is watch.lib.ks_end
    read_fd, write_fd = os.pipe()
    try:
        watch.start(write_fd, False, 0)
        watch.begin()
        time.sleep(0.02)  # the call's host work
        returned = time.perf_counter()
        while time.perf_counter() - returned < 0.01:  # after its return: in the end's wait, not in its host time
            pass
        assert watch.end() == 0
        [record] = clock.parse_records(bytearray(os.read(read_fd, clock.RECORD_SIZE * 2)))
    finally:
        os.close(read_fd)
        os.close(write_fd)
    assert record.seq == 0 and record.status == 0
    assert 20 <= record.host_ms <= record.time_ms, record


@pytest.fixture(scope="module")
def evaluator(tmp_path_factory: pytest.TempPathFactory):
    ev = Evaluator("cpu", tmp_path_factory.mktemp("sandbox"), limits=Limits(setup=120, build_python=60, idle=60, total=240),
                   timing=TimingPolicy(min_calls=40, max_calls=40, target_rel_err=1e-9, max_total_s=30))
    yield ev
    ev.close()


def test_the_evaluator_is_not_woken_after_every_timed_call(evaluator, tmp_path, monkeypatch):
    """The worker said `tick` after each timed call, and the evaluator's Python woke to read it while the
    worker made its next call; now it hears from the worker a few times a second at most."""
    toy = Task.load(DATA / "toy")
    received: list[Any] = []
    recv = Session.recv

    def counting(self: Session, stage: str, phase: str, *expect: Any) -> Any:
        msg = recv(self, stage, phase, *expect)
        received.append(msg)
        return msg

    monkeypatch.setattr(Session, "recv", counting)
    path = tmp_path / "axpy.py"
    path.write_text("def run(x, a, b):\n    return a * x + b\n")
    result = evaluator.evaluate(toy, solution_from_file(path, toy))
    assert result.passed, result.message
    calls = sum(w.call_timing.count for w in result.workloads if w.call_timing)
    assert calls == 40 * len(result.workloads)
    ticks = sum(isinstance(m, Tick) for m in received)
    assert ticks * 10 <= calls, (ticks, calls)  # before: one a call
    assert all(w.call_timing and w.call_timing.host_median_ms is not None for w in result.workloads)


def test_a_workers_collector_does_not_walk_what_the_zygote_imported(evaluator, toy_frozen_probe):
    result = toy_frozen_probe
    assert result.status is Status.COMPILE_ERROR
    frozen = int(result.message.rsplit("frozen=", 1)[1].split()[0])
    assert frozen > 10_000, result.message  # torch and Triton alone hold far more objects


@pytest.fixture
def toy_frozen_probe(evaluator, tmp_path):
    toy = Task.load(DATA / "toy")
    path = tmp_path / "probe.py"
    path.write_text("import gc\nraise RuntimeError(f'frozen={gc.get_freeze_count()} ')\n\ndef run(x, a, b):\n    return x\n")
    return evaluator.evaluate(toy, solution_from_file(path, toy))


def test_a_spinning_receive_waits_on_the_cpu_and_a_plain_one_asleep():
    """Under recheck on a GPU the worker waits for the evaluator's verdict on the CPU (Worker.receive(spin=True)),
    as eval.py's process stays on it while it checks an output."""
    ours, theirs = socket.socketpair()
    key = os.urandom(32)
    chan, peer = Channel(ours, key), Channel(theirs, key)
    cpu = {}
    try:
        for spin in (True, False):
            sender = threading.Timer(0.3, lambda: peer.send({"type": "go"}))
            sender.start()
            t0 = time.thread_time()
            assert chan.recv(5.0, spin=spin) == {"type": "go"}
            cpu[spin] = time.thread_time() - t0
            sender.join()
    finally:
        chan.close()
        peer.close()
    assert cpu[True] > 0.03 and cpu[False] < 0.01, cpu
