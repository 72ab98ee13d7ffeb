"""The stand-in's hands: code it writes, breaks and fixes, from what a prompt shows and nothing else.

* `from_reference`: a first kernel from the task's reference implementation (the `generate_from_spec`
  prompt shows it): the reference's computation kept, the input generation and file reading dropped,
  and an entry point with the calling convention the prompt's Interface section states.
* `break_code`: a realistic broken draft (a `def` without its colon, a misspelt name, a result off by
  a factor, an abort or a hang).
* `fix_code`: the repair a careful engineer makes from the error text the debug prompt shows (the
  line a SyntaxError names, the closest defined name to an undefined one, a factor equal to the ratio
  of a mismatch's got/expected). A crash or a hang says nothing it can act on: those stay broken.
"""

from __future__ import annotations

import ast
import difflib
import re

ENTRY_LINE = re.compile(r"^def (\w+)\((.*?)\)", re.MULTILINE)
INPUT_LINE = re.compile(r"^  ([\w.]+): ", re.MULTILINE)
FILE_READS = ("Path(", "open(", "read_text", "json.load", "__file__")


def interface(text: str) -> tuple[str, str, list[str]]:
    """(entry point, calling convention: gpumode or positional, input names) from an Interface section."""
    match = ENTRY_LINE.search(text)
    name, params = (match.group(1), match.group(2)) if match else ("run", "")
    inputs_part = text.split("Outputs:", 1)[0]
    names = INPUT_LINE.findall(inputs_part)
    convention = "gpumode" if params.strip() == "data" and "packed" in text else "positional"
    return name, convention, names


def from_reference(reference: str, interface_text: str) -> str:
    """A kernel module that computes what `reference(inputs)` computes, behind the task's entry point."""
    tree = ast.parse(reference)
    kept: list[ast.stmt] = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "generate_inputs":
            continue  # the harness makes the inputs
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ksearch_ray"):
            continue  # the framework is not there for a candidate
        if isinstance(node, ast.Assign | ast.AnnAssign) and any(r in ast.unparse(node) for r in FILE_READS):
            continue  # nothing beside the candidate to read
        kept.append(node)
    body = ast.unparse(ast.Module(body=kept, type_ignores=[]))
    entry, convention, names = interface(interface_text)
    listed = ", ".join(repr(n) for n in names)
    if convention == "gpumode":
        adapter = f'''

_INPUTS = [{listed}]


def _inputs(data):
    """The named inputs from the packed data: tensors in order, dicts by name."""
    found, loose = {{}}, []
    for item in data:
        if isinstance(item, dict):
            found.update({{k: v for k, v in item.items() if k in _INPUTS}})
        else:
            loose.append(item)
    found.update(zip([n for n in _INPUTS if n not in found], loose))
    return {{n: found[n] for n in _INPUTS if n in found}}


def {entry}(data):
    return reference(_inputs(data))
'''
    else:
        adapter = f'''

_INPUTS = [{listed}]


def {entry}(*args):
    return reference(dict(zip(_INPUTS, args)))
'''
    return body.rstrip() + "\n" + adapter


# --- breaking -------------------------------------------------------------------------------------------


def break_code(source: str, how: str, entry: str, roll: int) -> str:
    """`source` with one realistic mistake of kind `how` (unchanged when it has nowhere to put it)."""
    lines = source.splitlines()
    entry_at = next((i for i, line in enumerate(lines) if line.startswith(f"def {entry}(")), None)
    if entry_at is None:
        return source
    if how == "syntax":
        # The colon of the entry point's `def` forgotten (it may span lines: drop the last one).
        end = entry_at
        while end < len(lines) and not lines[end].rstrip().endswith(":"):
            end += 1
        if end < len(lines):
            lines[end] = lines[end].rstrip()[:-1]
        return "\n".join(lines) + "\n"
    body = _body(lines, entry_at)
    if how == "name":
        names = [n for n in _names_in(lines, body) if len(n) >= 4]
        if not names:
            return source
        name = names[roll % len(names)]
        typo = name[0] + name[2] + name[1] + name[3:]  # two letters swapped
        i = next(i for i in body if re.search(rf"\b{re.escape(name)}\b", lines[i]) and not _assigns(lines[i], name))
        lines[i] = re.sub(rf"\b{re.escape(name)}\b", typo, lines[i], count=1)
        return "\n".join(lines) + "\n"
    if how == "scale":
        returns = [i for i in body if lines[i].strip().startswith("return ")]
        if not returns:
            return source
        i = returns[-1]
        indent, value = lines[i].split("return ", 1)
        lines[i] = f"{indent}return ({value}) * 1.5"
        return "\n".join(lines) + "\n"
    first = body[0] if body else entry_at + 1
    indent = re.match(r"\s*", lines[first]).group(0) if first < len(lines) else "    "  # type: ignore[union-attr]
    stmt = {"crash": "import os; os.abort()", "hang": "while True: pass"}.get(how)
    if stmt is None:
        return source
    lines.insert(first, f"{indent}{stmt}")
    return "\n".join(lines) + "\n"


def _body(lines: list[str], def_at: int) -> list[int]:
    """Line indexes of a top-level function's body (after its signature)."""
    i = def_at
    while i < len(lines) and not lines[i].rstrip().endswith(":"):
        i += 1
    out = []
    for j in range(i + 1, len(lines)):
        if lines[j].strip() and not lines[j].startswith((" ", "\t")):
            break
        if lines[j].strip() and not lines[j].strip().startswith("#"):
            out.append(j)
    return out


def _names_in(lines: list[str], body: list[int]) -> list[str]:
    """Names read in a body that are assigned before it or in it (so a typo makes a NameError)."""
    assigned: list[str] = []
    for i in body:
        for name in re.findall(r"\b([A-Za-z_]\w*)\s*(?:,\s*[A-Za-z_]\w*\s*)*=(?!=)", lines[i]):
            if name not in assigned:
                assigned.append(name)
    used = [n for n in assigned if sum(len(re.findall(rf"\b{re.escape(n)}\b", lines[i])) for i in body) > 1]
    return used


def _assigns(line: str, name: str) -> bool:
    return re.match(rf"\s*(?:[\w, ]*,\s*)?{re.escape(name)}\s*(?:,[\w, ]*)?=(?!=)", line) is not None


# --- fixing ---------------------------------------------------------------------------------------------


def fix_code(source: str, evidence: str) -> str | None:
    """The code repaired from what `evidence` (the evaluation's text in the prompt) says, or None when it
    says nothing this stand-in can act on."""
    lines = source.splitlines()
    syntax = re.search(r"SyntaxError: (.*?)\(\S*?:(\d+)\)", evidence)
    if syntax:
        i = int(syntax.group(2)) - 1
        for j in (i, i - 1):  # Python names the line after a missing colon at times
            if 0 <= j < len(lines) and re.match(r"\s*(def|for|if|elif|else|while|with|class|try|except)\b", lines[j]) \
                    and not lines[j].rstrip().endswith(":"):
                lines[j] = lines[j].rstrip() + ":"
                return "\n".join(lines) + "\n"
        return None
    # A misspelt name: Python says NameError, or UnboundLocalError when the misspelling is also assigned in the
    # function (a typo in `x += ...` makes `x` local).
    name = re.search(r"NameError: name '(\w+)' is not defined", evidence) or re.search(
        r"UnboundLocalError: cannot access local variable '(\w+)'", evidence)
    if name:
        wrong = name.group(1)
        known = sorted({n for n in re.findall(r"\b[A-Za-z_]\w*\b", source) if n != wrong})
        close = difflib.get_close_matches(wrong, known, n=1, cutoff=0.6)
        if not close:
            return None
        return re.sub(rf"\b{re.escape(wrong)}\b", close[0], source)
    mismatch = re.search(r"got (-?[0-9.eE+-]+), expected (-?[0-9.eE+-]+)", evidence)
    if mismatch:
        got, expected = float(mismatch.group(1)), float(mismatch.group(2))
        if expected == 0:
            return None
        ratio = got / expected
        for i, line in enumerate(lines):
            factor = re.search(r"\)\s*\*\s*([0-9.]+)\s*$", line)
            if line.strip().startswith("return (") and factor and abs(float(factor.group(1)) - ratio) < 0.05 * abs(ratio):
                indent, value = line.split("return (", 1)
                lines[i] = f"{indent}return {value[: value.rindex(')')]}"
                return "\n".join(lines) + "\n"
        return None
    return None
