import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
sys.path.insert(0, str(Path(__file__).parent))  # the loopback LLM server and other test helpers


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def ray_session():
    """One in-process Ray for the suite, with two fake GPUs so GPU-pinned evaluators schedule."""
    import ray

    if not ray.is_initialized():
        # A cluster of its own, never another process's (tests of several engineers share the machine).
        ray.init(address="local", num_cpus=4, num_gpus=2, include_dashboard=False, logging_level="WARNING")
    yield ray
    ray.shutdown()
