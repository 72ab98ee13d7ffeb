"""A planner or coder that breaks its contract: what counts as a fault, and the bug report it leaves.

A policy (the offline one, the LLM one, or a user's) answers every request with its reply type; why
it has no code or no plan is the reply's `error`, never an exception. A policy that raises, or that
replies with something else, has a bug. The run must not die of it: `LlmCalls._policy_call`
(`run/llm_calls.py`) records a `PolicyFault` event, writes a bug report into the run directory's
`bugs/` and asks again (no round is spent); only `FAULT_LIMIT` faults of one role in a row stop the run (resumable, exit 3).
"""

from __future__ import annotations

import traceback
from pathlib import Path
from typing import Any

from ksearch_ray.models import Solution
from ksearch_ray.policies.contract import CodeReply, PlanReply

FAULT_LIMIT = 5
"""Faults of one role in a row (nothing answered well between) before the run stops: a bug every call hits."""
BUGS_DIR = "bugs"


def reply_problem(role: str, reply: Any) -> str | None:
    """What is wrong with a reply's shape (None: nothing); what it says is judged elsewhere."""
    want = PlanReply if role == "planner" else CodeReply
    if not isinstance(reply, want):
        return f"the {role} replied with a {type(reply).__name__}, not a {want.__name__}"
    if isinstance(reply, PlanReply) and not (isinstance(reply.ops, list) and all(isinstance(op, dict) for op in reply.ops)):
        return "the planner's ops are not a list of JSON objects"
    if isinstance(reply, CodeReply) and reply.solution is not None and not isinstance(reply.solution, Solution):
        return f"the coder's solution is a {type(reply.solution).__name__}, not a Solution"
    return None


def one_line(exc: BaseException) -> str:
    """An exception in one line; Ray's wrapper of a remote exception is read through to its cause."""
    cause = getattr(exc, "cause", None) or exc
    first = (str(cause).strip().splitlines() or [""])[0]
    return f"{type(cause).__name__}: {first}"[:300]


def write_bug_report(run_dir: Path, number: int, *, role: str, kind: str, cycle: str | None, policy: str,
                     error: str, exc: BaseException | None, request: Any) -> str:
    """bugs/<number>-<role>-<kind>.txt: what was asked, of whom, and the traceback; its path, relative."""
    folder = run_dir / BUGS_DIR
    folder.mkdir(exist_ok=True)
    path = folder / f"{number:04d}-{role}-{kind}.txt"
    lines = [f"policy: {policy}", f"role: {role}", f"call kind: {kind}", f"cycle: {cycle or '-'}",
             f"node: {getattr(request, 'node_id', None) or '-'}", f"error: {error}", ""]
    if exc is not None:
        lines += ["traceback:", "".join(traceback.format_exception(exc)).rstrip(), ""]
    current = getattr(request, "current", None)
    failure = getattr(request, "failure", None)
    lines += [f"request.current: {current.id if current is not None else None}",
              f"request.failure: round {failure.round}, {failure.kind}, code: {failure.solution is not None}"
              if failure is not None else "request.failure: None",
              f"request.history: {len(getattr(request, 'history', []) or [])} attempt(s)"]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path.relative_to(run_dir))
