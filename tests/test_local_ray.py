"""Which Ray a run started itself: a local one cannot grow, so a build no node can take ends the run at once."""

from __future__ import annotations

import ray

from ksearch_ray.config import RunConfig
from ksearch_ray.distributed.cluster import init_ray, started_here
from ksearch_ray.distributed.jobs import stop_ray


def test_started_here_names_only_the_ray_this_process_started_last() -> None:
    """In one process (a test worker, a notebook) a run's own local Ray may be followed by another started
    elsewhere, by a plain ray.init; that one may be a cluster's, so builds wait for its autoscaler."""
    assert not ray.is_initialized()
    init_ray(RunConfig(task="toy_axpy"))
    try:
        assert started_here()
    finally:
        stop_ray()
    assert not started_here()
    ray.init(address="local", num_cpus=1, include_dashboard=False)
    try:
        assert not started_here()
    finally:
        ray.shutdown()
