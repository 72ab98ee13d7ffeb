"""Profiles on a real GPU with the real Nsight Compute (skipped without both).

Run by experiments/gpu/h200_profile_bests.sh on the H200: a profile of a known kernel names its kernels
with checked figures, and a candidate under the profiler is as confined as in an evaluation (it cannot
write outside its job directory, find a secret or reach the host's loopback), however it forges the
profiler's log. The same hostile candidate is profiled once with isolation off, where its writes and
its connection do get through: that is what shows the test can fail.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from profile_support import Listener, measured

from ksearch_ray.evaluation.evaluator import Evaluator
from ksearch_ray.evaluation.ncu import find_ncu
from ksearch_ray.evaluation.sandbox.isolation import Isolation
from ksearch_ray.evaluation.settings import Limits, ProfilerSettings
from ksearch_ray.taskspec.task import Task, solution_from_file

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(find_ncu() is None, reason="no Nsight Compute (ncu) here")]
DATA = Path(__file__).parent / "data"
SECRET = "sk-profile-secret-0123456789"


@pytest.fixture(scope="module")
def toy() -> Task:
    return Task.load(DATA / "toy")


def evaluator(isolation: Isolation) -> Evaluator:
    return Evaluator("cuda", limits=Limits(idle=120, hang_floor=5), isolation=isolation,
                     profiler=ProfilerSettings(timeout_s=180))


def test_a_profile_of_the_toy_baseline_names_its_kernels_with_checked_figures(toy, tmp_path):
    ev = evaluator(Isolation.REQUIRE)
    try:
        assert ev.sandbox.report.isolated
        baseline = toy.baseline()
        logs = Path(os.environ["KSEARCH_PROFILE_LOGS"]) / "toy" if os.environ.get("KSEARCH_PROFILE_LOGS") else None
        profile = ev.profile(toy, baseline, measured(toy, baseline.id, "cuda"), copy_logs_to=logs)
    finally:
        ev.close()
    assert profile.status == "ok", profile.message
    assert profile.workload == "n4096" and profile.tool.startswith("ncu ")
    assert profile.kernel_count >= 1 and profile.kernels_ms > 0
    top = profile.kernels[0]
    assert top.duration_ms > 0 and top.sm_pct is not None and top.dram_pct is not None
    assert top.occupancy_pct is not None and top.registers is not None and top.block is not None
    assert profile.rejected == 0
    # PyTorch's kernels (ncu names these without their namespaces): a known library's, so their names are shown.
    assert {k.name for k in profile.kernels} == {"vectorized_elementwise_kernel<...>"}, [k.name for k in profile.kernels]


def test_under_the_profiler_a_candidate_is_as_confined_as_in_an_evaluation(toy, tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)  # in the evaluator's environment: the sandbox must not pass it on
    host_file = tmp_path / "host.txt"
    host_file.write_text("untouched\n")
    listener = Listener()
    source = (DATA / "candidates" / "profile_escape.py").read_text().replace("@TARGET@", f"{host_file}|{listener.port}")
    path = tmp_path / "profile_escape.py"
    path.write_text(source)
    hostile = solution_from_file(path, toy)
    names = {}
    for isolation in (Isolation.REQUIRE, Isolation.OFF):
        ev = evaluator(isolation)
        try:
            profile = ev.profile(toy, hostile, measured(toy, hostile.id, "cuda"))
        finally:
            ev.close()
        assert profile.status == "ok", profile.message
        names[isolation] = [k.name for k in profile.kernels]
        if isolation is Isolation.REQUIRE:
            assert host_file.read_text() == "untouched\n" and listener.heard == 0
            # What got through is checked: the forged rows' impossible numbers and the stall name are left out,
            # the duplicate ID is dropped, the smuggled sentence (in no code) is withheld as a name.
            assert profile.kernel_count == 2 and profile.rejected >= 5
            first, second = profile.kernels
            assert first.dram_pct is None and first.sm_pct == 50 and first.registers == 32
            assert [s.reason for s in first.stalls] == ["long_scoreboard"]
            assert second.sm_pct is None and second.registers is None and second.name == "unknown_kernel_1"
    assert names[Isolation.REQUIRE][0] == "escape_w0_e0_n0"
    # With isolation off the same candidate writes the host file and reaches the listener; the secret stays
    # out of its environment either way (the sandbox scrubs it).
    assert names[Isolation.OFF][0] == "escape_w1_e0_n1"
    assert host_file.read_text() != "untouched\n" and listener.heard > 0
