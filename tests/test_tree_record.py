"""The world model's record in the run directory: deltas and checkpoints that rebuild every version exactly
as the old whole-tree snapshots held it, run directories in the old layout still open, and a writer killed
or restarted leaves a record that reads.

The real run is the offline policy on the toy task through the real engine, world model and K-Search
method in this process; the evaluators are a fake (the sandbox has tests of its own). Beside the new
record, the test writes what the old code wrote (a whole tree per version, `model_dump_json(indent=1)`,
and latest.json), and compares every version."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from cli_runner import ksearch
from local_backends import FakeEvaluators, local_search
from test_run_faults import judge

from ksearch_ray import session, tree_record
from ksearch_ray.events import RunView
from ksearch_ray.policies.offline.offline_policy import OfflinePolicy
from ksearch_ray.run import local
from ksearch_ray.run.local import LocalPolicy
from ksearch_ray.run.progress import PlainLines
from ksearch_ray.store import RunDirError, RunStore
from ksearch_ray.tree_record import RecordedTrees, TreeRecord, read_tree
from ksearch_ray.worldmodel.api import ApplyOps, Command, SelectAndLease
from ksearch_ray.worldmodel.delta import COUNTERS, TABLES
from ksearch_ray.worldmodel.ops import apply_ops
from ksearch_ray.worldmodel.select import select_and_lease
from ksearch_ray.worldmodel.tree import Tree, new_tree


def write_old_snapshot(snapshots: Path, tree: Tree) -> None:
    """What the old `RunStore.write_snapshot` wrote for every version."""
    text = tree.model_dump_json(indent=1)
    (snapshots / f"v{tree.version:05d}.json").write_text(text)
    (snapshots / "latest.json").write_text(text)


class RecordAndOldSnapshots(TreeRecord):
    """The new record, and beside it the old layout's snapshots of the same trees."""

    old_dir: Path

    def __init__(self, run_dir: Path, tree: Tree, **kw: object):
        super().__init__(run_dir, tree, **kw)  # type: ignore[arg-type]
        self.old_dir.mkdir(exist_ok=True)
        write_old_snapshot(self.old_dir, tree)

    def changed(self, tree: Tree, call: str) -> None:
        if tree.version != self.tree.version:
            write_old_snapshot(self.old_dir, tree)
        super().changed(tree, call)


def offline_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, rounds: int, width: int) -> Path:
    """A finished offline search of the toy task; returns its run directory (old snapshots in tmp_path/old)."""
    RecordAndOldSnapshots.old_dir = tmp_path / "old"
    monkeypatch.setattr(local, "TreeRecord", RecordAndOldSnapshots)
    search = local_search(tmp_path, LocalPolicy(OfflinePolicy()), LocalPolicy(OfflinePolicy()), FakeEvaluators(judge),
                          rounds=rounds, width=width, stagnation_window=2)
    try:
        session._run(search, PlainLines())
    finally:
        search.store.close()
    return tmp_path / "run"


def old_versions(old_dir: Path) -> dict[int, str]:
    return {int(p.stem[1:]): p.read_text() for p in old_dir.glob("v*.json")}


@pytest.mark.parametrize("min_delta_bytes", [1_000, tree_record.MIN_DELTA_BYTES])
def test_every_version_rebuilds_to_the_tree_the_old_snapshot_held(tmp_path, monkeypatch, min_delta_bytes):
    monkeypatch.setattr(tree_record, "MIN_DELTA_BYTES", min_delta_bytes)
    run_dir = offline_run(tmp_path, monkeypatch, rounds=40, width=4)
    old = old_versions(tmp_path / "old")
    assert len(old) > 60  # many versions: leases, outcomes, solutions, plans
    recorded = RecordedTrees(run_dir)
    assert recorded.versions() == sorted(old)
    for version, text in old.items():
        assert recorded.tree(version).model_dump_json(indent=1) == text, version
    checkpoints = list((run_dir / "world_model").glob("v*.json"))
    # the new layout keeps a checkpoint now and then, not a tree per version
    assert 2 <= len(checkpoints) < len(old) / (3 if min_delta_bytes == 1_000 else 10)
    assert not (run_dir / "world_model" / "latest.json").exists()
    assert read_tree(run_dir) == RunView.of(RunStore(run_dir).read_events(), RunStore(run_dir).has_solution).tree


def old_layout_copy(tmp_path: Path, run_dir: Path) -> Path:
    """The same run as the old code left it: a whole tree per version, and latest.json."""
    copy = tmp_path / "old_run"
    shutil.copytree(run_dir, copy)
    shutil.rmtree(copy / "world_model")
    shutil.copytree(tmp_path / "old", copy / "world_model")
    return copy


def test_a_run_directory_of_the_old_layout_opens_and_resumes_into_deltas(tmp_path, monkeypatch):
    run_dir = offline_run(tmp_path, monkeypatch, rounds=12, width=2)
    old = old_versions(tmp_path / "old")
    copy = old_layout_copy(tmp_path, run_dir)
    recorded = RecordedTrees(copy)
    assert recorded.versions() == sorted(old)
    assert all(recorded.tree(v).model_dump_json(indent=1) == text for v, text in old.items())
    for command in ("show", "report"):
        done = ksearch(tmp_path, command, str(copy))
        assert done.returncode == 0, done.stderr

    # Resumed with this code, the old run goes on as deltas after its last snapshot; every version reads.
    monkeypatch.setattr(local, "TreeRecord", TreeRecord)
    search = local_search(tmp_path, LocalPolicy(OfflinePolicy()), LocalPolicy(OfflinePolicy()), FakeEvaluators(judge),
                          run_dir=copy, rounds=20, width=2, stagnation_window=2)
    try:
        session._run(search, PlainLines())
    finally:
        search.store.close()
    after = RecordedTrees(copy)
    assert (copy / "world_model" / "deltas.jsonl").exists()
    assert after.versions()[: len(old)] == sorted(old) and len(after.versions()) > len(old)
    assert all(after.tree(v).model_dump_json(indent=1) == text for v, text in old.items())
    final = RunView.of(RunStore(copy).read_events(), RunStore(copy).has_solution).tree
    assert final is not None and after.tree() == final and final.version == after.versions()[-1]


# --------------------------------------------------------------------- a writer killed, restarted, reordered

def grown(tree: Tree, n: int, start: int = 0) -> Tree:
    for i in range(start, start + n):
        tree, report = apply_ops(tree, [{"op": "insert", "parent": "root", "title": f"idea {i}"}],
                                 solution_exists=lambda _id: True)
        assert not report.rejected
    return tree


def test_a_restarted_writer_replaces_the_versions_the_log_never_reached(tmp_path):
    """A writer killed after versions the event log never logged: the next one starts from the logged version,
    and its own later versions are the ones read, the earlier ones unchanged."""
    base = grown(new_tree("toy"), 3)
    first = TreeRecord(tmp_path, base, min_delta_bytes=10**9)
    lost = base
    for i in range(4):
        lost = grown(lost, 1, start=100 + i)
        first.changed(lost, "apply")
    first._fh.write('{"version": 99, "nodes": {"se')  # the kill, mid-line
    first._fh.flush()

    second = TreeRecord(tmp_path, base, min_delta_bytes=10**9)
    kept = base
    trees = {base.version: base}
    for i in range(2):
        kept = grown(kept, 1, start=200 + i)
        second.changed(kept, "apply")
        trees[kept.version] = kept
    recorded = RecordedTrees(tmp_path)
    assert recorded.versions() == sorted(trees)
    for version, tree in trees.items():
        assert recorded.tree(version) == tree
    assert "idea 200" in {n.title for n in recorded.tree().nodes.values()}


def test_a_reordered_table_and_a_lease_rebuild_in_their_order(tmp_path):
    tree = grown(new_tree("toy"), 3)
    record = TreeRecord(tmp_path, tree, min_delta_bytes=10**9)
    leased, _ = select_and_lease(tree, 2, "c1", now=1.0, ttl=60.0, max_difficulty=5)
    record.changed(leased, "select_and_lease")
    reordered = leased.model_copy(update={"nodes": dict(reversed(list(leased.nodes.items()))), "version": leased.version + 1})
    record.changed(reordered, "test")
    for version, want in ((leased.version, leased), (reordered.version, reordered)):
        got = read_tree(tmp_path, version)
        assert got.model_dump_json(indent=1) == want.model_dump_json(indent=1)


def test_a_line_that_is_no_json_in_the_middle_of_the_log_is_refused_in_one_line(tmp_path):
    tree = grown(new_tree("toy"), 1)
    record = TreeRecord(tmp_path, tree)
    record.changed(grown(tree, 1, start=1), "apply")
    log = tmp_path / "world_model" / "deltas.jsonl"
    lines = log.read_text().splitlines()
    log.write_text("\n".join([lines[0], "garbage", *lines[1:]]) + "\n")
    with pytest.raises(RunDirError, match="line 2 of 3 is not JSON"):
        RecordedTrees(tmp_path)


def test_a_delta_covers_every_field_of_the_tree():
    """A field added to the tree must be added to the delta too, or versions would rebuild without it."""
    assert set(Tree.model_fields) == {*TABLES, *COUNTERS, "root"}


def test_the_record_is_json_lines_a_person_can_read(tmp_path):
    tree = grown(new_tree("toy"), 1)
    record = TreeRecord(tmp_path, tree)
    record.changed(grown(tree, 1, start=1), "apply")
    record.close()
    lines = [json.loads(line) for line in (tmp_path / "world_model" / "deltas.jsonl").read_text().splitlines()]
    assert lines[0] == {"checkpoint": 1}
    assert lines[1]["call"] == "apply" and list(lines[1]["nodes"]["set"]) == ["n2"] and lines[1]["version"] == 2
    assert lines[2] == {"checkpoint": 2}


def test_set_best_leaves_the_tree_it_was_given_as_it_was():
    """The deltas find a change by the identity of what changed; an edit in place of the input's root (set_best
    did that) would change an older version and be missing from the record."""
    tree = grown(new_tree("toy"), 1)
    before = tree.model_dump_json()
    out, report = apply_ops(tree, [{"op": "set_best", "solution_id": "s1", "speedup": 1.5, "time_ms": {"w": 1.0},
                                    "baseline_ms": {"w": 1.5}}], solution_exists=lambda _id: True)
    assert not report.rejected and out.root.summary.solution_id == "s1"
    assert tree.model_dump_json() == before and out.root is not tree.root


def test_a_batch_checks_what_it_touched_not_every_lease(monkeypatch):
    """At width 1,024 every batch checked the invariants of every leased node (half a batch's time); it checks
    the items it touched and the leases it changed, as it always did for the rest of the tree."""
    from ksearch_ray.worldmodel import ops

    tree = grown(new_tree("toy"), 40)
    tree, leased = select_and_lease(tree, 30, "c1", now=1.0, ttl=60.0, max_difficulty=5)
    checked: list[set[str] | None] = []
    real = ops.check_invariants
    monkeypatch.setattr(ops, "check_invariants", lambda t, exists, only=None: (checked.append(only), real(t, exists, only)))
    tree, report = apply_ops(tree, [{"op": "update", "node": leased[0], "note": "as predicted"},
                                    {"op": "insert", "parent": "root", "title": "one more"}], solution_exists=lambda _id: True)
    assert not report.rejected
    assert len(leased) == 30 and checked == [{leased[0], "n41", "root"}]  # the root: the new action's parent


def test_the_world_model_actor_records_every_version_and_checkpoints_when_released(ray_session, tmp_path):
    """On Ray: the actor writes the record, and the driver's release has it write its last checkpoint."""
    import asyncio

    from ksearch_ray.distributed.ray_backends import RayWorldModel
    from ksearch_ray.worldmodel.state import WorldModelState

    store = RunStore.create(tmp_path / "run", {"run_id": "run"})
    try:
        start = grown(new_tree("toy"), 2)
        replica = WorldModelState(start, lambda _id: True)
        remote = RayWorldModel(store, start)
        commands: list[Command[Any]] = [ApplyOps(ops=[{"op": "insert", "parent": "root", "title": f"idea {i}"}])
                                        for i in range(5)]
        commands += [SelectAndLease(k=2, holder="c1", now=1.0, ttl=60.0, max_difficulty=5, relax_at=None)]
        trees = {start.version: start}

        async def drive() -> None:
            for command in commands:
                assert await remote.run(command) == replica.run(command)
                trees[replica.tree.version] = replica.tree
            # The actor's own per-command methods are the world model's too.
            lost = await remote.actor.release.remote(["n1"], "c9")
            assert lost == replica.release(["n1"], "c9") == ["n1"]
            trees[replica.tree.version] = replica.tree

        asyncio.run(drive())
        remote.release()
    finally:
        store.close()
    recorded = RecordedTrees(tmp_path / "run")
    assert recorded.versions() == sorted(trees)
    assert all(recorded.tree(v).model_dump_json(indent=1) == t.model_dump_json(indent=1) for v, t in trees.items())
    last = max(trees)
    assert (tmp_path / "run" / "world_model" / f"v{last:05d}.json").exists()  # the checkpoint at release
