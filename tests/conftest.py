import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
sys.path.insert(0, str(Path(__file__).parent))  # the loopback LLM server and other test helpers


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def builder(tmp_path: Path):
    """A build worker's Builder (its own sandbox and build cache) in the test's folder."""
    from ksearch_ray.evaluation.buildcache import BuildCache
    from ksearch_ray.evaluation.builder import Builder

    b = Builder(tmp_path / "builder", BuildCache(tmp_path / "cache"))
    yield b
    b.close()


@pytest.fixture(scope="module")
def ray_session():
    """An in-process Ray for a module's tests that need one, with two fake GPUs so GPU-pinned evaluators
    schedule. Per module, and shut down after it: a Ray left running in the test process would be attached
    to by every later command-line test (as a user's `ksearch run` never is), whatever order tests run in."""
    import ray

    if not ray.is_initialized():
        # A cluster of its own, never another process's (tests of several engineers share the machine).
        ray.init(address="local", num_cpus=4, num_gpus=2, include_dashboard=False, logging_level="WARNING")
    yield ray
    ray.shutdown()


@pytest.fixture(autouse=True)
def _every_view_of_a_run_agrees(request):
    """After each test, every run directory it left in its tmp_path is read three ways (`ksearch show
    --json`, the experiment frames' run record, the HTML report): they must agree on the best, the
    outcome and the time."""
    tmp = request.getfixturevalue("tmp_path") if "tmp_path" in request.fixturenames else None
    yield
    if tmp is None:
        return
    from ksearch_ray.store import RunDirError

    for manifest in tmp.rglob("manifest.json"):
        run_dir = manifest.parent
        if not (run_dir / "events.jsonl").is_file():
            continue
        try:
            _views_agree(run_dir)
        except RunDirError:
            continue  # a run directory the test broke on purpose


def _views_agree(run_dir: Path) -> None:
    from ksearch_ray.analysis.records import read_run
    from ksearch_ray.report.html import render
    from ksearch_ray.report.run_summary import summarize
    from ksearch_ray.report.run_tables import Run

    run = Run.load(run_dir)
    shown = summarize(run, with_tree=False)
    _, record = read_run(run_dir)
    best = shown.best or {}
    assert record["best_solution_id"] == best.get("solution_id"), run_dir
    assert record["best_speedup"] == best.get("speedup"), run_dir
    assert record["finished"] == shown.finished and record["complete"] == (shown.finished is not None), run_dir
    assert record["wall_s"] == pytest.approx(shown.wall_s), run_dir
    assert record["rounds"] == shown.rounds_used and record["evaluations"] == shown.evaluations, run_dir
    _live_view_agrees(run_dir, run.view)
    html = render(run)
    if shown.finished is not None:
        assert f"finished: {shown.finished}" in html.replace("&#x27;", "'"), run_dir
    if best:
        assert f"Solution <code>{best['solution_id']}</code>" in html, run_dir


def _live_view_agrees(run_dir: Path, full) -> None:
    """A live search's view (`live=True`: the log kept on disk only, ended cycles forgotten) holds no event and tells the same outcome
    as a reader's view of the whole log."""
    from ksearch_ray.events import RunView
    from ksearch_ray.run.outcome import outcome_lines

    live = RunView(live=True)
    for event in full.events:
        live.apply(event)
    assert not live.events and not live.timeline and not live.llm_calls and not live.results_at, run_dir
    assert outcome_lines(live, run_dir) == outcome_lines(full, run_dir), run_dir
    assert (live.rounds_used, live.evaluations, live.llm_cost_usd, live.best_by_gpu, live.rows, live.llm_ledger) == \
        (full.rounds_used, full.evaluations, full.llm_cost_usd, full.best_by_gpu, full.rows, full.llm_ledger), run_dir
