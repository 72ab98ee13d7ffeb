"""The offline policy improving a mistuned Triton seed by measuring it: real sandboxed evaluations of real
Triton kernels (the interpreter, on the CPU path), in one process (`run.local`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from local_backends import DATA, settings

from ksearch_ray.events import Best, Evaluation, Remeasure, Seed
from ksearch_ray.session import start
from ksearch_ray.store import RunStore
from ksearch_ray.taskspec.tunables import rewrite_tunables


def _mistuned_seed(tmp_path: Path) -> Path:
    """The toy seed with 64-element blocks, in a folder of its own (--from-solution)."""
    seed = (DATA / "toy/solutions/triton_seed/axpy.py").read_text()
    start_dir = tmp_path / "seed"
    start_dir.mkdir()
    (start_dir / "axpy.py").write_text(rewrite_tunables(seed, {"BLOCK": 64}))
    (start_dir / "solution.json").write_text((DATA / "toy/solutions/triton_seed/solution.json").read_text())
    return start_dir


@pytest.mark.slow
def test_offline_policy_improves_a_mistuned_seed_on_cpu(tmp_path):
    # The toy seed with 64-element blocks: sixteen times the interpreter's programs of its best choice.
    # The policy knows nothing of this; it must find better tunables by measuring.
    start_dir = _mistuned_seed(tmp_path)
    config = settings(task="toy_axpy", task_dirs=[str(DATA)], device="cpu", ray=False, width=2, rounds=6,
                      stagnation_window=2, from_solution=str(start_dir), run_dir=str(tmp_path / "run"), progress=False,
                      noise_repeats=2, confirm_repeats=1)
    search = start(config, progress=False)
    view = search.view
    view_dir = Path(search.store.root)
    seeded = next(e for e in RunStore(view_dir).read_events() if isinstance(e, Seed))
    assert seeded.result is not None and seeded.result.passed and seeded.speedup
    assert view.finished == "rounds" and view.rounds_used == 6
    assert view.best is not None and view.best.solution_id != seeded.solution_id
    assert view.best.speedup > 1.3 * seeded.speedup, (view.best, seeded.speedup)
    best = RunStore(view_dir).load_solution(view.best.solution_id)
    assert best.author == "offline-policy" and "offline policy" in (view_dir / "best.json").read_text()


@pytest.mark.slow
def test_screened_candidates_and_a_best_counted_only_by_the_full_rule_on_cpu(tmp_path):
    """evaluation.screen: a search's new candidates are timed by the coarser rule, the seed and the baseline by the
    full one, and a new best's speedup is the one measured again by the full rule (a `full` re-measure before it)."""
    start_dir = _mistuned_seed(tmp_path)
    config = settings(task="toy_axpy", task_dirs=[str(DATA)], device="cpu", ray=False, width=2, rounds=6,
                      stagnation_window=2, from_solution=str(start_dir), run_dir=str(tmp_path / "run"), progress=False,
                      noise_repeats=2, confirm_repeats=0, screen={"max_calls": 4, "target_rel_err": 0.5})
    search = start(config, progress=False)
    events = RunStore(Path(search.store.root)).read_events()
    full_rule, screened_rule = "or 20 calls", "or 4 calls"
    seeded = next(e for e in events if isinstance(e, Seed))
    assert seeded.result is not None and full_rule in seeded.result.timing_rule
    candidates = [e for e in events if isinstance(e, Evaluation) and e.result.passed]
    assert candidates and all(screened_rule in e.result.timing_rule for e in candidates)
    fulls = [e for e in events if isinstance(e, Remeasure) and e.role == "full"]
    assert all(full_rule in e.result.timing_rule for e in fulls)
    bests = [e for e in events if isinstance(e, Best) and e.solution_id != seeded.solution_id]
    assert bests, "the mistuned seed was never beaten"
    for best in bests:
        mine = [e for e in fulls if e.solution_id == best.solution_id]
        assert best.speedup == [e for e in mine if e.seq < best.seq][-1].speedup
        # The offline policy repeats code: the best's own code again is no new best, nor worth a full measurement.
        assert all(e.seq < best.seq for e in mine), [(e.seq, e.speedup) for e in mine]
