"""Why a search cannot start or go on: one line for the user, and the run stays resumable."""

from __future__ import annotations

from pathlib import Path


class SearchError(Exception):
    """The search cannot start or continue; the message is one line for the user."""


class RunStopped(SearchError):
    """A run that stopped on an error after its run directory existed: it can be resumed."""

    def __init__(self, message: str, run_dir: Path):
        super().__init__(message)
        self.run_dir = run_dir


class RunInterrupted(Exception):
    """Ctrl-C: the run stopped where it was and can be resumed."""

    def __init__(self, run_dir: Path):
        super().__init__(f"interrupted: {run_dir}")
        self.run_dir = run_dir
