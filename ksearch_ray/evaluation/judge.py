"""The judge: references (once per input set), and comparisons.

A trusted task's references (a bundle that shipped with the package) are computed here, in the
evaluator's process. Any other task's code is untrusted: its references come from a sandboxed worker
(evaluation/reference.py, made by `sandboxed`), handed over like a candidate's outputs; the judge
only compares them.

It works on a thread of its own, so while the worker runs the next workload the judge computes
the reference for the last one and compares (on a GPU, on a CUDA stream of its own: the hand-over
copies on the default stream never wait behind a reference). The evaluator keeps the judge idle
while the worker's calls are timed, so the two never compete for the GPU then.

A reference depends only on the task, the workload, the seed and the compatibility options: the
inputs are regenerated from the seed, bit for bit. Every candidate an evaluator judges gets the
same secret-derived seeds for its correctness checks, so the judge keeps those references (up to
`cache_bytes`, least recently used out) and computes each once per evaluator.

The outputs of each figure's last timed call are judged too. Their seeds are the timing seeds (the same
for every candidate too) at the index of the last call, which the stop rule decides; it is often the same
index (the fewest calls, or the most), and the kernel figure's last call often has the call figure's
inputs. Those references are kept apart (up to `timed_cache_bytes`), by how often their input set came
back: a first sighting only where there is room, and an input set seen more often pushes out one seen
less (FrequentCache). They never push out a correctness check's.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from ksearch_ray.evaluation.compare import Comparison, compare_outputs
from ksearch_ray.evaluation.reference import ReferenceFailure, SandboxedReference
from ksearch_ray.models import Status
from ksearch_ray.taskspec.spec import Workload
from ksearch_ray.taskspec.task import Task

log = logging.getLogger(__name__)


@contextlib.contextmanager
def reference_precision() -> Iterator[None]:
    """References compute in true fp32: TF32 off for the duration, restored after."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.get_float32_matmul_precision())
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[0], saved[1]
        torch.set_float32_matmul_precision(saved[2])


def _nbytes(outputs: dict[str, Any]) -> int:
    return sum(t.numel() * t.element_size() for t in outputs.values() if isinstance(t, torch.Tensor))


SEEN_KEYS_KEPT = 4096
"""Input sets whose sightings FrequentCache counts (the ones seen last); only counts, no tensors."""


class FrequentCache:
    """References kept by how often their input set came back, up to `budget` bytes. A first sighting is
    kept only where there is room; to make room, entries seen fewer times than the newcomer go, the least
    recently used of the rarest first; an entry is never pushed out by one seen no more often than itself."""

    def __init__(self, budget: int):
        self.budget = budget
        self.used = 0
        self.entries: OrderedDict[tuple[Any, ...], dict[str, Any]] = OrderedDict()  # least recently used first
        self.seen: OrderedDict[tuple[Any, ...], int] = OrderedDict()

    def get(self, key: tuple[Any, ...]) -> dict[str, Any] | None:
        """The reference for `key`, if kept; counts the sighting either way."""
        self.seen[key] = self.seen.pop(key, 0) + 1
        if len(self.seen) > SEEN_KEYS_KEPT:  # forget the oldest count of an input set not kept
            old = next((k for k in self.seen if k not in self.entries), None)
            if old is not None:
                del self.seen[old]
        hit = self.entries.get(key)
        if hit is not None:
            self.entries.move_to_end(key)
        return hit

    def put(self, key: tuple[Any, ...], value: dict[str, Any], size: int) -> bool:
        """Keep `value` if it fits, by the rule above; True if kept."""
        if size > self.budget or key in self.entries:
            return False
        count = self.seen.get(key, 1)
        while self.used + size > self.budget:
            victim = min(self.entries, key=lambda k: self.seen.get(k, 0))  # min keeps the first (least recent) of equals
            if self.seen.get(victim, 0) >= count:
                return False
            self.used -= _nbytes(self.entries.pop(victim))
        self.entries[key] = value
        self.used += size
        return True

    def clear(self) -> None:
        self.entries.clear()
        self.used = 0


class Judge:
    def __init__(self, device: str, cache_bytes: int, sandboxed: Callable[[Task], SandboxedReference] | None = None,
                 *, timed_cache_bytes: int = 0):
        self.device = device
        self.cache_bytes = cache_bytes
        self.timed = FrequentCache(timed_cache_bytes)
        self._make_sandboxed = sandboxed
        self._sandboxed: dict[Path, SandboxedReference] = {}
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ksearch-judge")
        self._cache: OrderedDict[tuple[Any, ...], dict[str, Any]] = OrderedDict()
        self._cached = 0
        self._lock = threading.Lock()
        self._stream: Any = None
        self.hits = self.misses = 0  # all references; `timed_hits`: those of them kept by `timed`
        self.timed_hits = 0
        # Seconds on the judge's thread: references computed (misses), and comparisons (each synchronized on
        # its stream); what an evaluation's `judging` stage waits for, where the worker does not overlap it.
        self.reference_s = self.compare_s = 0.0

    def submit(self, task: Task, workload: Workload, seed: int, options: frozenset[str],
               outputs: dict[str, torch.Tensor], *, keep: bool = True) -> Future[Comparison]:
        """The verdict on `outputs`, computed on the judge's thread. `keep`: cache the reference with the
        correctness checks' (a seed every candidate is checked on); else it may be kept in the timed calls'
        cache (a seed that depends on how many calls the stop rule took: FrequentCache)."""
        return self._pool.submit(self._judge, task, workload, seed, options, outputs, keep)

    def prepare(self, task: Task) -> None:
        """Start `task`'s sandboxed reference worker now (on the judge's thread, beside the candidate's
        start-up), if it is untrusted and has none yet."""
        if not task.trusted:
            self._pool.submit(self._reference_worker, task)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        for worker in self._sandboxed.values():
            worker.close()
        self._sandboxed.clear()
        with self._lock:
            self._cache.clear()
            self._cached = 0
            self.timed.clear()

    # --- on the judge's thread --------------------------------------------------------------

    def _judge(self, task: Task, workload: Workload, seed: int, options: frozenset[str],
               outputs: dict[str, torch.Tensor], keep: bool = True) -> Comparison:
        try:
            with self._on_stream(), torch.no_grad():
                t0 = time.perf_counter()
                expected = self._expected(task, workload, seed, options, keep)
                self._sync()
                t1 = time.perf_counter()
                relaxed = task.definition.tolerance.relaxed_dtype_option
                verdict = compare_outputs(outputs, expected, task.definition.outputs, task.definition.tolerance,
                                          any_float_dtype=relaxed is not None and relaxed in options)
                self._sync()
                self.reference_s += t1 - t0
                self.compare_s += time.perf_counter() - t1
                return verdict
        except ReferenceFailure:
            raise  # an untrusted task's reference worker failed: not a verdict on the candidate (a SandboxError)
        except Exception as exc:  # noqa: BLE001  (the judge's boundary: out of memory, a CUDA error, a broken reference)
            log.warning("the judge failed on %s: %s", workload.name, exc, exc_info=True)
            del outputs
            self._recover()
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            return Comparison(Status.RUNTIME_ERROR, f"the judge could not check it: {type(exc).__name__}: {first[:300]}")

    def _sync(self) -> None:
        if self._stream is not None:
            self._stream.synchronize()

    def _recover(self) -> None:
        """After a failure: the cached references go, and on a GPU what the allocator holds (an
        out-of-memory error leaves it full); a CUDA error that poisoned the context stays an error."""
        with self._lock:
            self._cache.clear()
            self._cached = 0
            self.timed.clear()
        if self.device == "cuda":
            with contextlib.suppress(RuntimeError):
                torch.cuda.empty_cache()

    @contextlib.contextmanager
    def _on_stream(self) -> Iterator[None]:
        if self.device != "cuda":
            yield
            return
        if self._stream is None:
            self._stream = torch.cuda.Stream()
        with torch.cuda.stream(self._stream):
            yield
            self._stream.synchronize()  # nothing of this verdict is still running when its tensors are freed

    def _expected(self, task: Task, workload: Workload, seed: int, options: frozenset[str],
                  keep: bool = True) -> dict[str, Any]:
        key = (str(task.root), task.name, workload.model_dump_json(), seed, tuple(sorted(options)))
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
            elif not keep:
                hit = self.timed.get(key)
                self.timed_hits += hit is not None
            if hit is not None:
                self.hits += 1
                return hit
        self.misses += 1
        if task.trusted:
            inputs = task.generate_inputs(workload, seed, self.device, options)
            with reference_precision():
                expected = task.reference(inputs)
            del inputs
        else:  # the task's code runs sandboxed; only its outputs come here
            expected = self._reference_worker(task).compute(workload, seed, options)
        size = _nbytes(expected)
        if not keep:
            with self._lock:
                self.timed.put(key, expected, size)
        elif size <= self.cache_bytes:
            with self._lock:
                self._cache[key] = expected
                self._cached += size
                while self._cached > self.cache_bytes and self._cache:
                    _, old = self._cache.popitem(last=False)
                    self._cached -= _nbytes(old)
        return expected

    def _reference_worker(self, task: Task) -> SandboxedReference:
        """On the judge's thread: the sandboxed reference worker of an untrusted task, started on first use."""
        worker = self._sandboxed.get(task.root)
        if worker is None:
            if self._make_sandboxed is None:
                raise ReferenceFailure(f"task {task.name} is not one of the package's own and this judge has no "
                                       "sandbox to compute its references in")
            worker = self._sandboxed[task.root] = self._make_sandboxed(task)
        worker.ensure_started()
        return worker
