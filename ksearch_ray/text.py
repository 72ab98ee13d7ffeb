"""Text for people: one line, cut at a word with an ellipsis, never mid-phrase without saying so."""

from __future__ import annotations


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
