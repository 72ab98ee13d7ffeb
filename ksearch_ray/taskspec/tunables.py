"""Tunables that seed kernels declare in their source, readable and rewritable by a program.

A tunable is one module-level assignment with a trailing marker comment listing its choices:

    BLOCK_N = 64  # tunable: [32, 64, 128]
    USE_TF32 = False  # tunable: [False, True]

Values and choices are Python literals (ints, floats, bools, strings). C++ and CUDA sources
declare numeric tunables as one `constexpr` per line with the marker in a line comment:

    constexpr int kTileN = 32;  // tunable: [16, 32, 64, 128]

The offline policy reads them with `read_tunables` and writes a variant with `rewrite_tunables`;
nothing else changes.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ksearch_ray.models import Solution

_LINE = re.compile(
    r"^(?P<name>[A-Z_][A-Z0-9_]*)\s*=\s*(?P<value>[^#\n]+?)\s*#\s*tunable:\s*(?P<choices>\[.*\])[ \t]*$", re.MULTILINE
)

# The declaration before the name (`constexpr int `, `static constexpr float `) is kept as written.
_CXX_LINE = re.compile(
    r"^(?P<decl>[ \t]*(?:static[ \t]+)?constexpr[ \t]+[A-Za-z_][\w:]*[ \t]+)(?P<name>[A-Za-z_]\w*)[ \t]*=[ \t]*"
    r"(?P<value>[^;\n]+?)[ \t]*;[ \t]*//[ \t]*tunable:[ \t]*(?P<choices>\[.*\])[ \t]*$",
    re.MULTILINE,
)


class TunableError(ValueError):
    pass


@dataclass(frozen=True)
class Tunable:
    name: str
    value: Any
    choices: tuple[Any, ...]


def _matches(source: str) -> list[tuple[re.Match[str], bool]]:
    """Every tunable line, in source order, with whether it is the C++ form."""
    found = [(m, False) for m in _LINE.finditer(source)] + [(m, True) for m in _CXX_LINE.finditer(source)]
    return sorted(found, key=lambda pair: pair[0].start())


def read_tunables(source: str) -> dict[str, Tunable]:
    out: dict[str, Tunable] = {}
    for m, cxx in _matches(source):
        try:
            value = ast.literal_eval(m["value"])
            choices = tuple(ast.literal_eval(m["choices"]))
        except (ValueError, SyntaxError) as exc:
            raise TunableError(f"tunable {m['name']}: not a literal ({exc})") from None
        if cxx and not all(_is_number(v) for v in (value, *choices)):
            raise TunableError(f"tunable {m['name']}: C++ tunables take numbers only")
        if value not in choices:
            raise TunableError(f"tunable {m['name']}: value {value!r} is not among its choices {list(choices)}")
        out[m["name"]] = Tunable(m["name"], value, choices)
    return out


def value_from_text(text: str) -> Any:
    """A tunable's value as typed on a command line: a Python literal (64, True, "fp16"), else the bare
    text as a string (fp16)."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


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

    def replace_cxx(m: re.Match[str]) -> str:
        if m["name"] not in values:
            return m[0]
        return f"{m['decl']}{m['name']} = {values[m['name']]!r};  // tunable: {m['choices']}"

    return _CXX_LINE.sub(replace_cxx, _LINE.sub(replace, source))


def declared_tunables(solution: Solution) -> dict[str, Tunable]:
    """Tunables across all source files, in file-name then line order; the first declaration wins."""
    out: dict[str, Tunable] = {}
    for _, text in sorted(solution.sources.items()):
        for name, tunable in read_tunables(text).items():
            out.setdefault(name, tunable)
    return out


def with_values(solution: Solution, values: Mapping[str, Any]) -> dict[str, str]:
    """The solution's sources with every named tunable set, in each file that declares it."""
    out = {}
    for name, text in solution.sources.items():
        mine = {k: v for k, v in values.items() if k in read_tunables(text)}
        out[name] = rewrite_tunables(text, mine) if mine else text
    return out
