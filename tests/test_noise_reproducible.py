"""The noise a run shows is a property of the machine and the task, not of which few measurements a
session happened to make: the real evaluation path (a sandboxed toy task on the CPU, host wall-clock
timings on a machine shared with other work) run twice shows figures within a factor of two."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_runner import ksearch as cli

from ksearch_ray.events import RunView
from ksearch_ray.measure import Noise
from ksearch_ray.store import RunStore

DATA = Path(__file__).parent / "data"


def _noise_of_a_run(tmp_path: Path, name: str) -> Noise:
    done = cli(tmp_path, "run", "--task", "toy_axpy", "--task-dir", str(DATA), "--device", "cpu", "--rounds", "1",
               "--confirm-repeats", "0", "--no-ray", "--no-progress", "--run-dir", str(tmp_path / name))
    assert done.returncode == 0, done.stdout + done.stderr
    store = RunStore.open(tmp_path / name)
    try:
        noise = RunView.of(store.read_events(), store.has_solution).noise()
    finally:
        store.close()
    assert noise is not None
    return noise


@pytest.mark.slow
def test_the_same_run_twice_shows_noise_figures_within_a_factor_of_two(tmp_path):
    first, second = _noise_of_a_run(tmp_path, "one"), _noise_of_a_run(tmp_path, "two")
    assert first.measurements >= 10 and second.measurements >= 10, (first, second)
    low, high = sorted((first.value, second.value))
    assert high < 2 * low, (first, second)
