"""Getting code and world-model edit ops out of an LLM reply.

Replies are prose around fenced blocks, written by models that do not always follow the format.
These functions accept the common deviations (missing language tags, CRLF, file markers in
several spellings, a `{"ops": [...]}` wrapper) and refuse the rest with a `ParseError` whose
one-line reason goes back to the model and into the attempt's record.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from ksearch_ray.policies.llm.leniency import normalize_ops

CodeLanguage = Literal["python", "triton", "cuda"]

_LANGUAGE_TAGS: dict[str, str] = {
    **dict.fromkeys(("python", "py", "python3", "py3", "triton"), "python"),
    **dict.fromkeys(("cuda", "cu", "cuh", "cpp", "c++", "cxx", "cc", "c", "h", "hpp", "hxx"), "cuda"),
    **dict.fromkeys(("json", "jsonc", "json5"), "json"),
}
_EXTENSION_LANGUAGE: dict[str, str] = {
    **dict.fromkeys((".py",), "python"),
    **dict.fromkeys((".cu", ".cuh", ".cpp", ".cc", ".cxx", ".c", ".h", ".hpp", ".hxx"), "cuda"),
}
_DEFAULT_NAMES = {"python": "kernel.py", "cuda": "kernel.cu"}

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`]*?)[ \t]*$")
# Names may carry a directory here only so that _check_name can refuse them with a clear reason.
_NAME = r"`?(?P<name>[\w./+-]+\.\w+)`?"
# Marker lines before a block: "### file: a.cu", "// file: a.cu", "**File:** `a.cu`", "### `a.cu`".
_MARKER_LABELLED = re.compile(
    rf"^\s*(?:#{{1,6}}|//|\*\*)?\s*file(?:name)?\s*:\s*(?:\*\*)?\s*{_NAME}\s*(?:\*\*)?\s*:?\s*$",
    re.IGNORECASE,
)
# A bare name counts only in a header or bold line, not inside a prose sentence.
_MARKER_HEADER = re.compile(rf"^\s*(?:#{{1,6}}|\*\*)\s*{_NAME}\s*(?:\*\*)?\s*:?\s*$")
# A marker as the first line inside a block must be a comment of the code's own language.
_MARKER_INSIDE = re.compile(rf"^\s*(?://|#)\s*file(?:name)?\s*:\s*{_NAME}\s*$", re.IGNORECASE)
_SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*")


class ParseError(ValueError):
    """A reply that does not contain what was asked for; the message is one line."""


@dataclass
class _Block:
    language: str | None  # normalized: python / cuda / json / other tag / None when untagged
    source: str
    name: str | None
    closed: bool
    tag: str


def _extension_language(name: str) -> str | None:
    return _EXTENSION_LANGUAGE.get("." + name.rsplit(".", 1)[-1].lower()) if "." in name else None


def _normalize_tag(info: str) -> tuple[str, str | None]:
    """Split a fence's info string into (language tag, file name if one is given there)."""
    tag, name = "", None
    for token in info.replace(",", " ").split():
        for prefix in ("file=", "filename=", "title="):
            token = token.removeprefix(prefix)
        token = token.strip("{}\"'")
        if _extension_language(token):
            name = name or token
        elif not tag:
            tag = token.lower()
    return tag, name


def _scan(text: str) -> list[_Block]:
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    blocks: list[_Block] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        fence, indent = opening["fence"], opening["indent"]
        tag, name = _normalize_tag(opening["info"])
        name = name or _marker_before(lines, i)
        body: list[str] = []
        closed = False
        i += 1
        while i < len(lines):
            closing = _FENCE.match(lines[i])
            if (
                closing
                and closing["fence"][0] == fence[0]
                and len(closing["fence"]) >= len(fence)
                and not closing["info"]
            ):
                closed = True
                break
            body.append(lines[i].removeprefix(indent))
            i += 1
        i += 1
        if name is None and body and (inside := _MARKER_INSIDE.match(body[0])):
            name = inside["name"]
        # A file's extension is more specific than the fence's tag (```cpp over a .cu file).
        language = (name and _extension_language(name)) or _LANGUAGE_TAGS.get(tag, tag or None)
        source = "\n".join(body).strip("\n")
        if not closed and not source.strip():
            break  # a stray fence at the very end, not a truncated answer
        blocks.append(
            _Block(
                language=language, source=source + "\n" if source else "", name=name, closed=closed, tag=tag
            )
        )
    return blocks


def _marker_before(lines: list[str], fence_index: int) -> str | None:
    j = fence_index - 1
    while j >= 0 and not lines[j].strip() and fence_index - j <= 2:
        j -= 1
    if j < 0:
        return None
    match = _MARKER_LABELLED.match(lines[j]) or _MARKER_HEADER.match(lines[j])
    return match["name"] if match else None


def _check_name(name: str) -> str:
    if not _SAFE_NAME.fullmatch(name) or ".." in name:
        raise ParseError(f"file name {name!r} is not a flat relative name")
    return name


def _describe(text: str, blocks: list[_Block]) -> str:
    if not blocks:
        return f"got {len(text)} chars of prose"
    tags = sorted({b.tag or "untagged" for b in blocks})
    return f"got {len(text)} chars with {len(blocks)} fenced block(s): {', '.join(tags)}"


def extract_code(text: str, language: CodeLanguage, default_name: str | None = None) -> dict[str, str]:
    """File name -> source from a reply.

    Blocks that carry a file name (a marker line before the fence, a name in the fence's info
    string, or a `// file:` comment as their first line) form a multi-file answer. Otherwise the
    answer is one block of the language, or an untagged block if there is none; among several,
    the last one at least half as long as the longest, which skips a trailing usage snippet but
    prefers a revised version over the draft before it.
    """
    target = "python" if language in ("python", "triton") else "cuda" if language == "cuda" else None
    if target is None:
        raise ValueError(f"unknown code language {language!r}")
    blocks = _scan(text)
    if blocks and not blocks[-1].closed and blocks[-1].language in (target, None):
        raise ParseError(
            f"the reply ends inside an unclosed ``` block ({blocks[-1].source.count(chr(10))} lines): truncated?"
        )
    closed = [b for b in blocks if b.closed]

    named = [b for b in closed if b.name and b.language == target]
    if named:
        files: dict[str, str] = {}
        for block in named:
            if not block.source.strip():
                raise ParseError(f"the block for file {block.name} is empty")
            files[_check_name(block.name or "")] = block.source
        return files

    candidates = [b for b in closed if b.language == target] or [b for b in closed if b.language is None]
    candidates = [b for b in candidates if b.source.strip()]
    if not candidates:
        raise ParseError(f"no ```{language} block in the reply ({_describe(text, blocks)})")
    longest = max(len(b.source) for b in candidates)
    chosen = [b for b in candidates if 2 * len(b.source) >= longest][-1]
    return {_check_name(default_name or _DEFAULT_NAMES[target]): chosen.source}


def read_plan(text: str, default_parent: str = "root") -> tuple[list[dict[str, Any]], list[str]]:
    """(ops, notes): the edit ops of a planner reply, read leniently (see `leniency`), and what was
    read leniently. The last ```json block counts, else a bare JSON value in the text, else the
    whole reply as JSON (structured output)."""
    ops, notes = normalize_ops(_plan_json(text), default_parent)
    return _as_ops(ops), notes


def extract_ops(text: str, default_parent: str = "root") -> list[dict[str, Any]]:
    return read_plan(text, default_parent)[0]


def _plan_json(text: str) -> Any:
    stripped = text.strip()
    if stripped[:1] in ("[", "{"):
        try:
            return json.loads(stripped)
        except json.JSONDecodeError:
            pass  # prose after JSON, or JSON inside prose: the searches below find it
    blocks = _scan(text)
    if blocks and not blocks[-1].closed and blocks[-1].language in ("json", None):
        raise ParseError("the reply ends inside an unclosed ```json block: truncated?")
    closed = [b for b in blocks if b.closed]
    json_blocks = [b for b in closed if b.language == "json"] or [
        b for b in closed if b.language is None and b.source.lstrip()[:1] in ("[", "{")
    ]
    if json_blocks:
        source = json_blocks[-1].source
        try:
            value = json.loads(source)
        except json.JSONDecodeError as exc:
            raise ParseError(
                f"the ```json block is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
            ) from exc
        return value
    value = _last_bare_json(text)
    if value is None:
        raise ParseError(
            f"no ```json block and no JSON array of ops in the reply ({_describe(text, blocks)})"
        )
    return value


def _last_bare_json(text: str) -> Any:
    """The last top-level JSON array (or {"ops": ...} object) embedded in prose, if any."""
    decoder = json.JSONDecoder()
    found: Any = None
    position = 0
    while (match := re.compile(r"[\[{]").search(text, position)) is not None:
        try:
            value, end = decoder.raw_decode(text, match.start())
        except json.JSONDecodeError:
            position = match.start() + 1
            continue
        looks_like_ops = (isinstance(value, dict) and bool({"ops", "actions", "op"} & set(value))) or (
            isinstance(value, list) and all(isinstance(item, dict) for item in value)
        )
        # An empty list is a valid "no edits", but a non-empty one elsewhere outranks it.
        if looks_like_ops and (value or found is None):
            found = value
        position = end
    return found


def _as_ops(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        kind = f"an object with keys {sorted(value)[:5]}" if isinstance(value, dict) else type(value).__name__
        raise ParseError(f'expected a JSON array of ops (or {{"ops": [...]}}), got {kind}')
    for index, item in enumerate(value):
        if not isinstance(item, dict) or not isinstance(item.get("op"), str):
            raise ParseError(
                f'op #{index} is not an object with a string "op" field: {json.dumps(item)[:80]}'
            )
    return value
