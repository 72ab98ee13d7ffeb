"""What the LLM layer keeps on disk: the replay cache of replies.

The run's ledger of calls (tokens, cost, errors) is its event log: every call is an `llm_call`
event, and budgets are counted from those.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------
# Response cache
# ---------------------------------------------------------------------------------------------


class CachedReply(BaseModel):
    request_hash: str
    sample: int
    model: str
    text: str
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    cost_known: bool
    finish_reason: str | None = None
    created_at: float = Field(default_factory=time.time)


def _atomic_write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class ResponseCache:
    """Replies on disk, keyed by request content and by occurrence.

    The n-th identical request made by one client maps to slot n. With temperature > 0, a search
    that asks the same question twice wants two samples, not one reply twice; and a replay that
    asks the same questions in the same order gets back exactly what the original run got.
    """

    def __init__(self, directory: Path | str) -> None:
        self.directory = Path(directory)
        self._occurrences: dict[str, int] = {}
        self._lock = threading.Lock()

    def claim(self, key: str) -> int:
        """Reserve the next sample slot for this request."""
        with self._lock:
            slot = self._occurrences.get(key, 0)
            self._occurrences[key] = slot + 1
            return slot

    def path(self, key: str, sample: int) -> Path:
        return self.directory / key[:2] / f"{key}-{sample}.json"

    def get(self, key: str, sample: int) -> CachedReply | None:
        path = self.path(key, sample)
        try:
            return CachedReply.model_validate_json(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except ValidationError as exc:
            # Writes are atomic, so this is a hand-edited or foreign file: ask again, overwrite it.
            log.warning("ignoring unreadable cache entry %s: %s", path, exc.errors()[0]["msg"])
            return None

    def put(self, entry: CachedReply) -> None:
        _atomic_write_text(self.path(entry.request_hash, entry.sample), entry.model_dump_json(indent=1))
