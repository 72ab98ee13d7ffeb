"""The stand-in's play: read a ksearch prompt as a planner or coder would, and answer like one.

It is an honest actor, not an oracle: it knows nothing of the task beyond the prompt. It reads the
tunables a kernel declares (`NAME = value  # tunable: [choices]`) and proposes actions that change
them, and a few risky actions whose first implementation is broken in a known way (a syntax error,
a wrong result, a crash, a hang); a debug attempt fixes the breakage. Which tunable values are
faster it never knows: the search measures. Its habits are those of real models: now and then a
reply in another JSON shape (an object holding `ops` and `actions`, `parent_id` for `parent`, bare
action records), prose without the JSON, a broken JSON block, or prose without code. Every choice
is a function of the prompt text and the stand-in's seed, so the same prompt gets the same answer.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from ksearch_ray.taskspec.tunables import TunableError, read_tunables, rewrite_tunables

VARIANT = re.compile(r"standin-variant:\s*(\{.*?\})\s*$", re.MULTILINE)
NODE_LINE = re.compile(r"^\s*(n\d+) \[(\w+)\] ", re.MULTILINE)
BREAKAGES = ("syntax", "wrong", "crash", "hang")
PERSISTENT = ("crash", "hang")
"""Breakages a debug attempt does not get rid of: some actions cannot be made to work."""


@dataclass
class Habits:
    """How often the stand-in drifts from the format, in percent of replies (deterministic per prompt)."""

    other_shape: int = 20
    prose_only: int = 8
    broken_json: int = 6
    coder_prose_only: int = 6
    breakage_actions: int = 2  # risky actions per initial plan
    risky_changes: int = 10  # changes of its own choosing (no planned action) that are broken drafts


def _roll(text: str, salt: str, seed: int) -> int:
    """0..99, the same for the same prompt, salt and seed."""
    digest = hashlib.sha256(f"{seed}:{salt}:{text}".encode()).digest()
    return int.from_bytes(digest[:4], "big") % 100


def section(text: str, heading: str) -> str:
    """The body under `# heading` up to the next top-level heading outside a fenced code block (a
    Python comment at the start of a line of code is not a heading)."""
    body: list[str] | None = None
    fence: str | None = None
    for line in text.splitlines():
        if fence is None and line.startswith("# "):
            if body is not None:
                break
            if line[2:].startswith(heading):
                body = []
                continue
        if body is not None:
            body.append(line)
        opener = re.match(r"^(`{3,})[\w+-]*\s*$", line)
        if fence is None and opener:
            fence = opener.group(1)
        elif fence is not None and line.strip() == fence:
            fence = None
    return "\n".join(body).strip() if body is not None else ""


def first_code(text: str) -> str | None:
    match = re.search(r"```(?:python|py)?\n(.*?)\n```", text, re.DOTALL)
    return match.group(1) if match else None


def focus_id(text: str, *headings: str) -> str | None:
    for heading in headings:
        body = section(text, heading)
        match = re.match(r"(n\d+|root)\b", body)
        if match:
            return match.group(1)
    return None


def _variant(action_text: str) -> dict[str, Any]:
    match = VARIANT.search(action_text)
    if not match:
        return {}
    try:
        value = json.loads(match.group(1))
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


class Player:
    def __init__(self, seed: int = 0, habits: Habits | None = None):
        self.seed = seed
        self.habits = habits or Habits()

    def answer(self, messages: list[dict[str, Any]], structured: bool) -> str:
        first = next((m["content"] for m in messages if m.get("role") == "user"), "")
        kind_match = re.search(r"^Call: (\w+)", first, re.MULTILINE)
        kind = kind_match.group(1) if kind_match else "unknown"
        reask = len([m for m in messages if m.get("role") == "user"]) > 1
        if kind in ("initialize_tree", "propose_actions", "refine", "too_hard"):
            return self._plan(kind, first, structured, reask)
        return self._code(kind, first)

    # --- planner ----------------------------------------------------------------------------------

    def _plan(self, kind: str, text: str, structured: bool, reask: bool) -> str:
        ops = {
            "initialize_tree": self._initialize, "propose_actions": self._propose,
            "refine": self._refine, "too_hard": self._too_hard,
        }[kind](text)
        if structured:
            return json.dumps({"ops": ops})
        roll = _roll(text, "plan-shape", self.seed)
        h = self.habits
        if not reask and roll < h.prose_only:
            return "I would keep tuning the block sizes and look at the memory traffic next."
        if not reask and roll < h.prose_only + h.broken_json:
            return "Edits:\n```json\n" + json.dumps(ops)[:-1] + ",]\n```"
        if not reask and roll < h.prose_only + h.broken_json + h.other_shape:
            return "Here is my plan.\n```json\n" + json.dumps(self._other_shape(ops)) + "\n```"
        return "Plan below.\n```json\n" + json.dumps(ops, indent=1) + "\n```"

    def _other_shape(self, ops: list[dict[str, Any]]) -> dict[str, Any]:
        """How other models answer: inserts as bare records in `actions`, `parent_id` for `parent`."""
        inserts = [{k: v for k, v in op.items() if k not in ("op", "parent")} for op in ops if op["op"] == "insert"]
        others = []
        for op in ops:
            if op["op"] == "insert":
                continue
            renamed = dict(op)
            if "node" in renamed:
                renamed["node_id"] = renamed.pop("node")
            others.append(renamed)
        return {"ops": others, "actions": inserts}

    def _proposals(self, code: str | None, parent: str, limit: int, *, breakages: int = 0) -> list[dict[str, Any]]:
        ops: list[dict[str, Any]] = []
        try:
            tunables = read_tunables(code or "")
        except TunableError:
            tunables = {}
        for tunable in tunables.values():
            for choice in tunable.choices:
                if choice == tunable.value or len(ops) >= limit:
                    continue
                ops.append(self._insert(parent, f"Set {tunable.name} to {choice!r}", {"set": {tunable.name: choice}},
                                        f"{tunable.name} is a tunable of this kernel; the measurements will say if {choice!r} is faster"))
        for breakage in BREAKAGES[:breakages]:
            ops.append(self._insert(parent, f"Risky rewrite ({breakage})", {"break": breakage},
                                    "a bolder restructuring; its first draft may not work"))
        return ops

    @staticmethod
    def _insert(parent: str, title: str, variant: dict[str, Any], rationale: str) -> dict[str, Any]:
        return {
            "op": "insert", "parent": parent, "title": title,
            "description": f"{title}.\nstandin-variant: {json.dumps(variant, sort_keys=True)}",
            # Bold ideas look promising before they are tried: the planner ranks them first.
            "difficulty": 2 if "break" in variant else 1, "score": 0.7 if "break" in variant else 0.6,
            "expected_speedup": 1.1, "rationale": rationale,
        }

    def _initialize(self, text: str) -> list[dict[str, Any]]:
        code = first_code(section(text, "Starting point"))
        wanted = re.search(r"Propose up to (\d+)", text)
        limit = int(wanted.group(1)) if wanted else 6
        ops = self._proposals(code, "root", limit, breakages=self.habits.breakage_actions)
        ops += [
            {"op": "update", "node": "root", "summary": "The starting kernel, as given; its tunables are untried."},
            {"op": "add_hypothesis", "text": "The tunables are far from their best values", "ref": "h"},
            {"op": "add_question", "text": "Which tunable matters most?"},
        ]
        return ops

    def _propose(self, text: str) -> list[dict[str, Any]]:
        node = focus_id(text, "Node to expand") or "root"
        return self._proposals(first_code(section(text, "Its code")), node, 4, breakages=1)

    def _refine(self, text: str) -> list[dict[str, Any]]:
        node = focus_id(text, "The action just implemented") or "root"
        evidence = section(text, "Evidence from the cycle")
        speedups = re.findall(r"([0-9.]+)x over the parent", evidence)
        rating = 7 if speedups and float(speedups[-1]) > 1.0 else 3
        ops: list[dict[str, Any]] = [
            {"op": "update", "node": node, "rating": rating, "note": f"measured {speedups[-1] if speedups else '?'}x over the parent"},
        ]
        hypotheses = re.findall(r"^(h\d+) \[open\]", section(text, "World model"), re.MULTILINE)
        if hypotheses:
            ops.append({"op": "annotate", "target": hypotheses[0], "stance": "for" if rating > 5 else "against",
                        "text": f"{node}: {speedups[-1] if speedups else '?'}x over its parent"})
        ops += self._proposals(first_code(section(text, "Best code of this action")), node, 3)
        return ops

    def _too_hard(self, text: str) -> list[dict[str, Any]]:
        node = focus_id(text, "The action that failed") or "root"
        evidence = section(text, "Evidence from the cycle")
        errors = [line.strip() for line in evidence.splitlines() if line.startswith("    ") and line.strip()]
        reason = f"the attempts failed: {errors[0][:200]}" if errors else "no attempt produced working code"
        ops: list[dict[str, Any]] = [{"op": "mark_too_hard", "node": node, "reason": reason}]
        if _roll(text, "split", self.seed) < 50:
            ops.append({"op": "split", "node": node, "reason": "smaller steps", "alternatives": [
                {"title": "A smaller first step", "description": "the same goal, one change at a time.\nstandin-variant: {}",
                 "difficulty": 1, "score": 0.3, "expected_speedup": 1.02},
            ]})
        return ops

    # --- coder ------------------------------------------------------------------------------------

    def _code(self, kind: str, text: str) -> str:
        if _roll(text, "code-shape", self.seed) < self.habits.coder_prose_only:
            return "The right approach is to restructure the loads; I will leave that for the next attempt."
        base = (first_code(section(text, "Attempt that failed")) or first_code(section(text, "Best attempt so far (passes)"))
                or first_code(section(text, "Current solution")) or first_code(section(text, "Parent program")))
        action = section(text, "Action to implement") or section(text, "Action being implemented")
        entry = re.search(r"def (\w+)\(", section(text, "Interface"))
        entry_name = entry.group(1) if entry else "run"
        if base is None:
            return "I cannot write this kernel from the specification alone without a starting point."
        source = _unbreak(base)
        # No planned action (evolve, refine, the system's "improve further"): it picks a change itself.
        own = VARIANT.search(action) is None
        variant = self._own_change(kind, text, source) if own else _variant(action)
        if variant.get("set"):
            with contextlib.suppress(TunableError):  # a tunable the code no longer has: leave it
                source = rewrite_tunables(source, variant["set"])
        breakage = variant.get("break")
        if breakage and (own or kind in ("generate_from_base", "generate_from_spec") or breakage in PERSISTENT):
            source = _break(source, breakage, entry_name)
            what = f"A draft of the risky rewrite ({breakage})."
        elif kind == "debug":
            what = "The last attempt failed; this version removes the faulty change."
        else:
            what = f"Applies {json.dumps(variant.get('set') or {})} to the current code."
        return f"{what}\n\n```python\n{source.rstrip()}\n```\n"


    def _own_change(self, kind: str, text: str, source: str) -> dict[str, Any]:
        """A change of its own: now and then a risky draft (never when debugging), else one tunable set to
        another of its choices, often one an inspiration in the prompt has."""
        try:
            tunables = read_tunables(source)
        except TunableError:
            tunables = {}
        roll = _roll(text, "own-change", self.seed)
        if kind != "debug" and roll < self.habits.risky_changes:
            return {"break": ("syntax", "wrong")[roll % 2]}
        borrowed: list[tuple[str, Any]] = []
        for code in re.findall(r"```(?:python|py)?\n(.*?)\n```", section(text, "Inspirations"), re.DOTALL):
            with contextlib.suppress(TunableError):
                borrowed += [(n, t.value) for n, t in read_tunables(code).items()
                             if n in tunables and t.value != tunables[n].value and t.value in tunables[n].choices]
        options = [(t.name, c) for t in tunables.values() for c in t.choices if c != t.value]
        pool = borrowed if borrowed and roll % 2 == 0 else options
        if not pool:
            return {}
        name, value = pool[_roll(text, "own-pick", self.seed) % len(pool)]
        return {"set": {name: value}}


BREAK_MARK = "# standin-breakage"


def _break(source: str, how: str, entry: str) -> str:
    if how == "syntax":
        return source + f"\n{BREAK_MARK}\ndef _draft(:\n    pass\n"
    body = {
        "wrong": "    out = _standin_original(*args)\n    return tuple(o * 1.5 for o in out) if isinstance(out, tuple) else out * 1.5",
        "crash": "    import os\n    os.abort()",
        "hang": "    while True:\n        pass",
    }[how]
    return source + f"\n{BREAK_MARK}\n_standin_original = {entry}\n\n\ndef {entry}(*args):\n{body}\n"


def _unbreak(source: str) -> str:
    """The code without a breakage the stand-in added to it earlier."""
    return source.split(f"\n{BREAK_MARK}\n", 1)[0] + "\n" if BREAK_MARK in source else source
