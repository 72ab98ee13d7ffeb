"""The whole K-Search loop against the LLM stand-in, in one process: litellm's real HTTP client, real
sandboxed evaluations (Triton's interpreter), a planner and coder that answer from the prompts they
get, drift from the format, hit rate limits and write broken kernels along the way."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from local_backends import settings

from ksearch_ray.analysis.replay import replay_world_model
from ksearch_ray.events import RunView
from ksearch_ray.policies.standin.player import Habits
from ksearch_ray.policies.standin.server import StandIn
from ksearch_ray.session import start
from ksearch_ray.store import RunStore
from ksearch_ray.worldmodel.tree import NodeStatus

DATA = Path(__file__).parent / "data"
PLANNER_CALLS = ("Call: refine", "Call: too_hard", "Call: propose_actions")


@pytest.mark.slow
def test_a_width_4_search_learns_from_its_failures_and_beats_its_seed(tmp_path):
    habits = Habits(other_shape=35, prose_only=12, broken_json=8, coder_prose_only=8, breakage_actions=3)
    with StandIn(seed=6, habits=habits, rate_limit_every=6) as server:
        config = settings(
            task="toy_axpy", task_dirs=[str(DATA)], model="hosted_vllm/standin", api_base=server.api_base,
            from_solution="triton_seed", width=4, rounds=18, stagnation_window=2, parent_patience=2, device="cpu",
            ray=False, backoff_base_s=0.01, timeout_s=60, limits={"idle": 5},
            noise_repeats=2, confirm_repeats=1, run_dir=str(tmp_path / "run"), progress=False,
        )
        search = start(config, progress=False)
        run_dir, state = search.store.root, search.view
        exchanges = list(server.exchanges)

    events = RunStore(run_dir).read_events()
    assert state.finished == "rounds" and state.rounds_used == 18
    cycles = {e.cycle for e in events if e.kind == "cycle_start"}
    assert len(cycles) >= 4

    # A later planner prompt shows an earlier candidate's own error text.
    failures = [e for e in events if e.kind == "evaluation" and e.result.status != "PASSED"]
    assert failures, "the stand-in's risky drafts should have failed"
    planner_prompts = [x.prompt for x in exchanges if any(call in x.prompt for call in PLANNER_CALLS)]
    shown = [f for f in failures if any(f.result.message in prompt for prompt in planner_prompts)]
    assert shown, [f.result.message for f in failures]

    # The best improves over the seed, and its node gets children of its own.
    seed = next(e for e in events if e.kind == "seed")
    assert state.best is not None and state.best.node != "root"
    assert state.best.speedup > 1.5 * seed.speedup, (state.best, seed.speedup)
    tree = state.tree
    assert tree is not None and any(n.parent == state.best.node for n in tree.nodes.values())

    # Habits of real providers met on the way and survived.
    assert any(x.status == 429 for x in exchanges)
    notes = [n for e in events if e.kind == "wm" for n in getattr(e, "notes", None) or []]
    notes += [n for e in events if e.kind in ("plan_failed", "plan_empty") for n in getattr(e, "notes", None) or []]
    assert any("read leniently" in n for n in notes) and any("asked again" in n for n in notes), notes
    assert any(n.status is NodeStatus.TOO_HARD for n in tree.nodes.values())
    assert tree.hypotheses and tree.root.summary.text

    # The world model is a function of the cached replies: a replay rebuilds it exactly.
    replayed = replay_world_model(run_dir)
    assert replayed.model_dump() == RunView.of(events, RunStore(run_dir).has_solution).tree.model_dump()
    assert json.loads((run_dir / "best.json").read_text())["policy"] == "llm: hosted_vllm/standin"


@pytest.mark.slow
def test_a_server_that_knows_nothing_of_the_formats_does_not_break_the_run(tmp_path):
    from fake_llm_server import Completion, FakeLLMServer, always

    with FakeLLMServer(always(Completion("Hello! How can I help you today?"))) as server:
        config = settings(
            task="toy_axpy", task_dirs=[str(DATA)], model="hosted_vllm/chatty", api_base=server.api_base,
            from_solution="triton_seed", width=2, rounds=4, stagnation_window=2, device="cpu", ray=False,
            backoff_base_s=0.01, noise_repeats=1, confirm_repeats=0, run_dir=str(tmp_path / "run"), progress=False,
        )
        search = start(config, progress=False)
        run_dir, state = search.store.root, search.view
    assert state.finished == "rounds" and state.rounds_used == 4
    events = RunStore(run_dir).read_events()
    assert any(e.kind == "plan_failed" and "asked again" in " ".join(e.notes) for e in events)
    assert any(n.author == "system" for n in state.tree.nodes.values())  # the coder was asked to improve the best
    assert all(e.error.startswith("unparseable coder reply") for e in events if e.kind == "candidate")


@pytest.mark.slow
def test_the_cost_budget_is_enforced_from_the_event_log(tmp_path):
    with StandIn(seed=1, habits=Habits(other_shape=0, prose_only=0, broken_json=0, coder_prose_only=0),
                 rate_limit_every=0) as server:
        config = settings(
            task="toy_axpy", task_dirs=[str(DATA)], model="hosted_vllm/standin", api_base=server.api_base,
            from_solution="triton_seed", width=1, rounds=50, device="cpu", ray=False, noise_repeats=1,
            confirm_repeats=0, price_per_mtok=(1000.0, 1000.0), max_cost_usd=5.0, run_dir=str(tmp_path / "run"),
            progress=False,
        )
        search = start(config, progress=False)
        run_dir, state = search.store.root, search.view
    events = RunStore(run_dir).read_events()
    spent = sum(e.call.cost_usd for e in events if e.kind == "llm_call")
    assert state.finished == "cost" and state.rounds_used < 50
    assert spent >= 5.0 and abs(RunView.of(events, RunStore(run_dir).has_solution).llm_cost_usd - spent) < 1e-9
    assert all(e.call.cost_known for e in events if e.kind == "llm_call")
