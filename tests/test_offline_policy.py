"""The offline policy against a synthetic objective: world model, cycles and learning, without an evaluator.

A fake "measurement" maps a solution's tunables to a speedup (or a failure); the tests drive the
policy through the same edit ops, selection and attach steps the search loop uses.
"""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from ksearch_ray.models import EvalResult, Solution, Status
from ksearch_ray.policies.contract import (
    Attempt,
    CodeKind,
    CodeReply,
    CodeRequest,
    PlanKind,
    PlanReply,
    PlanRequest,
)
from ksearch_ray.policies.offline.configs import parse_action
from ksearch_ray.policies.offline.offline_policy import OfflinePolicy
from ksearch_ray.taskspec.task import Task
from ksearch_ray.taskspec.tunables import read_tunables
from ksearch_ray.worldmodel.ops import apply_ops
from ksearch_ray.worldmodel.select import select_frontier
from ksearch_ray.worldmodel.tree import ROOT_ID, EvalSummary, NodeStatus, SolutionRef, Tree, new_tree

TRIMUL = Path(__file__).resolve().parent.parent / "tasks" / "trimul"
TASK = Task.load(TRIMUL).definition
SEED_SPEEDUP = 1.5

SYNTHETIC_SOURCE = '''"""A synthetic second seed: a different kernel family with its own tunables."""

TILE = 16  # tunable: [16, 32, 64]
UNROLL = 1  # tunable: [1, 2, 4]


def custom_kernel(data):
    return data
'''


def _solution(name: str, source: str, entry_file: str = "submission.py") -> Solution:
    return Solution(
        name=name,
        task="trimul",
        language="triton",
        entry_file=entry_file,
        entry_point="custom_kernel",
        sources={entry_file: source},
    )


TRITON_SEED = _solution("triton_seed", (TRIMUL / "solutions" / "triton_seed" / "submission.py").read_text())
SYNTHETIC_SEED = _solution("synthetic_seed", SYNTHETIC_SOURCE, "main.py")
SEEDS = {"triton_seed": TRITON_SEED, "synthetic_seed": SYNTHETIC_SEED}


def values_of(solution: Solution) -> dict[str, Any]:
    return {n: t.value for n, t in read_tunables(solution.sources[solution.entry_file]).items()}


def measure(solution: Solution) -> tuple[Status, float | None]:
    """The synthetic objective: big tiles and TF32 pay, 4 stages do not compile, bf16 is inaccurate."""
    v = values_of(solution)
    if "TILE" in v:
        if v["UNROLL"] == 4:
            return Status.RUNTIME_ERROR, None
        return Status.PASSED, 0.7 * {16: 1.0, 32: 1.2, 64: 1.3}[v["TILE"]] * {1: 1.0, 2: 1.05}[v["UNROLL"]]
    if v["NUM_STAGES"] == 4:
        return Status.COMPILE_ERROR, None
    if v["DOT_PRECISION"] == "bf16":
        return Status.INCORRECT_NUMERICAL, None
    speedup = SEED_SPEEDUP
    speedup *= {32: 0.9, 64: 1.0, 128: 1.25}[v["BLOCK_M"]]
    speedup *= {32: 0.85, 64: 1.0, 128: 1.1}[v["BLOCK_N"]]
    speedup *= {"ieee": 1.0, "tf32": 1.3, "tf32x3": 1.1}[v["DOT_PRECISION"]]
    speedup *= {4: 1.0, 8: 1.05}[v["NUM_WARPS"]]
    speedup *= {2: 0.95, 3: 1.0}[v["NUM_STAGES"]]
    speedup *= {32: 0.97, 64: 1.0, 128: 1.02}[v["GATE_BLOCK_ROWS"]]
    return Status.PASSED, speedup


def evaluate(solution: Solution) -> tuple[EvalResult, float | None]:
    status, speedup = measure(solution)
    message = {Status.COMPILE_ERROR: "out of resources: shared memory"}.get(status, "")
    result = EvalResult(
        solution_id=solution.id,
        solution_name=solution.name,
        task="trimul",
        status=status,
        message=message,
        workload_set="synthetic",
        mode="fresh",
        device="cpu",
    )
    return result, speedup


def config_key(solution: Solution, seeds: dict[str, Solution] = SEEDS) -> str:
    """The test's own notion of a config: which seed family, and the tunable values."""
    v = values_of(solution)
    family = next(name for name, seed in seeds.items() if set(values_of(seed)) == set(v))
    return json.dumps([family, sorted(v.items())])


def plan(policy: OfflinePolicy, kind: PlanKind, tree: Tree, **kw: Any) -> PlanReply:
    request = PlanRequest(
        kind=kind, task=TASK, tree=tree, hardware="H200", language="triton", seeds=SEEDS, **kw
    )
    return asyncio.run(policy.plan(request))


def code(policy: OfflinePolicy, kind: CodeKind, tree: Tree, node_id: str, **kw: Any) -> CodeReply:
    request = CodeRequest(
        kind=kind,
        task=TASK,
        tree=tree,
        node_id=node_id,
        hardware="H200",
        language="triton",
        seeds=SEEDS,
        **kw,
    )
    return asyncio.run(policy.code(request))


def attach_op(node: str, solution: Solution, speedup: float) -> dict[str, Any]:
    summary = EvalSummary(status=Status.PASSED, speedup=speedup, latency_ms=1.0 / speedup)
    return {
        "op": "attach_solution",
        "node": node,
        "solution_id": solution.id,
        "evaluation": summary.model_dump(),
    }


@dataclass
class Search:
    """The state a search loop keeps, driven by hand: the tree and the solution store."""

    policy_factory: Any = OfflinePolicy
    tree: Tree = field(default_factory=lambda: new_tree("trimul"))
    store: dict[str, Solution] = field(default_factory=lambda: dict((s.id, s) for s in SEEDS.values()))
    round: int = 0
    transcript: list[str] = field(default_factory=list)  # every reply, for comparing runs

    def seeded(self) -> Search:
        ref = SolutionRef(
            solution_id=TRITON_SEED.id, evaluation=EvalSummary(status=Status.PASSED, speedup=SEED_SPEEDUP)
        )
        self.tree = new_tree("trimul", seed=ref)
        return self

    def apply(self, ops: list[dict[str, Any]]) -> list[str]:
        self.tree, report = apply_ops(self.tree, ops, solution_exists=lambda i: i in self.store)
        assert not report.rejected, report.render()
        return [i for r in report.results for i in r.created]

    def plan(self, kind: PlanKind, **kw: Any) -> list[str]:
        reply = plan(self.policy_factory(), kind, self.tree, solutions=dict(self.store), **kw)
        assert reply.error is None, reply.error
        self.transcript.append(json.dumps(reply.ops, sort_keys=True))
        return self.apply(reply.ops)

    def cycle(self, node_id: str, max_attempts: int = 3) -> list[Attempt]:
        """One action cycle: generate, then improve after a pass or debug after a failure."""
        node = self.tree.nodes[node_id]
        parent = self.tree.get(node.parent)
        assert parent is not None
        base = self.store[parent.solution.solution_id] if parent.solution else None
        base_speedup = parent.solution.evaluation.speedup if parent.solution else None
        history: list[Attempt] = []
        cycle_solutions: dict[str, Solution] = {}
        seen = {config_key(base)} if base else set()
        current, result = None, None
        for index in range(max_attempts):
            kind: CodeKind = (
                ("generate_from_base" if base else "generate_from_spec")
                if index == 0
                else ("improve" if history[-1].passed else "debug")
            )
            reply = code(
                self.policy_factory(),
                kind,
                self.tree,
                node_id,
                base=base,
                base_speedup=base_speedup,
                current=current,
                current_result=result,
                history=list(history),
                solutions=dict(cycle_solutions),
            )
            self.transcript.append(repr(reply))
            if reply.solution is None:
                break
            current = reply.solution
            assert config_key(current) not in seen, "the same configuration twice in one cycle"
            seen.add(config_key(current))
            self.store[current.id] = cycle_solutions[current.id] = current
            self.round += 1
            result, speedup = evaluate(current)
            history.append(Attempt(self.round, kind, current.id, result=result, speedup=speedup))
        passing = [a for a in history if a.passed]
        if passing:
            best = max(passing, key=lambda a: (a.speedup or 0.0, -a.round))
            self.apply([attach_op(node_id, self.store[best.solution_id or ""], best.speedup or 1.0)])
            self.plan("refine", node_id=node_id, attempts=history)
        else:
            self.plan("too_hard", node_id=node_id, attempts=history)
            assert self.tree.nodes[node_id].status is NodeStatus.TOO_HARD
        return history

    def step(self, max_attempts: int = 3) -> bool:
        ids = select_frontier(self.tree, 1)
        if not ids:
            self.plan("propose_actions", max_actions=6)
            ids = select_frontier(self.tree, 1)
        if not ids:
            return False
        self.cycle(ids[0], max_attempts)
        return True

    def node_titled(self, title: str, parent: str = ROOT_ID) -> str:
        return next(n.id for n in self.tree.children(parent) if n.title == title)

    def best_speedup(self) -> float:
        done = [n.solution.evaluation.speedup or 0.0 for n in self.tree.nodes.values() if n.solution]
        return max(done, default=SEED_SPEEDUP)

    def tried_configs(self) -> set[str]:
        """Every config the tree holds, computed by the test: measured solutions and planned actions."""
        keys = {config_key(TRITON_SEED)}
        for node in self.tree.nodes.values():
            keys.add(self.action_config(node.id))
            if node.solution:
                keys.add(config_key(self.store[node.solution.solution_id]))
        return keys

    def action_config(self, node_id: str) -> str:
        """The config an action asks for: its parent's measured tunables, or its seed's, plus its change."""
        node = self.tree.nodes[node_id]
        spec = parse_action(node.description)
        assert spec is not None, node.description
        if spec.seed:
            family, start = spec.seed, values_of(SEEDS[spec.seed])
        else:
            parent = self.tree.get(node.parent)
            assert parent is not None and parent.solution is not None
            solution = self.store[parent.solution.solution_id]
            family, start = json.loads(config_key(solution))[0], values_of(solution)
        return json.dumps([family, sorted((start | spec.tunables).items())])


# --------------------------------------------------------------------------------------------- tests


def test_name_says_offline_policy_and_not_an_llm() -> None:
    assert OfflinePolicy.name == "offline policy (tunable search, no LLM)"
    assert "offline policy" in OfflinePolicy().name


def test_initialize_inserts_single_tunable_steps_and_a_seed_switch_that_all_apply() -> None:
    search = Search().seeded()
    created = search.plan("initialize_tree", max_actions=12)
    nodes = [search.tree.nodes[i] for i in created]
    assert len(nodes) == 12
    few = Search().seeded()
    assert len(few.plan("initialize_tree", max_actions=4)) == 4  # never more than the request allows
    titles = [n.title for n in nodes]
    assert "BLOCK_M 64 → 128" in titles
    assert "switch to seed synthetic_seed" in titles
    seed_values = values_of(TRITON_SEED)
    for node in nodes:
        spec = parse_action(node.description)
        assert spec is not None
        if spec.seed is None:
            ((name, value),) = spec.tunables.items()
            assert seed_values[name] != value
            assert node.difficulty == 1
        else:
            assert node.difficulty == 2
        assert 0.0 <= node.score <= 1.0
    assert len({search.action_config(n.id) for n in nodes}) == len(nodes)
    # With no evidence at all, every change carries the neutral prior.
    assert {n.expected_speedup for n in nodes} == {1.02}
    assert all("neutral prior" in n.rationale for n in nodes)


def test_without_a_root_solution_the_search_starts_from_the_first_seed_by_name() -> None:
    search = Search()  # root without a solution
    created = search.plan("initialize_tree", max_actions=12)
    first = search.tree.nodes[created[0]]
    spec = parse_action(first.description)
    assert spec is not None and spec.seed == "synthetic_seed"
    reply = code(OfflinePolicy(), "generate_from_spec", search.tree, first.id)
    assert reply.solution is not None
    assert values_of(reply.solution) == values_of(SYNTHETIC_SEED) | spec.tunables
    assert "synthetic_seed" in reply.solution.description


def test_generated_code_changes_only_the_action_tunable_and_records_its_lineage() -> None:
    search = Search().seeded()
    search.plan("initialize_tree", max_actions=12)
    node_id = search.node_titled("BLOCK_M 64 → 128")
    reply = code(
        OfflinePolicy(), "generate_from_base", search.tree, node_id, base=TRITON_SEED, base_speedup=1.5
    )
    solution = reply.solution
    assert solution is not None
    assert values_of(solution) == values_of(TRITON_SEED) | {"BLOCK_M": 128}
    assert solution.parent_id == TRITON_SEED.id
    assert solution.author == "offline-policy"
    assert solution.name == f"offline-{node_id}-a1"
    # Blank lines are left out of the comparison: rewrite_tunables drops a blank line that follows a
    # tunable line (its pattern ends in \s*$), which changes nothing the code does.
    old_lines, new_lines = (
        [line for line in s.sources["submission.py"].splitlines() if line.strip()]
        for s in (TRITON_SEED, solution)
    )
    changed = [(a, b) for a, b in zip(old_lines, new_lines, strict=True) if a != b]
    # Only tunable lines differ: BLOCK_M's value, and the others written back in one canonical form,
    # so that one config always has one source text (and one content hash).
    assert changed and all("# tunable:" in a and "# tunable:" in b for a, b in changed)
    assert ("BLOCK_M = 64  # tunable: [32, 64, 128]", "BLOCK_M = 128  # tunable: [32, 64, 128]") in changed
    assert all("# tunable:" in b for _, b in changed)


def test_seed_switch_action_writes_code_from_that_seed() -> None:
    search = Search().seeded()
    search.plan("initialize_tree", max_actions=12)
    node_id = search.node_titled("switch to seed synthetic_seed")
    reply = code(
        OfflinePolicy(), "generate_from_base", search.tree, node_id, base=TRITON_SEED, base_speedup=1.5
    )
    assert reply.solution is not None
    assert reply.solution.entry_file == "main.py"
    assert values_of(reply.solution) == values_of(SYNTHETIC_SEED)
    assert reply.solution.parent_id == TRITON_SEED.id


def test_propose_never_repeats_a_tried_config() -> None:
    search = Search().seeded()
    search.plan("initialize_tree", max_actions=12)
    for _ in range(6):
        assert search.step()
    tried = search.tried_configs()
    before = set(search.tree.nodes)
    created = search.plan("propose_actions", max_actions=100)
    assert created, "a partly explored space still has untried neighbours"
    proposed = [search.action_config(i) for i in created]
    assert not set(proposed) & tried
    assert len(set(proposed)) == len(proposed)
    assert all(
        search.tree.nodes[i].parent in {ROOT_ID} | {n for n in before if search.tree.nodes[n].solution}
        for i in created
    )


def test_debug_steps_to_a_safer_untried_config_after_a_compile_failure() -> None:
    search = Search().seeded()
    search.plan("initialize_tree", max_actions=12)
    node_id = search.node_titled("NUM_STAGES 3 → 4")
    policy = OfflinePolicy()
    first = code(
        policy, "generate_from_base", search.tree, node_id, base=TRITON_SEED, base_speedup=1.5
    ).solution
    assert first is not None
    result, _ = evaluate(first)
    assert result.status is Status.COMPILE_ERROR
    history = [Attempt(1, "generate_from_base", first.id, result=result)]
    solutions, current = {first.id: first}, first
    seen = {config_key(TRITON_SEED), config_key(first)}
    for index in range(2, 7):
        reply = code(
            policy,
            "debug",
            search.tree,
            node_id,
            base=TRITON_SEED,
            base_speedup=1.5,
            current=current,
            current_result=result,
            history=list(history),
            solutions=dict(solutions),
        )
        fixed = reply.solution
        assert fixed is not None, reply.error
        assert config_key(fixed) not in seen
        seen.add(config_key(fixed))
        old, new = values_of(current), values_of(fixed)
        moved = {n for n in old if old[n] != new[n]}
        assert len(moved) == 1  # one step at a time
        (name,) = moved
        assert new[name] < old[name]  # towards smaller: fewer stages, smaller tiles
        result, speedup = evaluate(fixed)
        history.append(Attempt(index, "debug", fixed.id, result=result, speedup=speedup))
        solutions[fixed.id], current = fixed, fixed


def test_debug_reports_when_no_untried_safer_config_remains() -> None:
    tiny = _solution(
        "tiny_seed", "BLOCK = 64  # tunable: [32, 64]\n\ndef custom_kernel(data):\n    return data\n"
    )
    seeds = {"tiny_seed": tiny}
    tree = new_tree(
        "tiny",
        seed=SolutionRef(solution_id=tiny.id, evaluation=EvalSummary(status=Status.PASSED, speedup=1.0)),
    )
    reply = asyncio.run(
        OfflinePolicy().plan(
            PlanRequest(
                kind="initialize_tree",
                task=TASK,
                tree=tree,
                hardware="H200",
                language="triton",
                solutions={tiny.id: tiny},
                seeds=seeds,
            )
        )
    )
    tree, _ = apply_ops(tree, reply.ops, solution_exists=lambda i: i == tiny.id)
    (node_id,) = tree.nodes

    def request(kind: CodeKind, **kw: Any) -> CodeRequest:
        return CodeRequest(
            kind=kind,
            task=TASK,
            tree=tree,
            node_id=node_id,
            hardware="H200",
            language="triton",
            base=tiny,
            base_speedup=1.0,
            seeds=seeds,
            **kw,
        )

    failing = asyncio.run(OfflinePolicy().code(request("generate_from_base"))).solution
    assert failing is not None
    result = EvalResult(
        solution_id=failing.id,
        solution_name=failing.name,
        task="tiny",
        status=Status.COMPILE_ERROR,
        workload_set="synthetic",
        mode="fresh",
        device="cpu",
    )
    debugged = asyncio.run(
        OfflinePolicy().code(
            request(
                "debug",
                current=failing,
                current_result=result,
                history=[Attempt(1, "generate_from_base", failing.id, result=result)],
                solutions={failing.id: failing},
            )
        )
    )
    assert debugged.solution is None
    assert debugged.error == "no untried safer configuration"


def test_improve_adds_the_best_predicted_untried_change() -> None:
    search = Search().seeded()
    search.plan("initialize_tree", max_actions=12)
    # Evidence: TF32 in the contraction paid 1.3x, BLOCK_N 32 lost; single-attempt cycles keep it clean.
    search.cycle(search.node_titled("DOT_PRECISION ieee → tf32"), max_attempts=1)
    search.cycle(search.node_titled("BLOCK_N 64 → 32"), max_attempts=1)
    # Refine planned TF32 + BLOCK_M 128 as a node of its own, so the cycle takes another action.
    node_id = search.node_titled("NUM_WARPS 4 → 8")
    policy = OfflinePolicy()
    first = code(
        policy, "generate_from_base", search.tree, node_id, base=TRITON_SEED, base_speedup=1.5
    ).solution
    assert first is not None
    result, speedup = evaluate(first)
    history = [Attempt(1, "generate_from_base", first.id, result=result, speedup=speedup)]
    reply = code(
        policy,
        "improve",
        search.tree,
        node_id,
        base=TRITON_SEED,
        base_speedup=1.5,
        current=first,
        current_result=result,
        history=history,
        solutions={first.id: first},
    )
    better = reply.solution
    assert better is not None
    assert values_of(better) == values_of(first) | {"DOT_PRECISION": "tf32"}
    assert config_key(better) not in search.tried_configs()
    assert better.parent_id == first.id
    assert "1.30× over its parent" in better.description

    result2, speedup2 = evaluate(better)
    history.append(Attempt(2, "improve", better.id, result=result2, speedup=speedup2))
    again = code(
        policy,
        "improve",
        search.tree,
        node_id,
        base=TRITON_SEED,
        base_speedup=1.5,
        current=better,
        current_result=result2,
        history=history,
        solutions={first.id: first, better.id: better},
    ).solution
    assert again is not None
    assert again.parent_id == better.id  # builds on the best passing attempt of the cycle
    changed = {n: v for n, v in values_of(again).items() if values_of(better)[n] != v}
    assert changed != {"BLOCK_N": 32}  # measured to lose: an unmeasured change ranks above it
    assert len(changed) == 1
    assert config_key(again) not in search.tried_configs()


def test_refine_carries_a_measured_gain_to_the_next_steps() -> None:
    search = Search().seeded()
    search.plan("initialize_tree", max_actions=12)
    block_m = search.node_titled("BLOCK_M 64 → 128")
    search.cycle(block_m, max_attempts=1)
    tf32 = search.node_titled("DOT_PRECISION ieee → tf32")
    search.cycle(tf32, max_attempts=1)
    children = search.tree.children(tf32)
    assert 1 <= len(children) <= 3
    assert children[0].title == "BLOCK_M 64 → 128"
    assert children[0].expected_speedup > 1.1
    assert f"over its parent in {block_m}" in children[0].rationale
    # The root's other open steps now start below the best solution, so they rank below the child.
    assert all(
        n.score < children[0].score for n in search.tree.children(ROOT_ID) if n.status is NodeStatus.OPEN
    )


def test_too_hard_marks_the_action_and_lowers_open_actions_making_the_same_change() -> None:
    search = Search().seeded()
    search.plan("initialize_tree", max_actions=12)
    block_m = search.node_titled("BLOCK_M 64 → 128")
    search.cycle(block_m, max_attempts=1)
    search.plan("propose_actions", max_actions=100)
    twin = search.node_titled("NUM_STAGES 3 → 4", parent=block_m)
    other = search.node_titled("NUM_WARPS 4 → 8", parent=block_m)
    before = search.tree.model_copy(deep=True)
    stages = search.node_titled("NUM_STAGES 3 → 4")
    search.cycle(stages, max_attempts=1)  # fails to compile: too_hard
    assert search.tree.nodes[stages].status is NodeStatus.TOO_HARD
    assert "COMPILE_ERROR" in search.tree.nodes[stages].notes[-1].text
    assert search.tree.nodes[twin].score < before.nodes[twin].score
    assert search.tree.nodes[twin].expected_speedup < 1.0
    assert search.tree.nodes[other].score == before.nodes[other].score


def test_search_beats_the_seed_within_fifteen_cycles() -> None:
    search = Search().seeded()
    search.plan("initialize_tree", max_actions=12)
    for _ in range(15):
        assert search.step()
    # The three big effects (BLOCK_M 128: 1.25x, TF32: 1.3x, BLOCK_N 128: 1.1x) found and combined,
    # past a configuration that does not compile.
    assert search.best_speedup() >= SEED_SPEEDUP * 1.25 * 1.3 * 1.1
    assert any(n.status is NodeStatus.TOO_HARD for n in search.tree.nodes.values())
    assert search.round <= 45


def test_replies_are_deterministic_and_do_not_depend_on_instance_state() -> None:
    shared = OfflinePolicy()
    one = Search(policy_factory=lambda: shared).seeded()  # one instance serves every call
    two = Search(policy_factory=OfflinePolicy).seeded()  # a fresh instance for every call
    for search in (one, two):
        search.plan("initialize_tree", max_actions=12)
        for _ in range(8):
            assert search.step()
    assert one.transcript == two.transcript
    assert one.tree.model_dump_json() == two.tree.model_dump_json()
    # The same request twice, to a used instance and a fresh one, gets the same reply.
    again = [
        plan(p, "propose_actions", one.tree, solutions=dict(one.store), max_actions=5).ops
        for p in (shared, shared, OfflinePolicy())
    ]
    assert again[0] == again[1] == again[2]


@pytest.mark.parametrize("kind", ["initialize_tree", "propose_actions"])
def test_scores_are_a_monotone_map_of_predicted_gain(kind: PlanKind) -> None:
    search = Search().seeded()
    search.plan("initialize_tree", max_actions=12)
    search.cycle(search.node_titled("BLOCK_N 64 → 128"), max_attempts=1)
    search.cycle(search.node_titled("BLOCK_M 64 → 32"), max_attempts=1)
    ops = plan(OfflinePolicy(), kind, search.tree, solutions=dict(search.store), max_actions=30).ops
    by_parent: dict[str, list[tuple[float, float]]] = {}
    for op in ops:
        by_parent.setdefault(op["parent"], []).append((op["expected_speedup"], op["score"]))
    for pairs in by_parent.values():
        pairs.sort()
        assert [s for _, s in pairs] == sorted(s for _, s in pairs)
        assert all(0.0 <= s <= 1.0 and math.isfinite(e) and e > 0 for e, s in pairs)


def test_cxx_tunables_are_read_in_order_and_rewritten_in_place() -> None:
    from ksearch_ray.taskspec.tunables import TunableError, rewrite_tunables

    source = (
        "#include <cstdint>\n"
        "constexpr int kTileN = 32;  // tunable: [8, 16, 32]\n"
        "  static constexpr float kScale = 0.5;  // tunable: [0.25, 0.5]\n"
        "constexpr int kFixed = 3;\n"
    )
    declared = read_tunables(source)
    assert list(declared) == ["kTileN", "kScale"]
    assert declared["kTileN"].value == 32 and declared["kTileN"].choices == (8, 16, 32)
    rewritten = rewrite_tunables(source, {"kTileN": 8, "kScale": 0.25})
    assert "constexpr int kTileN = 8;  // tunable: [8, 16, 32]" in rewritten
    assert "  static constexpr float kScale = 0.25;  // tunable: [0.25, 0.5]" in rewritten
    assert rewritten.replace("= 8;", "= 32;").replace("= 0.25;", "= 0.5;") == source
    with pytest.raises(TunableError, match="numbers only"):
        read_tunables("constexpr bool kFast = True;  // tunable: [True, False]\n")
