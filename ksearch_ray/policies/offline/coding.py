"""The offline policy as coder: generate, debug, improve and evolve replies that rewrite tunables.

See `ksearch_ray.policies.offline.offline_policy` for the whole design.
"""

from __future__ import annotations

import json
from typing import Any

from ksearch_ray.models import Solution
from ksearch_ray.policies.contract import CodeReply, CodeRequest
from ksearch_ray.policies.offline.configs import (
    ActionSpec,
    Config,
    _Candidate,
    _fmt,
    _is_numeric,
    _neighbours,
    _Space,
    change_key,
    parse_action,
)
from ksearch_ray.policies.offline.model import (
    _attempt_speedups,
    _fit,
    _observations,
    _Ranked,
    _Ranker,
    _tree_speedups,
)
from ksearch_ray.taskspec.tunables import Tunable, with_values

AUTHOR = "offline-policy"


# ------------------------------------------------------------------------------------------ coding


def _cycle_space(request: CodeRequest) -> _Space:
    solutions = dict(request.solutions)
    for extra in (request.base, request.current, *(i.solution for i in request.inspirations)):
        if extra is not None:
            solutions[extra.id] = extra
    return _Space(request.tree, solutions, request.seeds)


def _cycle_tried(space: _Space, request: CodeRequest) -> set[str]:
    """A config identical to the base counts as tried: measuring it again teaches nothing."""
    sources = [request.base, request.current, *(i.solution for i in request.inspirations)] + [
        space.solutions.get(a.solution_id or "") for a in request.history
    ]
    return {c.key for s in sources if s is not None and (c := space.solution_config(s)) is not None}


def _build(
    request: CodeRequest, start: Solution, config: Config, parent_id: str | None, what: str
) -> CodeReply:
    attempt = request.earlier_attempts + len(request.history) + 1
    if request.current is not None and all(a.solution_id != request.current.id for a in request.history):
        attempt += 1
    values = config.as_dict()
    solution = Solution(
        name=f"offline-{request.node_id}-a{attempt}",
        task=start.task,
        language=start.language,
        entry_file=start.entry_file,
        entry_point=start.entry_point,
        sources=with_values(start, values),
        author=AUTHOR,
        description=f"offline-policy: {what}; seed {config.seed} with {json.dumps(values)}\n"
        + ActionSpec(config.seed, values).lines(),
        parent_id=parent_id,
    )
    return CodeReply(solution=solution)


def _generate(space: _Space, request: CodeRequest) -> CodeReply:
    node = request.tree.nodes[request.node_id]
    spec = parse_action(node.description)
    if spec is None:
        return CodeReply(
            error=f"action {node.id} has no 'tunables:' or 'seed:' line; the offline policy only changes tunables"
        )
    base_config = space.solution_config(request.base) if request.base else None
    if spec.seed is not None:
        if spec.seed not in space.seeds:
            return CodeReply(
                error=f"action {node.id} names seed {spec.seed!r}, which declares no tunables here"
            )
        start = space.seeds[spec.seed][0]
    elif request.base is not None and base_config is not None and base_config.seed is not None:
        start = request.base
    else:
        return CodeReply(
            error=f"action {node.id} changes tunables but its base solution declares none we know"
        )
    config = space.apply(space.solution_config(start), spec)
    if config is None:
        return CodeReply(error=f"action {node.id} asks for tunables or choices its seed does not declare")
    if config.key in _cycle_tried(space, request):
        return CodeReply(error=f"action {node.id} leads to a configuration already measured in this cycle")
    parent_id = request.base.id if request.base else start.id
    return _build(request, start, config, parent_id, f"implements {node.id} ({node.title})")


def _debug(space: _Space, request: CodeRequest) -> CodeReply:
    if request.current is None:
        # A valid request (contract.Debug): the failed attempt held no code (the action asked for nothing this
        # policy can write), so there is no configuration to step back from.
        return CodeReply(error="the failed attempt held no code, and the offline policy only changes the tunables of code")
    failing = space.solution_config(request.current)
    if failing is None or failing.seed is None:
        return CodeReply(error="the failing solution declares no tunables the offline policy knows")
    tried = _cycle_tried(space, request) | space.tree_tried()
    decl = space.seeds[failing.seed][1]
    values = failing.as_dict()
    base = space.solution_config(request.base) if request.base else None
    base_values = base.as_dict() if base and base.seed == failing.seed else {}
    # First undo part of what this cycle changed (one choice back), then shrink the biggest sizes.
    changed = [n for n in decl if n in base_values and base_values[n] != values[n]]
    sized = sorted(
        (n for n in decl if _is_numeric(decl[n].choices) and len(decl[n].choices) > 1),
        key=lambda n: -sorted(decl[n].choices).index(values[n]) / (len(decl[n].choices) - 1),
    )
    for name in changed + sized:
        step = _safer(decl[name], values[name], base_values.get(name))
        if step is None:
            continue
        config = Config.of(failing.seed, values | {name: step})
        if config.key not in tried:
            what = f"debug: {name} {_fmt(values[name])} → {_fmt(step)} after {request.current_result.status if request.current_result else 'a failure'}"
            return _build(request, request.current, config, request.current.id, what)
    return CodeReply(error="no untried safer configuration")


def _safer(tunable: Tunable, value: Any, base_value: Any) -> Any:
    """One choice towards smaller for sizes; one choice back towards the base value for anything else."""
    if _is_numeric(tunable.choices):
        smaller = [c for c in tunable.choices if c < value]
        return max(smaller) if smaller else None
    if base_value is None or base_value == value:
        return None
    here, there = tunable.choices.index(value), tunable.choices.index(base_value)
    return tunable.choices[here + (1 if there > here else -1)]


def _improve(space: _Space, request: CodeRequest) -> CodeReply:
    if request.current is not None and request.current_result is not None and request.current_result.passed:
        best = request.current  # the request names what to improve (in a cycle: its best passing attempt)
    else:
        passing = [
            (a.speedup or 0.0, -a.round, space.solutions[a.solution_id])
            for a in request.history
            if a.passed and a.solution_id in space.solutions
        ]
        if not passing:
            return CodeReply(error="no passing attempt in this cycle to improve on")
        best = max(passing, key=lambda p: p[:2])[2]
    config = space.solution_config(best)
    if config is None or config.seed is None:
        return CodeReply(error="the best solution declares no tunables the offline policy knows")
    steps = [c for c in _neighbours(space, request.node_id, config, seed_line=False) if not c.is_switch]
    ranked = _rank_steps(space, request, steps)
    if not ranked:
        return CodeReply(error="no untried single-tunable change remains")
    top = ranked[0]
    what = f"improve: {top.candidate.title} on top of {best.name}; {top.prediction.rationale}"
    return _build(request, best, top.candidate.config, best.id, what)


def _rank_steps(space: _Space, request: CodeRequest, steps: list[_Candidate]) -> list[_Ranked]:
    """Untried steps, best predicted first, by the model fitted to the request's attempts and tree."""
    speedups = _tree_speedups(request.tree) | _attempt_speedups(request.history)
    if request.base is not None and request.base_speedup:
        speedups[request.base.id] = request.base_speedup
    if request.current is not None and request.current_speedup:
        speedups[request.current.id] = request.current_speedup
    effects = _fit(_observations(space, request.history, speedups))
    tried = _cycle_tried(space, request) | space.tree_tried()
    return _Ranker(space, effects).rank(steps, tried)


def _evolve(space: _Space, request: CodeRequest) -> CodeReply:
    """A child of the parent (`request.current`): the best-predicted untried single-tunable mutation, or a
    crossover taking the parent's differences from an inspiration all but one at a time."""
    parent = request.current
    if parent is None:
        if not space.seeds:
            return CodeReply(error="no parent program and no seed declaring tunables: the offline policy has nothing to mutate")
        parent = space.seeds[next(iter(space.seeds))][0]
    config = space.solution_config(parent)
    if config is None or config.seed is None:
        return CodeReply(error="the parent program declares no tunables the offline policy knows")
    steps = [c for c in _neighbours(space, request.node_id, config, seed_line=False) if not c.is_switch]
    for insp in request.inspirations:
        other = space.solution_config(insp.solution)
        if other is None or other.seed != config.seed or insp.speedup is None:
            continue
        theirs = other.as_dict()
        differing = [n for n, v in config.values if theirs.get(n, v) != v]
        for left_out in differing if len(differing) > 1 else []:
            taken = {n: theirs[n] for n in differing if n != left_out}
            child = Config.of(config.seed, config.as_dict() | taken)
            steps.append(_Candidate(
                parent=request.node_id, config=child, changes=tuple(change_key(n, v) for n, v in sorted(taken.items())),
                spec=ActionSpec(None, taken), title=f"crossover with {insp.solution.name}: " + ", ".join(
                    f"{n} {_fmt(v)}" for n, v in sorted(taken.items())),
                difficulty=1, distance=len(taken), order=0,
            ))
    ranked = _rank_steps(space, request, steps)
    if not ranked:
        return CodeReply(error="no untried mutation of this parent remains")
    top = ranked[0]
    what = f"evolve: {top.candidate.title} on {parent.name}; {top.prediction.rationale}"
    return _build(request, parent, top.candidate.config, parent.id, what)
