"""Reading a planner's JSON the way it was meant, where the intent is unambiguous.

Real models drift from a format in a few predictable ways: another wrapper (`{"ops": [...],
"actions": [...]}`), another key for the same thing (`parent_id`, `node_id`, `type`), another name
for an op (`add_action`), numbers as strings (`"3"`, `"1.3x"`), or bare action records meant as
inserts under the node being expanded. Each of these is mapped onto the op language and said in a
note; anything else is left as it is, for `apply_ops` to reject with a reason the model can read.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

OP_ALIASES = {
    "add": "insert", "add_action": "insert", "insert_action": "insert", "create": "insert", "new_action": "insert",
    "add_child": "insert", "modify": "update", "edit": "update", "update_action": "update", "set": "update",
    "too_hard": "mark_too_hard", "mark_hard": "mark_too_hard", "delete": "prune", "remove": "prune",
    "hypothesis": "add_hypothesis", "add_hypotheses": "add_hypothesis", "question": "add_question",
    "add_questions": "add_question", "note": "annotate", "comment": "annotate", "reprioritize": "reprioritise",
    "rescore": "reprioritise", "answer": "close", "resolve": "close",
}
KEY_ALIASES = {
    "parent_id": "parent", "parent_node": "parent", "parent_node_id": "parent", "node_id": "node", "id": "node",
    "target_id": "target", "difficulty_1_to_5": "difficulty", "score_0_to_1": "score", "rating_0_to_10": "rating",
    "expected_speedup_x": "expected_speedup", "speedup": "expected_speedup", "name": "title",
}
TAG_KEYS = ("op", "type", "action", "kind", "operation")
NUMBER_KEYS = ("difficulty", "score", "expected_speedup", "rating", "confidence")
TARGET_OPS = ("close", "annotate")  # they name `target`, not `node`
_NUMBER = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*x?\s*$", re.IGNORECASE)


def normalize_ops(value: Any, default_parent: str) -> tuple[Any, list[str]]:
    """(ops, notes): the reply's ops with unambiguous deviations mapped, and what was mapped."""
    notes: list[str] = []
    items: list[Any]
    if isinstance(value, Mapping):
        wrapped = [k for k in ("ops", "actions", "edits", "operations") if isinstance(value.get(k), list)]
        if wrapped:
            items = [item for k in wrapped for item in value[k]]
            if wrapped != ["ops"]:
                notes.append(f"read the lists {', '.join(wrapped)} as one list of ops")
        elif any(k in value for k in (*TAG_KEYS, "title")):
            items = [value]  # one op on its own
        else:
            return value, notes  # not ops at all: the caller says so
    elif isinstance(value, list):
        items = value
    else:
        return [value], notes
    counts: dict[str, int] = {}
    ops = [_normalize(item, default_parent, counts) for item in items]
    notes += [f"{what} ({n})" for what, n in sorted(counts.items())]
    return ops, notes


def _normalize(item: Any, default_parent: str, counts: dict[str, int]) -> Any:
    if not isinstance(item, Mapping):
        return item

    def noted(what: str) -> None:
        counts[what] = counts.get(what, 0) + 1

    op = dict(item)
    tag = next((k for k in TAG_KEYS if isinstance(op.get(k), str)), None)
    if tag is not None and tag != "op" and "op" not in op:
        op["op"] = op.pop(tag)
        noted(f'read "{tag}" as "op"')
    name = op.get("op")
    if isinstance(name, str):
        lowered = name.strip().lower()
        if lowered in OP_ALIASES:
            op["op"] = OP_ALIASES[lowered]
            noted(f'read op "{name}" as "{OP_ALIASES[lowered]}"')
        elif lowered != name:
            op["op"] = lowered
    elif "title" in op and "op" not in op:
        # A bare action record: meant as an insert under the node being expanded.
        op["op"] = "insert"
        noted(f"read bare action records as inserts under {default_parent}")
    _fix_fields(op, noted)
    if op.get("op") in TARGET_OPS and "node" in op and "target" not in op:
        op["target"] = op.pop("node")
        noted('read "node" as "target"')
    if op.get("op") == "insert" and "parent" not in op:
        op["parent"] = default_parent
        noted(f"gave inserts without a parent the parent {default_parent}")
    if isinstance(op.get("alternatives"), list):
        op["alternatives"] = [_fix_fields(dict(a), noted) if isinstance(a, Mapping) else a for a in op["alternatives"]]
    return op


def _fix_fields(op: dict[str, Any], noted: Callable[[str], None]) -> dict[str, Any]:
    """Key aliases and numbers written as text, in place."""
    for old, new in KEY_ALIASES.items():
        if old in op and new not in op:
            target = "target" if new == "node" and op.get("op") in TARGET_OPS else new
            if target not in op:
                op[target] = op.pop(old)
                noted(f'read "{old}" as "{target}"')
    for key in NUMBER_KEYS:
        value = op.get(key)
        if isinstance(value, str) and (match := _NUMBER.match(value)):
            number = float(match.group(1))
            op[key] = int(number) if key == "difficulty" and number.is_integer() else number
            noted(f"read numbers written as text ({key})")
    return op
