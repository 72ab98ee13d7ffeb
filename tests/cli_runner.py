"""`ksearch` as a user types it, run in this process through typer's test runner.

The command sees the user's working directory (`cwd`), their environment changes (`env`) and a
terminal that is not one (as in a pipe). Subprocesses stay for what is theirs: signals, terminals,
the installed package's entry point.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from typer.testing import CliRunner

from ksearch_ray.cli import app


@dataclass
class Done:
    returncode: int
    stdout: str
    stderr: str


@contextlib.contextmanager
def _cwd(path: Path) -> Iterator[None]:
    before = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


def ksearch(cwd: Path, *args: str, env: dict[str, str] | None = None) -> Done:
    runner = CliRunner(env={"COLUMNS": "80", "RAY_AUTH_MODE": "disabled", **(env or {})})
    with _cwd(cwd):
        result = runner.invoke(app, list(args), catch_exceptions=False)
    return Done(result.exit_code, result.stdout, result.stderr)
