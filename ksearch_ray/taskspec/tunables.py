"""Tunables that seed kernels declare in their source, readable and rewritable by a program.

A tunable is one module-level assignment with a trailing marker comment listing its choices:

    BLOCK_N = 64  # tunable: [32, 64, 128]
    USE_TF32 = False  # tunable: [False, True]

Values and choices are Python literals (ints, floats, bools, strings). The offline policy reads
them with `read_tunables` and writes a variant with `rewrite_tunables`; nothing else changes.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Any

_LINE = re.compile(
    r"^(?P<name>[A-Z_][A-Z0-9_]*)\s*=\s*(?P<value>[^#\n]+?)\s*#\s*tunable:\s*(?P<choices>\[.*\])[ \t]*$", re.MULTILINE
)


class TunableError(ValueError):
    pass


@dataclass(frozen=True)
class Tunable:
    name: str
    value: Any
    choices: tuple[Any, ...]


def read_tunables(source: str) -> dict[str, Tunable]:
    out: dict[str, Tunable] = {}
    for m in _LINE.finditer(source):
        try:
            value = ast.literal_eval(m["value"])
            choices = tuple(ast.literal_eval(m["choices"]))
        except (ValueError, SyntaxError) as exc:
            raise TunableError(f"tunable {m['name']}: not a literal ({exc})") from None
        if value not in choices:
            raise TunableError(f"tunable {m['name']}: value {value!r} is not among its choices {list(choices)}")
        out[m["name"]] = Tunable(m["name"], value, choices)
    return out


def rewrite_tunables(source: str, values: dict[str, Any]) -> str:
    """Return source with the named tunables set; every name must exist and every value be a choice."""
    declared = read_tunables(source)
    for name, value in values.items():
        if name not in declared:
            raise TunableError(f"no tunable named {name}")
        if value not in declared[name].choices:
            raise TunableError(f"{name}={value!r} is not among {list(declared[name].choices)}")

    def replace(m: re.Match[str]) -> str:
        if m["name"] not in values:
            return m[0]
        return f"{m['name']} = {values[m['name']]!r}  # tunable: {m['choices']}"

    return _LINE.sub(replace, source)
