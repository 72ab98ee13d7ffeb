"""Ray for experiment grids: one local Ray that the cells' processes share, and Ray jobs on a cluster."""

from __future__ import annotations

import logging
import shlex
from collections.abc import Callable, Sequence
from typing import Any

import ray

from ksearch_ray.distributed.watchdog import guard, unguard
from ksearch_ray.run.errors import SearchError

RAY_START_ATTEMPTS = 3
"""Ray gives its node 30 seconds to start; a loaded machine can take longer now and then."""


def start_local_ray(env_vars: dict[str, str], say: Callable[[str], None], num_cpus: int | None = None) -> str:
    """A Ray of our own on this machine (never one another program left running), declaring `num_cpus` (default:
    the machine's); its address."""
    for attempt in range(1, RAY_START_ATTEMPTS + 1):
        try:
            ray.init(address="local", include_dashboard=False, logging_level=logging.WARNING,
                     runtime_env={"env_vars": env_vars}, num_cpus=num_cpus)
            break
        except Exception as exc:  # noqa: BLE001  (Ray raises a bare Exception when its node starts too slowly)
            ray.shutdown()
            say(f"Ray did not start ({str(exc)[:120]}); attempt {attempt} of {RAY_START_ATTEMPTS}")
            if attempt == RAY_START_ATTEMPTS:
                raise SearchError(f"Ray did not start on this machine: {str(exc)[:200]}") from None
    guard()  # the cluster dies with this driver, a `kill -9` included (distributed/watchdog.py)
    return str(ray.get_runtime_context().gcs_address)


def stop_ray() -> None:
    ray.shutdown()
    unguard()


class JobClient:
    """Ray jobs on a cluster, through its job submission client (`http://head:8265`)."""

    FINAL = ("SUCCEEDED", "FAILED", "STOPPED")

    def __init__(self, address: str, runtime_env: dict[str, Any] | None = None):
        from ray.job_submission import JobSubmissionClient

        self.client = JobSubmissionClient(address)
        self.runtime_env = runtime_env or None

    def submit(self, command: Sequence[str], *, gpus: float = 0) -> str:
        return str(self.client.submit_job(entrypoint=shlex.join(command), runtime_env=self.runtime_env,
                                          entrypoint_num_gpus=gpus or None))

    def status(self, job_id: str) -> str:
        return str(self.client.get_job_status(job_id)).split(".")[-1]

    def logs(self, job_id: str) -> str:
        return str(self.client.get_job_logs(job_id))
