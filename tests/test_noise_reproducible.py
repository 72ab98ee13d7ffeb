"""The noise a run shows is a property of the machine and the task, not of which few measurements a
session happened to make: the real evaluation path (a sandboxed toy task on the CPU, host wall-clock
timings on a machine shared with other work), two sessions of the same command, show figures within a
factor of two.

The two sessions run side by side, so that they meet the same load: run one after the other on this
shared machine, they also measure how the other users' load changed between them (the toy task's
figure went from ±60 % to ±194 % between two runs a minute apart),
which no estimate can or should hide. Each measures the baseline 48 times (twice the default, about
20 s of the toy task): from the default 24, two sessions agree within 2x about nine times in ten
(test_run_noise), too often not for a test that must not be flaky; three side-by-side pairs of the
toy task at the default gave 1.7x, 1.0x and 1.6x, at 48: 1.2x, 1.1x and 1.8x. (Vectors of 4 MiB, where a
call takes milliseconds, did worse: two sessions side by side got unequal shares of the two cores,
steady 7-12 ms against 2.4-12 ms.)

Side by side is not enough on CI's two cores, where the other test worker's load can fall on one session more
than on the other (2026-12-06: ±0.27 % against ±0.68 %). So both sessions, and everything they start, share one
core: whatever else runs on it, both meet it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ksearch_ray.events import RunView
from ksearch_ray.measure import Noise
from ksearch_ray.store import RunStore

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).parent.parent


def _one_core() -> None:
    """In the child before it runs: this process and all it starts on the lowest core this test may use."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})


def _start(run_dir: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "ksearch_ray", "run", "--task", "toy_axpy", "--task-dir", str(DATA), "--device", "cpu",
         "--rounds", "1", "--confirm-repeats", "0", "--noise-repeats", "48", "--no-ray", "--no-progress",
         "--run-dir", str(run_dir)],
        cwd=run_dir.parent, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=_one_core)


def _noise(run_dir: Path) -> Noise:
    store = RunStore.open(run_dir)
    try:
        noise = RunView.of(store.read_events(), store.has_solution).noise()
    finally:
        store.close()
    assert noise is not None
    return noise


@pytest.mark.slow
def test_the_same_run_twice_shows_noise_figures_within_a_factor_of_two(tmp_path):
    runs = {name: _start(tmp_path / name) for name in ("one", "two")}
    for proc in runs.values():
        out = proc.communicate(timeout=600)[0]
        assert proc.returncode == 0, out
    first, second = (_noise(tmp_path / name) for name in runs)
    assert first.measurements >= 40 and second.measurements >= 40, (first, second)
    low, high = sorted((first.value, second.value))
    assert high < 2 * low, (first, second)
