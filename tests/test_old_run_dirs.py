"""Run directories written by earlier versions still open, show, report and resume.

`data/old_run_dirs/schema2_offline` is a run of the offline policy on the toy task (4 rounds, width 2) written by
the code before the world model's commands were typed (events as `{"call": "apply", "args": {...}}`), kept as it
was written except for its absolute paths (`@TESTS_DATA@`, `@RUN_DIR@`).
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

from cli_runner import ksearch
from local_backends import FakeEvaluators, ScriptedPolicy, local_search

from ksearch_ray.events import RunView, WmCall, dump_event, parse_event
from ksearch_ray.models import Status
from ksearch_ray.policies.contract import CodeReply, PlanReply
from ksearch_ray.store import RunStore
from ksearch_ray.tree_record import RecordedTrees
from ksearch_ray.worldmodel.api import ApplyOps, Expire, Release, Renew, SelectAndLease
from ksearch_ray.worldmodel.ops import AttachSolutionOp, RecordOutcomeOp
from ksearch_ray.worldmodel.tree import NodeStatus

DATA = Path(__file__).parent / "data"
SCHEMA2 = DATA / "old_run_dirs" / "schema2_offline"


def _copy(tmp_path: Path) -> Path:
    run_dir = tmp_path / "old"
    shutil.copytree(SCHEMA2, run_dir)
    manifest = run_dir / "manifest.json"
    manifest.write_text(manifest.read_text().replace("@TESTS_DATA@", str(DATA)).replace("@RUN_DIR@", str(run_dir)))
    (run_dir / "llm_cache").mkdir(exist_ok=True)  # empty, so git does not keep it
    return run_dir


def test_world_model_calls_of_an_old_run_read_as_typed_commands_and_write_back_as_they_were_written():
    lines = (SCHEMA2 / "events.jsonl").read_text().splitlines()
    calls = [parse_event(line) for line in lines if '"kind": "wm"' in line]
    assert calls and all(isinstance(e, WmCall) for e in calls)
    kinds = {type(e.command) for e in calls if isinstance(e, WmCall)}
    assert {ApplyOps, SelectAndLease, Renew} <= kinds, kinds
    first = calls[0]
    assert isinstance(first, WmCall) and isinstance(first.command, ApplyOps)
    assert isinstance(first.command.ops[0], AttachSolutionOp)  # a typed op, not a dict
    outcomes = [op for e in calls if isinstance(e, WmCall) and isinstance(e.command, ApplyOps)
                for op in e.command.ops if isinstance(op, RecordOutcomeOp)]
    assert outcomes, "the fixture's cycles recorded their outcomes"
    # The world-model calls are written back exactly as they were read (the typed commands changed no byte of
    # schema 2); every other line keeps every key and value it had, and gains only fields added since, at their
    # defaults (a Timing's host_median_ms, for one).
    for line in lines:
        back = json.loads(dump_event(parse_event(line)))
        if '"kind": "wm"' in line:
            assert back == json.loads(line), line[:200]
        else:
            _assert_kept(json.loads(line), back, line[:120])


def _assert_kept(old: object, new: object, where: str) -> None:
    if isinstance(old, dict):
        assert isinstance(new, dict), where
        for key, value in old.items():
            assert key in new, f"{where}: {key} lost"
            _assert_kept(value, new[key], f"{where} .{key}")
        assert all(new[key] is None for key in new.keys() - old.keys()), f"{where}: {sorted(new.keys() - old.keys())}"
    elif isinstance(old, list):
        assert isinstance(new, list) and len(new) == len(old), where
        for a, b in zip(old, new, strict=True):
            _assert_kept(a, b, where)
    else:
        assert new == old, f"{where}: {old!r} became {new!r}"


def test_an_old_run_directory_shows_reports_and_resumes(tmp_path):
    run_dir = _copy(tmp_path)
    events = RunStore(run_dir).read_events()
    view = RunView.of(events, RunStore(run_dir).has_solution)
    recorded = RecordedTrees(run_dir)
    # The replayed commands rebuild, version for version, the tree the old world model recorded.
    assert view.tree is not None and view.tree.version == recorded.versions()[-1]
    assert recorded.tree(view.tree.version).model_dump_json() == view.tree.model_dump_json()
    assert view.rounds_used == 4 and view.finished == "rounds"

    shown = ksearch(tmp_path, "show", str(run_dir))
    assert shown.returncode == 0, shown.stderr
    assert "finished (rounds)" in shown.stdout or "rounds" in shown.stdout
    reported = ksearch(tmp_path, "report", str(run_dir), "--out", str(tmp_path / "report.html"))
    assert reported.returncode == 0, reported.stderr + reported.stdout
    assert (tmp_path / "report.html").stat().st_size > 0

    def plan(request):
        return PlanReply(ops=[{"op": "insert", "parent": "root", "title": "unroll by two", "difficulty": 1}])

    def code(request):
        return CodeReply(error="no code this time")

    resumed = local_search(tmp_path, ScriptedPolicy(plan=plan), ScriptedPolicy(code=code),
                           FakeEvaluators(lambda solution: (1.0, Status.PASSED, "")), run_dir=run_dir, rounds=6, lease_ttl_s=3600.0)
    asyncio.run(resumed.run())
    after = RunStore(run_dir).read_events()
    new_calls = [e for e in after[len(events):] if isinstance(e, WmCall)]
    assert new_calls, "the resumed session changed the world model"
    final = RunView.of(after, RunStore(run_dir).has_solution)
    assert final.resumes == 1 and final.rounds_used == 6
    assert final.tree is not None and final.tree.version > view.tree.version
    assert RecordedTrees(run_dir).tree(final.tree.version).model_dump_json() == final.tree.model_dump_json()
    assert all(n.status is not NodeStatus.LEASED for n in final.tree.nodes.values())
    assert {type(e.command) for e in new_calls} <= {ApplyOps, SelectAndLease, Renew, Release, Expire}
