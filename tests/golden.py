"""Golden files: a rendered text against its reviewed copy; `KSEARCH_UPDATE_PROMPTS=1` rewrites the copy."""

from __future__ import annotations

import os
from pathlib import Path


def check_golden(text: str, path: Path, what: str) -> None:
    if os.environ.get("KSEARCH_UPDATE_PROMPTS"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.is_file(), f"no golden file {path}: run with KSEARCH_UPDATE_PROMPTS=1 to write it"
    assert text == path.read_text(), f"the {what} changed; review the diff, then KSEARCH_UPDATE_PROMPTS=1"
