"""The world model's typed commands: what the log keeps of a command replays to the same tree and the same report."""

from __future__ import annotations

from ksearch_ray.events import WmCall, dump_event, parse_event
from ksearch_ray.worldmodel.api import ApplyOps, Expire, Release, Renew, SelectAndLease
from ksearch_ray.worldmodel.ops import InsertOp
from ksearch_ray.worldmodel.state import WorldModelState
from ksearch_ray.worldmodel.tree import new_tree


def _state() -> WorldModelState:
    return WorldModelState(new_tree("t"), lambda _id: True)


def test_a_planner_batch_read_back_from_the_log_gives_the_report_the_planner_was_given():
    """The planner left out the estimates and wrote one op badly: the live report says which defaults were
    used and why the op was rejected, and so does the replay of the logged command, word for word."""
    batch = ApplyOps(ops=[{"op": "insert", "parent": "root", "title": "tile by 64"},
                          {"op": "insert", "parent": "root", "title": "x", "difficulty": "hard"}],
                     system=False, base_version=0, max_new=3)
    assert isinstance(batch.ops[0], InsertOp) and isinstance(batch.ops[1], dict)
    live, replayed = _state(), _state()
    report = live.run(batch)
    logged = parse_event(dump_event(WmCall(command=batch)))
    assert isinstance(logged, WmCall)
    assert replayed.run(logged.command) == report
    assert replayed.tree == live.tree
    assert "defaults used" in report.results[0].notes[0] and not report.results[1].ok


def test_each_command_is_one_method_and_run_applies_it_through_that_method():
    by_method, by_command = _state(), _state()
    by_method.apply_ops([{"op": "insert", "parent": "root", "title": f"a{i}"} for i in range(3)])
    by_command.run(ApplyOps(ops=[{"op": "insert", "parent": "root", "title": f"a{i}"} for i in range(3)]))
    steps = [
        (lambda s: s.select_and_lease(2, "c1", 0.0, 10.0, max_difficulty=4, relax_at=None),
         SelectAndLease(k=2, holder="c1", now=0.0, ttl=10.0, max_difficulty=4, relax_at=None)),
        (lambda s: s.renew(["n1", "n3"], "c1", 5.0, 10.0), Renew(ids=["n1", "n3"], holder="c1", now=5.0, ttl=10.0)),
        (lambda s: s.release(["n1"], "c1"), Release(ids=["n1"], holder="c1")),
        (lambda s: s.expire(100.0), Expire(now=100.0)),
    ]
    results = []
    for method, command in steps:
        results.append(method(by_method))
        assert by_command.run(command) == results[-1]
        assert by_command.tree == by_method.tree
    assert results == [["n1", "n2"], ["n3"], [], ["n2"]]
