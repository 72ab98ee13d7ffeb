"""Timing inside the worker: warm-up, the timed calls, and the re-timing the evaluator clocks itself.

Timed calls (`run_timing`): per workload, two figures, each timed until the native stopwatch's stop
rule says its mean is known well enough (sandbox/clock.py; the rule is the evaluator's TimingPolicy).

* kernel (GPU only, where the call can be captured, `Replay`): the call captured once as a CUDA
  graph; each timed call copies that call's fresh inputs into the captured buffers and syncs
  outside the timed region, the L2 flush is queued just ahead of the start event (so the graph's
  launch latency hides behind it), and the graph is replayed between the stopwatch's events: no
  candidate Python, launch gap or host jitter is in the figure. A trusted baseline's per-input
  setup (`prepare`, e.g. FlashInfer's plan) runs before each capture.
* call (always): the candidate's own call between the stopwatch's events after a flush and a
  device sync, host launch work included, as GPUMode's eval.py and FlashInfer-Bench time it, with
  the integrity checks after every call. Where the task rechecks (GPUMode's leaderboard mode), each
  call's output is handed over and judged by the evaluator before the next call is made, untimed,
  as eval.py checks each output before its next call. On the CPU path this is the only figure.

Each figure's last output is handed over and judged against the reference for that call's inputs.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from ksearch_ray.evaluation.sandbox import clock, integrity
from ksearch_ray.evaluation.sandbox.harness import CandidateFailure, Worker
from ksearch_ray.evaluation.sandbox.protocol import (
    CallOutput,
    Done,
    FinishCmd,
    Go,
    Output,
    OutputCmd,
    PrepareCmd,
    Prepared,
    Ran,
    RetimeCmd,
    RunCmd,
    TimeCmd,
    Timed,
    Warmed,
    WorkItem,
)
from ksearch_ray.evaluation.seeds import call_seed
from ksearch_ray.models import Status

_perf = integrity.perf_counter
_sync = torch.cuda.synchronize
_empty_cache = torch.cuda.empty_cache  # bound before any candidate exists, like the clocks
_SCALARS = (int, float, bool, str, type(None))


class Replay:
    """A candidate's call captured as a CUDA graph, with the input buffers it reads and the outputs it writes."""

    def __init__(self, graph: Any, inputs: dict[str, Any], outputs: Any):
        self.graph, self.inputs, self.outputs = graph, inputs, outputs

    @classmethod
    def capture(cls, w: Worker, inputs: dict[str, Any]) -> Replay | None:
        """The call on `inputs` as a graph; None when it cannot be captured (it is then called instead).

        Captured on a side stream, as torch.cuda.graph does, but without its garbage collection and
        cache emptying on every capture (tens of milliseconds, and a workload may be recaptured)."""
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        outputs: Any = None
        try:
            with torch.cuda.stream(stream):
                graph.capture_begin()
                try:
                    outputs = w.task.call(w.entry, inputs)
                finally:
                    graph.capture_end()
        except Exception:  # a call that syncs, allocates on the host or plans per call: timed as calls
            with contextlib.suppress(RuntimeError):
                w.sync()
                _empty_cache()  # what the failed capture allocated
            return None
        torch.cuda.current_stream().wait_stream(stream)
        w.integrity_check("capturing the call as a CUDA graph")  # the candidate's Python ran
        graph.replay()  # untimed: the graph's first launch uploads it to the device
        w.sync()
        return cls(graph, inputs, outputs)

    def release(self) -> None:
        """Free the graph and what it holds, and give its private memory pool back to the device
        (the caching allocator frees a dead graph's pool only when its cache is emptied)."""
        self.outputs, self.inputs = None, {}
        self.graph.reset()
        _sync()
        _empty_cache()

    def refill(self, new: dict[str, Any]) -> bool:
        """Copy `new` into the captured buffers; False when it does not fit them (the graph is then recaptured)."""
        if new.keys() != self.inputs.keys():
            return False
        for name, value in new.items():
            old = self.inputs[name]
            if isinstance(value, torch.Tensor):
                if not (isinstance(old, torch.Tensor) and old.shape == value.shape and old.dtype == value.dtype
                        and old.device == value.device and old.stride() == value.stride()):
                    return False
            elif not (isinstance(value, _SCALARS) and type(old) is type(value) and old == value):
                return False  # a scalar is baked into the graph
        for name, value in new.items():
            if isinstance(value, torch.Tensor):
                self.inputs[name].copy_(value)
        return True


def run_timing(w: Worker, cmd: TimeCmd) -> None:
    flush = w.l2_flusher() if w.cuda and cmd.flush_l2 else None
    # Warm-up over every benchmark shape first (compilation, autotuning, caches).
    for item in cmd.workloads:
        w.current = item.workload.name
        inputs = w.inputs_for(item.workload, call_seed(item.seed, 0))
        w.set_up(inputs)
        for _ in range(cmd.warmup_calls):
            w.call(inputs)
        w.sync()
        w.integrity_check(f"warm-up of {item.workload.name}")
        w.progress(f"warmed up {item.workload.name}")
        del inputs
    w.current = None
    w.send(Warmed())
    if not isinstance(w.receive(), Go):  # the evaluator has its verdict already
        return
    for item in cmd.workloads:
        if cmd.graphs and w.cuda:
            _time_kernel(w, item, cmd, flush)
        _time_calls(w, item, cmd, flush)
    w.current = None
    w.send(Done())


def _enough(watch: Any, n: int, cmd: TimeCmd, start: float) -> bool:
    return n >= cmd.min_calls and (watch.should_stop(cmd.min_calls, cmd.target_rel_err, cmd.max_total_s * 1e3)
                                   or _perf() - start > cmd.max_wall_s)


def _time_kernel(w: Worker, item: WorkItem, cmd: TimeCmd, flush: Any) -> None:
    """The kernel figure: the call captured as a CUDA graph and replayed. Sends nothing when the call
    cannot be captured (it syncs, or plans on the host): the workload then has the call figure only.

    In fresh mode each call's inputs are copied into the captured buffers, untimed; they are captured
    again when they do not fit, and always for a trusted baseline with a per-input setup (its plan
    for these inputs is in the graph). At most two graphs exist at a time: a replaced graph is reset
    and the cache emptied, since a graph's private memory pool goes back to the device only then
    (without it, one capture per input set held 127.8 GiB of an H200)."""
    name = w.current = item.workload.name
    watch = clock.stopwatch()
    watch.reset()
    first = w.inputs_for(item.workload, call_seed(item.seed, 0))
    w.set_up(first)
    replay = Replay.capture(w, first)
    del first
    if replay is None:
        return
    fresh = cmd.mode == "fresh"
    seed_index, n, start = 0, 0, _perf()
    for i in range(cmd.max_calls):
        if fresh and i > 0:
            new = w.inputs_for(item.workload, call_seed(item.seed, i))
            if w.prepare is not None or not replay.refill(new):
                w.set_up(new)
                again = Replay.capture(w, new)
                if again is None:  # these inputs cannot be replayed: the figure is the replays so far
                    break
                replay.release()
                replay = again
            del new
            seed_index = i
        # The flush is still running on the device when the start event and the graph launch are
        # queued behind it, so the event starts the clock when the graph's work can start: the
        # host's launch latency (microseconds, jittery) is not in the figure of a short kernel.
        w.sync()
        if flush is not None:
            flush()
        watch.begin()
        replay.graph.replay()
        if watch.end() != 0:
            raise CandidateFailure(Status.RUNTIME_ERROR, f"a CUDA error surfaced while replaying call {i} of {name}")
        n = i + 1
        w.tick(n)
        if _enough(watch, n, cmd, start):
            break
    outputs = w.check_outputs(replay.outputs, replay.inputs)
    w.deliver(lambda h: Timed(index=item.index, figure="kernel", count=n, seed_index=seed_index,
                              method="graph_replay", handover=h), outputs)
    del outputs
    replay.release()


def _time_calls(w: Worker, item: WorkItem, cmd: TimeCmd, flush: Any) -> None:
    """The call figure: the candidate's own call between the stopwatch's events after a device sync,
    host launch work included (GPUMode's eval.py and FlashInfer-Bench time it so); a trusted
    baseline's per-input setup runs before, untimed. The integrity checks run after every call."""
    name = w.current = item.workload.name
    watch = clock.stopwatch()
    watch.reset()
    fresh = cmd.mode == "fresh"
    if w.cuda:
        # Untimed: the graphs of the kernel figure were freed with the allocator's cache, and a timed
        # call must not pay for refilling it (cudaMalloc) where the warm-up left it warm. In fresh
        # mode on inputs no timed call gets, so nothing it leaves behind answers a timed call.
        warm = w.inputs_for(item.workload, call_seed(item.seed, cmd.max_calls if fresh else 0))
        w.set_up(warm)
        w.call(warm)
        w.sync()
        w.integrity_check(f"the untimed call before timing {name}")
        del warm
    inputs: dict[str, Any] | None = w.inputs_for(item.workload, call_seed(item.seed, 0))
    assert inputs is not None
    w.set_up(inputs)
    result: Any = None
    entry = w.entry
    # Between the stopwatch's begin and end: the candidate's call and nothing of the harness's (GPUMode's
    # eval.py records its start event, calls custom_kernel(data) and records its end event). The arguments
    # in the task's calling convention are made before, and the stopwatch's own C functions are called
    # directly (clock.NativeStopwatch), without a Python frame of the harness's around them.
    begin, end = watch.begin, watch.end
    seed_index, n, start = 0, 0, _perf()
    for i in range(cmd.max_calls):
        if fresh and i > 0:  # new inputs and weights for every call, generated outside the timed region
            result = inputs = None  # free the last call's memory first
            inputs = w.inputs_for(item.workload, call_seed(item.seed, i))
            w.set_up(inputs)
            seed_index = i
        assert inputs is not None
        args = w.task.arguments(inputs)
        if flush is not None:
            flush()
        w.sync()
        begin()
        try:
            result = entry(*args)
        except (Exception, SystemExit) as exc:  # the candidate boundary, as Worker.call's
            raise w.failure(exc) from None
        if end() != 0:
            raise CandidateFailure(Status.RUNTIME_ERROR, f"a CUDA error surfaced while timing call {i} of {name}")
        del args
        n = i + 1
        w.integrity_check(f"timed call {i} of {name}")
        w.tick(n)
        if _enough(watch, n, cmd, start):
            break
        if cmd.recheck and fresh:
            # Judged by the evaluator before the next call (its reference on the GPU, as eval.py's check).
            # On a GPU the worker waits for the verdict on the CPU, as eval.py's process stays on it while it
            # checks; asleep, its CPU was free for the evaluator's judge, and the next call's host work
            # found it idle or its caches full of the judge's.
            checked = w.check_outputs(result, inputs)
            w.deliver(lambda h: CallOutput(index=item.index, seed_index=seed_index, handover=h), checked,  # noqa: B023
                      spin=w.cuda)
            del checked
            if not isinstance(w.receive(spin=w.cuda), Go):
                raise RuntimeError("the evaluator answered a timed call's output with something other than `go`")
    assert inputs is not None
    outputs = w.check_outputs(result, inputs)
    w.deliver(lambda h: Timed(index=item.index, figure="call", count=n, seed_index=seed_index, method="calls",
                              handover=h), outputs)


# --- re-timing (clocked by the evaluator: evaluation/retime.py) --------------------------------------


def run_retime(w: Worker, cmd: RetimeCmd) -> None:
    items = {item.index: item for item in cmd.workloads}
    flush = w.l2_flusher() if w.cuda else (lambda: None)
    graph: Any = None
    inputs: dict[str, Any] = {}
    result: Any = None
    while True:
        msg = w.receive()
        if isinstance(msg, PrepareCmd):
            item = items[msg.index]
            w.current = item.workload.name
            if graph is not None:  # the last workload's graphs: their memory goes back to the device
                graph = result = None
                _sync()
                _empty_cache()
            inputs = w.inputs_for(item.workload, call_seed(item.seed, 0))
            w.set_up(inputs)
            for _ in range(2):
                result = w.call(inputs)
            w.sync()
            graph, result = _capture_with_flush(w, flush, inputs, result) if w.cuda and cmd.graphs else (None, result)
            w.integrity_check(f"preparing the re-timing of {w.current}")
            w.send(Prepared(method="graph_replay" if graph else "calls"))
        elif isinstance(msg, RunCmd):
            result = _run_reps(w, msg.kind, msg.reps, flush, graph, inputs, result)
            w.integrity_check(f"re-timing {w.current}")
            w.send(Ran())
        elif isinstance(msg, OutputCmd):
            outputs = w.check_outputs(result, inputs)
            index = msg.index
            w.deliver(lambda h: Output(index=index, handover=h), outputs)  # noqa: B023
        elif isinstance(msg, FinishCmd):
            w.current = None
            w.send(Done())
            return
        else:
            raise RuntimeError(f"unexpected command {msg.type!r} while re-timing")


def _capture_with_flush(w: Worker, flush: Any, inputs: dict[str, Any], result: Any) -> tuple[Any, Any]:
    """(graphs of one flush + call and of the flush alone, the call's output), or (None, result)."""
    graph = {"call": torch.cuda.CUDAGraph(), "flush": torch.cuda.CUDAGraph()}
    try:
        with torch.cuda.graph(graph["call"]):
            flush()
            out = w.task.call(w.entry, inputs)
        with torch.cuda.graph(graph["flush"]):
            flush()
    except Exception:  # a call that syncs, allocates on the host or plans per call: timed as calls
        with contextlib.suppress(RuntimeError):
            w.sync()
        return None, result
    graph["call"].replay()
    w.sync()
    return graph, out


def _run_reps(w: Worker, kind: str, reps: int, flush: Any, graph: Any, inputs: dict[str, Any], result: Any) -> Any:
    for _ in range(reps):
        if graph is not None:
            graph[kind].replay()
        else:
            flush()
            if kind == "call":
                result = w.call(inputs)
    w.sync()
    return result
