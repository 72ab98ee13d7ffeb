"""The run directory grows linearly: a shortened `experiments/wm_soak.py` (the real engine, world model and
K-Search method in this process, instant policies, fake evaluators) stays within issue 42's 50 KB a round,
and the world model's record weighs no more than the event log (a whole tree per version weighed 13 times
the log at 200 rounds, and grew with rounds times the size of the tree)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).parent.parent / "experiments" / "wm_soak.py"


def test_the_run_directory_grows_at_most_50_kb_a_round_and_the_record_no_faster_than_the_log(tmp_path):
    spec = importlib.util.spec_from_file_location("wm_soak", SCRIPT)
    assert spec and spec.loader
    soak = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(soak)
    figures = soak.one_run(tmp_path / "run", width=32, rounds=400, eval_ms=1.0, ideas=3)
    assert figures["rounds"] == 400
    assert figures["run_dir_kb_per_round"] <= 50, figures
    assert figures["wm_mb"] <= figures["events_mb"], figures
