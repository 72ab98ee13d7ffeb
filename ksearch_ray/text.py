"""Text for people: one line, cut at a word with an ellipsis, never mid-phrase without saying so; and
no secret value of the run in any text that is stored, shown or sent (`Redactor`)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping


def clip(text: str | None, limit: int) -> str:
    """`text` on one line, at most `limit` characters; cut at the last word that fits, ending in '…'."""
    flat = " ".join((text or "").split())
    if len(flat) <= limit:
        return flat
    cut = flat[: max(limit - 1, 1)]
    space = cut.rfind(" ")
    if space > limit // 2:
        cut = cut[:space]
    return cut.rstrip(" ,;:") + "…"


# --- secrets --------------------------------------------------------------------------------------

SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|PRIVATE|(^|_)PAT($|_)", re.IGNORECASE)
"""Environment variable names whose values are secrets (API keys, tokens, passwords, access tokens)."""
URL_USERINFO = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://(?P<user>[^/@\s:]*)(:(?P<password>[^/@\s]*))?@")
"""A URL with credentials in it (postgres://u:pw@host/db, https://token@host/simple)."""
REDACTED = "[redacted]"
_SHORTEST_SECRET = 6  # shorter values (flags such as "1" or "true") would blank out ordinary text


def secret_values(environ: Mapping[str, str], names: Iterable[str | None] = ()) -> frozenset[str]:
    """The secret values `environ` holds: the values of `names` (the run's API key variable), of every
    variable whose name looks like a key, token, secret or password, and of every URL with userinfo
    (the whole value and its password on its own)."""
    named = {n for n in names if n}
    out: set[str] = set()
    for name, value in environ.items():
        url = URL_USERINFO.match(value)
        if name in named or SECRET_NAME.search(name) or url:
            out.add(value)
        if url:
            out.update(part for part in (url["password"], url["user"] if url["password"] is None else None) if part)
    return frozenset(v for v in out if len(v) >= _SHORTEST_SECRET)


class Redactor:
    """Replaces every secret value the run holds with [redacted]: one place for every text a candidate
    produced (the evaluator's results) and for the event log."""

    def __init__(self, values: Iterable[str]):
        # Longest first: a URL is replaced whole before its password alone is looked for.
        ordered = sorted({v for v in values if len(v) >= _SHORTEST_SECRET}, key=len, reverse=True)
        self.values = tuple(ordered)
        self._pattern = re.compile("|".join(re.escape(v) for v in ordered)) if ordered else None

    @classmethod
    def from_environment(cls, names: Iterable[str | None] = ()) -> Redactor:
        return cls(secret_values(os.environ, names))

    def __call__(self, text: str) -> str:
        if self._pattern is None or not text:
            return text
        return self._pattern.sub(REDACTED, text)

    def json_safe(self, line: str) -> str:
        """`line` (JSON) with every secret value replaced, as written raw or escaped in a JSON string."""
        if self._pattern is None:
            return line
        escaped = [json.dumps(v)[1:-1] for v in self.values]
        line = self(line)
        for value in escaped:
            line = line.replace(value, REDACTED)
        return line
