"""The offline policy improving the real TriMul Triton seed, on the CPU path (Triton interpreter)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ksearch_ray.config import RunConfig
from ksearch_ray.search.runner import start
from ksearch_ray.search.store import RunStore
from ksearch_ray.taskspec.tunables import rewrite_tunables

ROOT = Path(__file__).parent.parent


@pytest.mark.slow
def test_offline_policy_improves_a_mistuned_trimul_seed_on_cpu(ray_session, tmp_path):
    # The seed with 32x32 contraction tiles: on the smoke workload (N=48) that is four times the
    # tiles of its 64x64 default, which costs about 2x in the interpreter. The policy knows
    # nothing of this; it must find better tunables by measuring.
    seed = (ROOT / "tasks/trimul/solutions/triton_seed/submission.py").read_text()
    start_file = tmp_path / "submission.py"
    start_file.write_text(rewrite_tunables(seed, {"BLOCK_M": 32, "BLOCK_N": 32}))
    config = RunConfig(task="trimul", device="cpu", evaluator_gpus=True, width=2, rounds=10, stagnation_window=2,
                       workloads="smoke", from_solution=str(start_file), run_dir=str(tmp_path / "run"), progress=False,
                       noise_repeats=1, confirm_repeats=0)
    run_dir, state = start(config, progress=False)
    events = RunStore(run_dir).read_events()
    seeded = next(e for e in events if e["kind"] == "seed")
    assert seeded["result"]["status"] == "PASSED" and seeded["speedup"]
    assert state.finished == "rounds" and state.rounds_used == 10
    assert state.best is not None
    assert state.best["speedup"] > 1.3 * seeded["speedup"], (state.best, seeded["speedup"])
    best = RunStore(run_dir).load_solution(state.best["solution_id"])
    assert best.author == "offline-policy"
    assert "offline-policy" in (run_dir / "best.json").read_text()
