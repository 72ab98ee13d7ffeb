"""Autotuning of passed candidates (methods/tuner.py): variants of a candidate's declared tunables,
measured before the method sees the result, in every method, replayed from the event log."""

from __future__ import annotations

import pytest
from local_backends import FakeEvaluators
from test_methods import Recording, by_tunables, run, search

from ksearch_ray.config import SearchConfig
from ksearch_ray.events import RunView
from ksearch_ray.policies.offline.offline_policy import OfflinePolicy
from ksearch_ray.taskspec.tunables import read_tunables


def values_of(s, solution_id: str) -> dict:  # type: ignore[no-untyped-def]
    return {n: t.value for n, t in read_tunables(s.store.load_solution(solution_id).sources["axpy.py"]).items()}


def test_refine_keeps_the_tuned_variant_and_spends_evaluations_not_rounds(tmp_path):
    # Larger blocks and fewer warps are faster (by_tunables); the offline coder's first candidate
    # sets BLOCK 256, and the tuner climbs from there, one choice at a time, six variants at most.
    evaluators = FakeEvaluators(by_tunables())
    s = search(tmp_path, Recording(OfflinePolicy()), evaluators, method="refine", width=1, rounds=1, autotune_variants=6)
    state = run(s)
    events = s.store.read_events()
    tunes = [e for e in events if e.kind == "tune"]
    (tuned,) = [e for e in events if e.kind == "tuned"]
    (candidate,) = [e for e in events if e.kind == "candidate"]
    assert values_of(s, candidate.solution_id) == {"BLOCK": 256, "NUM_WARPS": 4}
    assert len(tunes) == 6 and all(e.original == candidate.solution_id and e.round == 1 for e in tunes)
    assert tuned.variants == 6 and tuned.values == {"BLOCK": 1024}
    assert values_of(s, tuned.solution_id) == {"BLOCK": 1024, "NUM_WARPS": 4}
    assert tuned.speedup > tuned.speedup_before * 2
    assert state.rounds_used == 1 and state.evaluations == 1
    assert state.best is not None and state.best.solution_id == tuned.solution_id
    assert s.store.load_solution(tuned.solution_id).author == "tuner"
    # The log alone says the same: a resume sees the tuned attempt.
    replayed = RunView.of(events, s.store.has_solution)
    assert replayed.tune_evaluations == 6 and replayed.attempts[1].solution_id == tuned.solution_id
    assert replayed.attempts[1].speedup == pytest.approx(tuned.speedup)


def test_the_world_model_node_holds_the_tuned_kernel(tmp_path):
    s = search(tmp_path, Recording(OfflinePolicy()), FakeEvaluators(by_tunables()), method="ksearch", width=1, rounds=1,
               autotune_variants=2)
    run(s)
    events = s.store.read_events()
    (tuned,) = [e for e in events if e.kind == "tuned"]
    assert tuned.solution_id != tuned.original and tuned.variants == 2
    attached = [n for n in s.view.tree.nodes.values() if n.solution is not None]  # type: ignore[union-attr]
    assert [n.solution.solution_id for n in attached] == [tuned.solution_id]  # type: ignore[union-attr]
    assert "[tuned: " in s.store.load_solution(tuned.solution_id).description


def test_no_tuning_unless_asked_and_none_for_a_failed_candidate(tmp_path):
    s = search(tmp_path / "off", Recording(OfflinePolicy()), FakeEvaluators(by_tunables()), method="refine", width=1, rounds=2)
    run(s)
    assert SearchConfig.model_fields["autotune_variants"].default == 0
    assert not [e for e in s.store.read_events() if e.kind in ("tune", "tuned")]
    broken = search(tmp_path / "broken", Recording(OfflinePolicy()), FakeEvaluators(by_tunables(broken={"BLOCK": 256})),
                    method="refine", width=1, rounds=1, autotune_variants=4)
    run(broken)
    assert not [e for e in broken.store.read_events() if e.kind in ("tune", "tuned")]


def test_a_followed_log_says_what_the_tuner_changed(tmp_path):
    from ksearch_ray.report.console import event_line

    s = search(tmp_path, Recording(OfflinePolicy()), FakeEvaluators(by_tunables()), method="refine", width=1, rounds=1,
               autotune_variants=6)
    run(s)
    (tuned,) = [e for e in s.store.read_events() if e.kind == "tuned"]
    line = event_line(tuned, 3.0)
    assert line is not None and "tuned BLOCK=1024" in line and "(6 variant(s))" in line


@pytest.mark.slow
def test_the_tuner_through_the_real_stack_from_the_command_line(tmp_path):
    """`ksearch run --autotune 2 --no-ray`: the sandboxed evaluator and the offline coder; the variants are
    real evaluations of real Triton kernels (in the interpreter)."""
    from cli_runner import ksearch
    from local_backends import DATA

    from ksearch_ray.events import Tune, Tuned
    from ksearch_ray.store import RunStore

    done = ksearch(tmp_path, "run", "--task", "toy_axpy", "--task-dir", str(DATA), "--device", "cpu", "--no-ray",
                   "--from-solution", "triton_seed", "--rounds", "1", "--width", "1", "--autotune", "2",
                   "--noise-repeats", "1", "--confirm-repeats", "0", "--run-dir", "run", "--no-progress")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    events = RunStore(tmp_path / "run").read_events()
    tunes = [e for e in events if isinstance(e, Tune)]
    (tuned,) = [e for e in events if isinstance(e, Tuned)]
    assert len(tunes) == 2 == tuned.variants and all(e.result.passed for e in tunes)
    assert all(e.result.timed and e.speedup is not None for e in tunes)  # measured, side by side
    assert "tuning 2 tunable(s)" in done.stdout + done.stderr


def test_show_report_and_the_experiment_frames_find_a_tuned_best(tmp_path):
    from ksearch_ray.analysis.runs import read_runs
    from ksearch_ray.report.run_tables import Run

    s = search(tmp_path, Recording(OfflinePolicy()), FakeEvaluators(by_tunables()), method="refine", width=1, rounds=1,
               autotune_variants=6)
    state = run(s)
    best = Run.load(s.store.root).best_result()
    assert best is not None and best.solution_id == state.best.solution_id  # measured by a `tune` event
    evals, runs = read_runs([s.store.root])
    assert evals.filter(evals["kind"] == "tune").height == 6
    assert runs["best_speedup"][0] == pytest.approx(state.best.speedup)  # type: ignore[index]
