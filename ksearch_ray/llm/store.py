"""What the LLM layer keeps on disk: the replay cache of replies and the cost ledger of calls.

Split out of `ksearch_ray.llm.client`, which re-exports every name here.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError

from ksearch_ray.llm.types import LLMCall

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


# ---------------------------------------------------------------------------------------------
# Ledger
# ---------------------------------------------------------------------------------------------


class LedgerTotals(BaseModel):
    calls: int = 0
    cached_calls: int = 0
    failed_calls: int = 0
    attempts: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0

    def add(self, call: LLMCall) -> None:
        self.calls += 1
        self.cached_calls += call.cached
        self.failed_calls += call.error is not None
        self.attempts += call.attempts
        self.prompt_tokens += call.prompt_tokens
        self.completion_tokens += call.completion_tokens
        self.cost_usd += call.cost_usd


class Ledger:
    """Append-only JSONL of LLMCall records with running totals and a cost budget.

    Opening a ledger replays the existing file, so a resumed run keeps counting where the killed
    one stopped. Each line is fsynced: the ledger is what the budget is enforced from.
    """

    def __init__(self, path: Path | str, max_cost_usd: float | None = None) -> None:
        self.path = Path(path)
        self.max_cost_usd = max_cost_usd
        self.totals = LedgerTotals()
        self._lock = threading.Lock()
        self._replay()

    @classmethod
    def load(cls, path: Path | str, max_cost_usd: float | None = None) -> Ledger:
        return cls(path, max_cost_usd=max_cost_usd)

    def _replay(self) -> None:
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        complete, _, torn = data.rpartition(b"\n")
        if torn:
            # A kill mid-append leaves a partial last line; cut it so the next append starts clean.
            log.warning("ledger %s: dropping a torn last line (%d bytes)", self.path, len(torn))
            with open(self.path, "r+b") as f:
                f.truncate(len(complete) + 1 if complete else 0)
        for number, line in enumerate(complete.decode("utf-8").splitlines(), start=1):
            if line.strip():
                try:
                    self.totals.add(LLMCall.model_validate_json(line))
                except ValidationError as exc:
                    raise ValueError(f"ledger {self.path} line {number} is not an LLMCall: {exc}") from exc

    def record(self, call: LLMCall) -> None:
        line = call.model_dump_json() + "\n"
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(line)
                f.flush()
                os.fsync(f.fileno())
            self.totals.add(call)

    def over_budget(self) -> bool:
        return self.max_cost_usd is not None and self.totals.cost_usd >= self.max_cost_usd
