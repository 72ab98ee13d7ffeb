"""The evolve and refine methods: the program database, the search loop on in-process backends with the
real offline policy, resume from the event log, the evolve prompt, and the stand-in's answers to it."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest
from local_backends import FakeEvaluators, local_search, settings
from test_prompts_golden import FAST, GOLDEN, SEED, TASK, Recorder, state, timed

from ksearch_ray.config import LLMConfig
from ksearch_ray.events import Candidate, Evaluation, Resume, RunView, parse_event
from ksearch_ray.methods.evolve import Evolve
from ksearch_ray.methods.programs import ProgramDatabase, features
from ksearch_ray.methods.registry import method_for
from ksearch_ray.models import Solution, Status
from ksearch_ray.policies.contract import Attempt, CodeRequest, Inspiration
from ksearch_ray.policies.llm.llm_policy import LLMPolicy
from ksearch_ray.policies.offline.offline_policy import OfflinePolicy
from ksearch_ray.policies.standin.player import Player, section
from ksearch_ray.run.engine import Search
from ksearch_ray.store import RunStore
from ksearch_ray.taskspec.tunables import read_tunables, rewrite_tunables


class Recording:
    """A policy backend around a real policy that keeps every code request."""

    def __init__(self, policy: OfflinePolicy):
        self.policy = policy
        self.codes: list[CodeRequest] = []

    async def name(self) -> str:
        return self.policy.name

    async def plan(self, request):  # type: ignore[no-untyped-def]
        return await self.policy.plan(request)

    async def code(self, request):  # type: ignore[no-untyped-def]
        self.codes.append(request)
        return await self.policy.code(request)

    def release(self) -> None:
        pass


def by_tunables(broken: dict[str, object] | None = None):  # type: ignore[no-untyped-def]
    """Verdicts from the toy kernel's tunables: larger blocks are faster; `broken` values fail."""
    def judge(solution: Solution) -> tuple[float | None, Status, str]:
        if "axpy.py" not in solution.sources:
            return 1.0, Status.PASSED, ""  # the baseline
        values = {n: t.value for n, t in read_tunables(solution.sources["axpy.py"]).items()}
        if broken and any(values.get(k) == v for k, v in broken.items()):
            return None, Status.INCORRECT_NUMERICAL, "y: 4096 of 4096 elements outside tolerance"
        return 100.0 / float(values.get("BLOCK", 64)) + values.get("NUM_WARPS", 4) / 100.0, Status.PASSED, ""
    return judge


def search(tmp_path: Path, coder: Recording, evaluators: FakeEvaluators, **config) -> Search:  # type: ignore[no-untyped-def]
    return local_search(tmp_path, coder, coder, evaluators, **({"width": 2, "from_solution": "triton_seed"} | config))  # type: ignore[arg-type]


def run(s: Search):  # type: ignore[no-untyped-def]
    try:
        return asyncio.run(s.run())
    finally:
        s.store.close()


# --- the program database ------------------------------------------------------------------------


def test_features_place_a_rewrite_and_a_tunable_change_in_different_cells():
    founder = SEED.sources["axpy.py"]
    assert features(founder, founder) == (0, 0)
    tuned = rewrite_tunables(founder, {"BLOCK": 1024})
    rewritten = founder + "\n".join(f"# line {i}" for i in range(40))
    assert features(tuned, founder)[1] == 1  # one line changed
    assert features(rewritten, founder)[1] > features(tuned, founder)[1]


def test_the_database_keeps_the_fastest_per_cell_and_migrates_each_islands_best_along_a_ring():
    db = ProgramDatabase(islands=2)
    source = SEED.sources
    db.add("seed", "seed", source, 1.0, 0, None)
    assert [len(i.population) for i in db.islands] == [1, 1]
    fast = {"axpy.py": rewrite_tunables(source["axpy.py"], {"BLOCK": 1024})}
    slow = {"axpy.py": rewrite_tunables(source["axpy.py"], {"BLOCK": 64})}
    db.add("fast", "fast", fast, 3.0, 1, 0)
    db.add("slow", "slow", slow, 0.5, 2, 0)  # same cell as `fast`: not an elite
    db.add("broken", "broken", slow, None, 3, 1)  # failed: counted, never placed
    assert db.evaluated == 3 and "broken" not in db.programs
    assert {db.programs[i].solution_id for i in db.islands[0].grid.values()} >= {"fast"}
    assert "slow" not in db.islands[0].grid.values()
    assert db.migration_due(3) and not db.migration_due(4)
    moves = db.migrate()
    assert moves == [{"solution_id": "fast", "from": 0, "to": 1}]
    assert "fast" in db.islands[1].population and db.best(1).solution_id == "fast"  # type: ignore[union-attr]


def test_sampling_is_a_function_of_the_seed_and_shows_other_programs_than_the_parent():
    db = ProgramDatabase(islands=2)
    for i, block in enumerate([64, 128, 256, 512, 1024]):
        sources = {"axpy.py": rewrite_tunables(SEED.sources["axpy.py"], {"BLOCK": block})}
        db.add(f"p{i}", f"p{i}", sources, 1.0 + i, i + 1, i % 2)
    draws = [db.sample(0, random.Random(f"7:{r}"), 2) for r in range(20)]
    again = [db.sample(0, random.Random(f"7:{r}"), 2) for r in range(20)]
    assert [(p.solution_id, [q.solution_id for q, _ in s]) for p, s in draws] == \
           [(p.solution_id, [q.solution_id for q, _ in s]) for p, s in again]  # type: ignore[union-attr]
    for parent, shown in draws:
        assert parent is not None and all(p.solution_id != parent.solution_id for p, _ in shown)
        assert len(shown) == 2
    assert any(why.startswith("the best of island") for _, shown in draws for _, why in shown)


# --- the methods on in-process backends ------------------------------------------------------------


def test_the_read_model_files_attempts_without_a_cycle_by_round():
    events = [
        Candidate(seq=1, t=0.0, method="evolve", lane="e1", round=1, attempt_kind="evolve", solution_id="abc", island=0),
        parse_event({"seq": 2, "t": 1.0, "kind": "evaluation", "method": "evolve", "lane": "e1", "round": 1, "evaluator": 0,
                     "gpu": "cpu", "solution_id": "abc", "speedup": 1.5, "result": timed(FAST, 0.8).model_dump(mode="json")}),
    ]
    state = RunView.of(events)
    assert state.rounds_used == 1 and state.evaluations == 1 and not state.cycles
    assert state.attempts[1].speedup == 1.5 and state.attempts[1].passed


def test_evolve_spends_its_rounds_on_children_of_sampled_parents_and_beats_the_seed(tmp_path):
    coder = Recording(OfflinePolicy())
    s = search(tmp_path, coder, FakeEvaluators(by_tunables()), method="evolve", rounds=8, islands=2)
    state = run(s)
    events = s.store.read_events()
    candidates = [e for e in events if isinstance(e, Candidate)]
    assert state.finished == "rounds" and state.rounds_used == 8 and len(candidates) == 8
    assert all(c.method == "evolve" and c.island == (c.round - 1) % 2 for c in candidates)
    assert all(r.kind == "evolve" and r.current is not None for r in coder.codes)
    assert any(r.inspirations for r in coder.codes)  # once the database holds more than the seed
    seed = next(e for e in events if e.kind == "seed")
    assert state.best is not None and state.best.speedup > seed.speedup
    assert not state.cycles and len(state.tree.nodes) == 0  # type: ignore[union-attr]  (no world model)


def test_evolve_resumed_after_a_kill_evaluates_the_orphan_candidate_without_a_new_round(tmp_path):
    coder = Recording(OfflinePolicy())
    run(search(tmp_path, coder, FakeEvaluators(by_tunables()), method="evolve", rounds=4, islands=2,
               migration_interval=2))
    store = RunStore.open(tmp_path / "run")
    orphan = Solution(name="orphan", task="toy_axpy", language="triton", entry_file="axpy.py", entry_point="run",
                      sources={"axpy.py": rewrite_tunables(SEED.sources["axpy.py"], {"BLOCK": 512, "NUM_WARPS": 2})})
    store.save_solution(orphan)
    store.append(Resume())  # a session that was killed right after its candidate
    store.append(Candidate(method="evolve", lane="e1", round=5, attempt_kind="evolve", solution_id=orphan.id, island=0))
    store.close()
    evaluators = FakeEvaluators(by_tunables())
    resumed = search(tmp_path, Recording(OfflinePolicy()), evaluators, method="evolve", rounds=7, islands=2,
                     migration_interval=2)
    state = run(resumed)
    events = resumed.store.read_events()
    assert state.rounds_used == 7
    assert [e.round for e in events if isinstance(e, Candidate)] == [1, 2, 3, 4, 5, 6, 7]
    assert sorted(e.round for e in events if isinstance(e, Evaluation)) == [1, 2, 3, 4, 5, 6, 7]
    assert orphan.id in [s.id for s in evaluators.evaluated]
    assert any(e.kind == "evolve_migrate" for e in events)
    # The database rebuilt from the log equals the one the session ended with.
    method = resumed.method
    rebuilt = Evolve(2, resumed.store.load_solution)
    for event in events:
        rebuilt.observe(event)
    assert [i.population for i in rebuilt.db.islands] == [i.population for i in method.db.islands]  # type: ignore[attr-defined]
    assert [i.grid for i in rebuilt.db.islands] == [i.grid for i in method.db.islands]  # type: ignore[attr-defined]


def test_refine_debugs_a_failed_attempt_then_improves_the_best(tmp_path):
    coder = Recording(OfflinePolicy())
    # The offline policy's first step from the seed (BLOCK 128) is BLOCK 256; make that fail.
    s = search(tmp_path, coder, FakeEvaluators(by_tunables(broken={"BLOCK": 256})), method="refine", width=1, rounds=6)
    state = run(s)
    kinds = [r.kind for r in coder.codes]
    assert state.finished == "rounds" and state.rounds_used == 6
    assert kinds[0] == "improve" and "debug" in kinds
    first_debug = kinds.index("debug")
    failing = coder.codes[first_debug].current
    assert failing is not None and read_tunables(failing.sources["axpy.py"])["BLOCK"].value == 256
    assert all(r.action_text for r in coder.codes)
    later = [r for r in coder.codes[first_debug + 1:] if r.kind == "improve"]
    assert later and all(r.current is not None and r.current.id == (s.view.best.solution_id if s.view.best else None)
                         or r.current_speedup is not None for r in later)
    assert state.best is not None and state.best.node == "refine"


def test_a_coder_with_nothing_left_to_try_ends_the_run_with_a_reason(tmp_path):
    coder = Recording(OfflinePolicy())
    s = search(tmp_path, coder, FakeEvaluators(by_tunables()), method="refine", width=1, rounds=40)
    state = run(s)
    assert state.finished is not None and "no code 5 times in a row" in state.finished
    assert state.rounds_used < 40


# --- prompts and the stand-in -------------------------------------------------------------------------


def evolve_prompt() -> list[dict[str, str]]:
    tree, _ = state()
    other = Solution(name="other", task="toy_axpy", language="triton", entry_file="axpy.py", entry_point="run",
                     sources={"axpy.py": rewrite_tunables(SEED.sources["axpy.py"], {"NUM_WARPS": 8})})
    recorder = Recorder("```python\ndef run(x, a, b):\n    return a * x + b\n```")
    request = CodeRequest(
        kind="evolve", task=TASK.definition, tree=tree, node_id="root", hardware="cpu (Triton interpreter)",
        language="triton", base=FAST, base_speedup=1.25, current=FAST, current_result=timed(FAST, 0.8), current_speedup=1.25,
        history=[Attempt(round=3, kind="evolve", solution_id=FAST.id, result=timed(FAST, 0.8), speedup=1.25)], noise=0.04,
        inspirations=[Inspiration(other, 0.9, "PASSED", "the best of island 1")],
    )
    asyncio.run(LLMPolicy(LLMConfig(model="hosted_vllm/m", structured_output="off"), client=recorder).code(request))
    return recorder.messages


def test_golden_evolve_prompt():
    from golden import check_golden

    text = "\n".join(f"<<< {m['role']} >>>\n{m['content']}" for m in evolve_prompt())
    check_golden(text, GOLDEN / "evolve.txt", "evolve prompt")


def test_the_standin_answers_an_evolve_prompt_with_a_tunable_change_of_the_parent():
    messages = evolve_prompt()
    answers = [Player(seed).answer(messages, structured=False) for seed in range(12)]
    parent = {n: t.value for n, t in read_tunables(FAST.sources["axpy.py"]).items()}
    changed = 0
    for answer in answers:
        code = answer.split("```python\n", 1)[1].split("\n```", 1)[0] if "```python" in answer else None
        if code is None or "standin-breakage" in code:
            continue
        values = {n: t.value for n, t in read_tunables(code).items()}
        assert sum(values[n] != v for n, v in parent.items()) == 1, answer
        changed += 1
    assert changed >= 6
    # Now and then it takes the inspiration's value (NUM_WARPS 8).
    assert any("NUM_WARPS = 8" in a for a in answers)


def test_the_standin_reads_a_section_whose_code_has_comments_at_the_start_of_lines():
    text = "# Parent program\n\n```python\n# a comment\nX = 1\n```\n\n# Its measured results\n\nfast\n"
    assert section(text, "Parent program") == "```python\n# a comment\nX = 1\n```"
    assert section(text, "Its measured results") == "fast"


@pytest.mark.parametrize("method", ["evolve", "refine"])
def test_the_method_is_a_run_setting(method):
    config = settings(task="toy_axpy", method=method)
    assert config.search.method == method
    assert method_for(config, lambda _id: SEED).name == method
