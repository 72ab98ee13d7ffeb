"""What the profile tests on the CPU (tests/test_profile.py) and on the GPU (tests/test_profile_gpu.py)
share: an evaluation to profile from, and a service on the host's loopback that counts who reached it."""

from __future__ import annotations

import socket
import threading

from ksearch_ray.models import EvalResult, Status, Timing, WorkloadResult
from ksearch_ray.taskspec.task import Task


def measured(task: Task, solution_id: str, device: str = "cpu") -> EvalResult:
    """An evaluation of the toy task to profile from: its slowest workload is n4096."""
    clock = "cuda_events" if device == "cuda" else "host_wall"

    def timing(ms: float) -> Timing:
        return Timing(mean_ms=ms, median_ms=ms, min_ms=ms, std_ms=0.0, count=3, wall_median_ms=ms, clock=clock)
    return EvalResult(solution_id=solution_id, solution_name="x", task=task.name, status=Status.PASSED,
                      workload_set="benchmarks", mode="fresh", device=device, device_name="gpu" if device == "cuda" else "cpu",
                      timed=True, workloads=[WorkloadResult(workload=w, status=Status.PASSED, timing=timing(ms))
                                             for w, ms in (("n1000", 0.01), ("n4096", 0.02))])


class Listener:
    """A service on the host's loopback that counts who reached it."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.heard = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.heard += 1
            conn.close()
