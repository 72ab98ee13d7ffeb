"""A version's change to the tree as a small JSON record, and the tree rebuilt from such records.

The run directory keeps the world model as periodic full checkpoints plus one delta per version
(`store.TreeRecord`), so that it grows with what changed, not with the size of the tree. A delta
names, per table (nodes, leases, hypotheses, questions), the items set and the ids dropped, the
root when it changed, and the counters. The edit functions never modify an item in place (they
replace what they change, and share the rest with the tree they were given), so the changed items
are the ones that are not the same object as before: finding them costs a pass over the keys, never
a serialisation of the tree.

Patching works on the tree's JSON data (`Tree.model_dump(mode="json")`), so a reader needs no
world-model logic to rebuild a version, only the tree's schema.
The order of a table's keys is part of the tree (its JSON lists items in that order), so a delta
whose table was reordered carries the new order too.
"""

from __future__ import annotations

from typing import Any

from ksearch_ray.worldmodel.tree import Tree

TABLES = ("nodes", "leases", "hypotheses", "questions")
COUNTERS = ("next_item", "next_seq", "version")


def tree_delta(old: Tree, new: Tree) -> dict[str, Any]:
    """What turns `old` into `new`, as JSON data (see `patch`)."""
    delta: dict[str, Any] = {"version": new.version}
    for name in TABLES:
        before: dict[str, Any] = getattr(old, name)
        after: dict[str, Any] = getattr(new, name)
        if before is after:
            continue
        changed = {key: item.model_dump(mode="json") for key, item in after.items() if before.get(key) is not item}
        dropped = [key for key in before if key not in after]
        if not changed and not dropped and list(before) == list(after):
            continue
        table: dict[str, Any] = {}
        if changed:
            table["set"] = changed
        if dropped:
            table["drop"] = dropped
        gone = set(dropped)
        kept_order = [key for key in before if key not in gone] + [key for key in after if key not in before]
        if kept_order != list(after):
            table["order"] = list(after)
        delta[name] = table
    if old.root is not new.root:
        delta["root"] = new.root.model_dump(mode="json")
    for name in COUNTERS:
        if getattr(old, name) != getattr(new, name):
            delta[name] = getattr(new, name)
    return delta


def patch(data: dict[str, Any], delta: dict[str, Any]) -> None:
    """Apply one delta, in place, to a tree's JSON data."""
    for name in TABLES:
        change = delta.get(name)
        if change is None:
            continue
        table: dict[str, Any] = data[name]
        for key in change.get("drop", ()):
            del table[key]
        table.update(change.get("set", {}))
        if "order" in change:
            data[name] = {key: table[key] for key in change["order"]}
    if "root" in delta:
        data["root"] = delta["root"]
    for name in COUNTERS:
        if name in delta:
            data[name] = delta[name]
