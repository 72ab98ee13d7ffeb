"""Timing inside the worker: warm-up, the timed calls, and the re-timing the evaluator clocks itself.

Timed calls (`run_timing`): per workload, calls until the native stopwatch's stop rule says the
mean is known well enough (sandbox/clock.py; the rule is the evaluator's TimingPolicy). On a GPU
the call is captured once as a CUDA graph where it can be (`Replay`): each timed call then copies
that call's fresh inputs into the captured buffers, flushes the L2 and syncs, all outside the
timed region, and replays the graph between the stopwatch's events, so no candidate Python, launch
gap or host jitter is in the figure and the candidate cannot tell one timed call from another (the
L2 flush is queued just ahead of the start event, so the graph's launch latency is hidden behind it). A
call that cannot be captured (it syncs, or plans on the host) is called instead, as on the CPU. A
trusted baseline's per-input setup (`prepare`, e.g. FlashInfer's plan) runs before the capture, and
in fresh mode the call is captured again after the setup for every input set, so a library's kernel
is timed as a replay like a candidate's, without its wrapper's host-side Python.
Whatever is timed, the output of the last timed call is handed over and judged against the
reference for that call's inputs.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from ksearch_ray.evaluation.sandbox import clock, integrity
from ksearch_ray.evaluation.sandbox.harness import CandidateFailure, Worker
from ksearch_ray.evaluation.sandbox.protocol import (
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
    Tick,
    TimeCmd,
    Timed,
    TimingMethod,
    Warmed,
    WorkItem,
)
from ksearch_ray.evaluation.seeds import call_seed
from ksearch_ray.models import Status

_perf = integrity.perf_counter
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
            return None
        torch.cuda.current_stream().wait_stream(stream)
        w.integrity_check("capturing the call as a CUDA graph")  # the candidate's Python ran
        graph.replay()  # untimed: the graph's first launch uploads it to the device
        w.sync()
        return cls(graph, inputs, outputs)

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
        _time_one(w, item, cmd, flush)
    w.current = None
    w.send(Done())


def _time_one(w: Worker, item: WorkItem, cmd: TimeCmd, flush: Any) -> None:
    name = w.current = item.workload.name
    fresh = cmd.mode == "fresh"
    watch = clock.stopwatch()
    watch.reset()
    inputs: dict[str, Any] | None = w.inputs_for(item.workload, call_seed(item.seed, 0))
    assert inputs is not None
    w.set_up(inputs)
    replay = Replay.capture(w, inputs) if cmd.graphs and w.cuda else None
    every_call_replayed = replay is not None
    result: Any = None
    seed_index, n, start = 0, 0, _perf()
    for i in range(cmd.max_calls):
        if fresh and i > 0:  # new inputs and weights for every call, generated outside the timed region
            seed_index = i
            if replay is None:
                result = inputs = None  # free the last call's memory first
            new = w.inputs_for(item.workload, call_seed(item.seed, i))
            # Recaptured when the new inputs do not fit the captured buffers, and always for a trusted
            # baseline with a per-input setup: that setup (a library's plan for this page table) runs
            # on the new inputs first, and the graph holds what it planned.
            if replay is not None and (w.prepare is not None or not replay.refill(new)):
                w.set_up(new)
                replay = Replay.capture(w, new)
                every_call_replayed = every_call_replayed and replay is not None
                if replay is None:
                    inputs = new
            elif replay is None:
                inputs = new
                w.set_up(inputs)
            del new
        if replay is not None:
            # The flush is still running on the device when the start event and the graph launch are
            # queued behind it, so the event starts the clock when the graph's work can start: the
            # host's launch latency (microseconds, jittery) is not in the figure of a short kernel.
            w.sync()
            if flush is not None:
                flush()
            watch.begin()
            replay.graph.replay()
        else:
            if flush is not None:
                flush()
            w.sync()
            watch.begin()
            assert inputs is not None
            result = w.call(inputs)
        if watch.end() != 0:
            raise CandidateFailure(Status.RUNTIME_ERROR, f"a CUDA error surfaced while timing call {i} of {name}")
        n = i + 1
        if replay is None:
            w.integrity_check(f"timed call {i} of {name}")
        w.send(Tick(n=n))
        if n >= cmd.min_calls and (watch.should_stop(cmd.min_calls, cmd.target_rel_err, cmd.max_total_s * 1e3)
                                   or _perf() - start > cmd.max_wall_s):
            break
    if replay is not None:
        result, inputs = replay.outputs, replay.inputs
    assert inputs is not None
    outputs = w.check_outputs(result, inputs)
    method: TimingMethod = "graph_replay" if every_call_replayed and replay is not None else "calls"
    w.deliver(lambda h: Timed(index=item.index, count=n, seed_index=seed_index, method=method, handover=h), outputs)


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
            graph = None
            inputs = w.inputs_for(item.workload, call_seed(item.seed, 0))
            w.set_up(inputs)
            for _ in range(2):
                result = w.call(inputs)
            w.sync()
            graph, result = _capture_with_flush(w, flush, inputs, result) if w.cuda else (None, result)
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
