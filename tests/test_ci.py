"""CI (`.ci/run`) runs the README's test command verbatim, so the command a newcomer copies is the one
that is tested, installs included."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parent.parent


def test_ci_runs_the_readmes_test_command_verbatim():
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"Install and run the test suite:\n\n```bash\n(.+?)\n```", readme, re.S)
    assert block, "the README's test command is no longer under 'Install and run the test suite:'"
    lines = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert lines[-1] == block.group(1).strip()


def test_the_commit_hooks_run_the_checks_ci_runs():
    """.pre-commit-config.yaml's hooks are the README's checks, word for word, and it has no other."""
    import yaml

    readme = (ROOT / "README.md").read_text()
    block = re.search(r"Install and run the test suite:\n\n```bash\n(.+?)\n```", readme, re.S)
    assert block
    checks = [part.strip() for part in block.group(1).split("&&") if part.strip().startswith(("ruff", "mypy"))]
    hooks = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())["repos"][0]["hooks"]
    assert [hook["entry"] for hook in hooks] == checks == ["ruff check .", "mypy ksearch_ray actors"]
    assert all(hook["language"] == "system" and hook["pass_filenames"] is False for hook in hooks)
