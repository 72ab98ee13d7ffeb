"""The layers as docs/architecture.md draws them, checked on every import in the code (lazy ones too):
data flows one way, no two modules import each other, and Ray is imported at its one edge only."""

from __future__ import annotations

import ast
import io
import re
import subprocess
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent

LAYERS: list[tuple[str, ...]] = [
    ("ksearch_ray", "ksearch_ray.models", "ksearch_ray.text"),
    ("ksearch_ray.taskspec", "ksearch_ray.worldmodel"),
    ("ksearch_ray.evaluation",),
    ("ksearch_ray.config",),
    ("ksearch_ray.policies",),
    ("ksearch_ray.measure", "ksearch_ray.events", "ksearch_ray.store", "ksearch_ray.tree_record"),
    ("ksearch_ray.methods",),
    ("ksearch_ray.run", "ksearch_ray.report", "ksearch_ray.analysis", "ksearch_ray.tracking"),
    ("ksearch_ray.actors",),
    ("ksearch_ray.distributed",),
    ("ksearch_ray.session", "ksearch_ray.studies"),
    ("ksearch_ray.cli", "ksearch_ray.__main__"),
]
"""Bottom to top: a module may import its own package and anything in a lower layer, nothing above."""

RAY_EDGE = ("ksearch_ray.distributed", "ksearch_ray.actors")


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted((ROOT / "ksearch_ray").rglob("*.py")) + sorted((ROOT / "actors").rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[0] == "actors":  # installed as ksearch_ray.actors
            parts = ["ksearch_ray", *parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return found


def group(module: str) -> str:
    """The package a module belongs to, as the layers name them."""
    known = [name for layer in LAYERS for name in layer]
    return max((name for name in known if module == name or module.startswith(name + ".")), key=len)


def layer(module: str) -> int:
    name = group(module)
    return next(i for i, names in enumerate(LAYERS) if name in names)


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {m: {i for i in imports(p) if i in mods and i != m} for m, p in mods.items()}


def test_every_package_has_a_layer():
    for module in modules():
        assert layer(module) >= 0, module


def test_no_module_imports_one_from_a_layer_above_it():
    upward = [f"{a} -> {b}" for a, targets in graph().items() for b in targets
              if group(a) != group(b) and layer(b) > layer(a)]
    assert not upward, upward


def test_no_two_modules_import_each_other():
    g = graph()
    pairs = sorted({tuple(sorted((a, b))) for a, targets in g.items() for b in targets if a in g.get(b, set())})
    assert not pairs, pairs


def test_ray_is_imported_only_at_its_edge():
    mods = modules()
    importers = sorted(m for m, path in mods.items() if any(i == "ray" or i.startswith("ray.") for i in imports(path)))
    assert importers and all(m.startswith(RAY_EDGE) for m in importers), importers


def test_the_layers_checked_here_are_the_layers_the_architecture_page_draws():
    text = (ROOT / "docs/architecture.md").read_text()
    for names in LAYERS[1:]:
        line = " ".join(name.removeprefix("ksearch_ray.") for name in names)
        assert line in text, f"docs/architecture.md does not draw the layer: {line}"


# --- the world model's boundary: typed commands and typed ops ---------------------------------------

WORLD_MODEL = "ksearch_ray.worldmodel"
PLANNERS = "ksearch_ray.policies"
"""The planners write ops as the JSON a model writes (`PlanReply.ops`); `apply_ops` reads them as it reads an LLM's."""


def _outside(*inside: str) -> dict[str, ast.Module]:
    return {m: ast.parse(p.read_text()) for m, p in modules().items()
            if not any(m == name or m.startswith(name + ".") for name in inside)}


def string_calls_into_the_world_model(trees: dict[str, ast.Module]) -> list[str]:
    """`wm("renew", ...)`, `state.call("apply", {...})`: a world-model change named by a string."""
    found = []
    for module, tree in trees.items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            first = node.args[0]
            if name in ("wm", "call") and isinstance(first, ast.Constant) and isinstance(first.value, str):
                found.append(f"{module}:{node.lineno}: {name}({first.value!r}, ...)")
    return found


def dict_literal_ops(trees: dict[str, ast.Module]) -> list[str]:
    """`{"op": "attach_solution", ...}` or `dict(op="attach_solution", ...)` instead of the op's model."""
    from ksearch_ray.worldmodel.ops import OP_NAMES

    found = []
    for module, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Dict):
                tags = [v for k, v in zip(node.keys, node.values, strict=True)
                        if isinstance(k, ast.Constant) and k.value == "op"]
            elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "dict":
                tags = [kw.value for kw in node.keywords if kw.arg == "op"]
            else:
                continue
            if any(isinstance(t, ast.Constant) and t.value in OP_NAMES for t in tags):
                found.append(f"{module}:{node.lineno}")
    return found


def test_the_world_model_is_changed_by_typed_commands_not_by_name():
    assert not string_calls_into_the_world_model(_outside(WORLD_MODEL))


def test_ops_are_built_as_their_models_outside_the_world_model_and_the_planners():
    assert not dict_literal_ops(_outside(WORLD_MODEL, PLANNERS))


def test_the_boundary_checks_find_what_they_look_for():
    """The two checks above would see a string call and a dict-literal op if one came back."""
    source = ast.parse('async def f(ctx, state):\n'
                       '    await ctx.wm("apply", ops=[{"op": "attach_solution", "node": "n1"}])\n'
                       '    state.call("renew", {"ids": ["n1"]})\n'
                       '    return dict(op="record_outcome", node="n1")\n')
    assert len(string_calls_into_the_world_model({"m": source})) == 2
    assert len(dict_literal_ops({"m": source})) == 2


# --- the engine carved along its seams (issue 41) ---------------------------------------------------------

SERVICE_MEMBERS = 12
"""Members one service a method sees may have (a method, or an attribute it reads)."""
ENGINE_METHODS, ENGINE_ATTRIBUTES = 20, 25
"""`Search` is the run's life (its log, budget, start and end), not everything: the rest is in its services."""


def _class(module: str, name: str) -> ast.ClassDef:
    tree = ast.parse(modules()[module].read_text())
    return next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name)


def _members(cls: ast.ClassDef) -> list[str]:
    """A class's methods and annotated attributes."""
    out = []
    for n in cls.body:
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef):
            out.append(n.name)
        elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
            out.append(n.target.id)
    return out


def context_services(cls: ast.ClassDef, protocols: dict[str, ast.ClassDef]) -> dict[str, list[str]]:
    """The services `SearchContext` is made of, each with its members; a field that is no protocol of the
    module (or a method of the context itself) is a service named "" that holds it."""
    out: dict[str, list[str]] = {}
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            kind = node.annotation.id if isinstance(node.annotation, ast.Name) else ""
            out[node.target.id] = _members(protocols[kind]) if kind in protocols else [""]
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            out.setdefault("", []).append(node.name)
    return out


def test_a_method_sees_its_run_as_a_few_narrow_services():
    tree = ast.parse(modules()["ksearch_ray.methods.context"].read_text())
    protocols = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)
                 and any(getattr(b, "id", None) == "Protocol" for b in n.bases)}
    services = context_services(_class("ksearch_ray.methods.context", "SearchContext"), protocols)
    assert "" not in services and 2 <= len(services) <= 5, services
    too_wide = {name: len(members) for name, members in services.items() if len(members) > SERVICE_MEMBERS}
    assert not too_wide


def _a_stub(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A protocol's `...` or an abstract method's `raise NotImplementedError`, after its docstring."""
    body = [n for n in fn.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
    return not body or all(isinstance(n, ast.Raise) for n in body)


def whole_context_users(trees: dict[str, ast.Module], context: str = "SearchContext") -> list[str]:
    """Functions that take the whole context and use one service of it (or none): they should take that one."""
    found = []
    for module, tree in trees.items():
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            names = {a.arg for a in fn.args.args + fn.args.kwonlyargs
                     if isinstance(a.annotation, ast.Name) and a.annotation.id == context
                     or isinstance(a.annotation, ast.Constant) and a.annotation.value == context}
            if _a_stub(fn):
                continue
            for name in names:
                reads = [n for n in ast.walk(fn) if isinstance(n, ast.Attribute)
                         and isinstance(n.value, ast.Name) and n.value.id == name]
                used = {n.attr for n in reads}
                whole = sum(isinstance(n, ast.Name) and n.id == name for n in ast.walk(fn)) > len(reads)
                if len(used) < 2 and not whole:  # (whole: passed on or kept as it is)
                    found.append(f"{module}:{fn.lineno}: {fn.name}({name}) uses {sorted(used) or 'nothing'} of it")
    return found


def test_a_part_of_a_method_takes_only_the_services_it_uses():
    methods = {m: ast.parse(p.read_text()) for m, p in modules().items() if m.startswith("ksearch_ray.methods.")}
    assert not whole_context_users(methods)


def test_the_whole_context_check_finds_a_function_that_uses_one_service():
    source = ast.parse("def f(ctx: SearchContext):\n    return ctx.evals.solution('x')\n"
                       "def g(ctx: SearchContext):\n    return ctx.run.view, ctx.evals.noise()\n")
    assert len(whole_context_users({"m": source})) == 1


def test_the_engine_is_the_runs_life_and_hands_the_rest_to_its_services():
    search = _class("ksearch_ray.run.engine", "Search")
    methods = [n.name for n in search.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    attributes = {t.attr for n in ast.walk(search) if isinstance(n, ast.Assign | ast.AnnAssign)
                  for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
                  if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"}
    assert len(methods) <= ENGINE_METHODS, methods
    assert len(attributes) <= ENGINE_ATTRIBUTES, sorted(attributes)


def _defined_and_imported(tree: ast.Module) -> tuple[set[str], set[str]]:
    defined, imported = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom | ast.Import):
            imported |= {alias.asname or alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            defined.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            defined.add(node.id)
    return defined, imported


def reexports_used(package: dict[str, ast.Module], importers: dict[str, ast.Module]) -> set[tuple[str, str]]:
    """(module, name) for every `from module import name` where the module does not define the name but
    imports it from elsewhere: a re-export someone still leans on."""
    names = {m: _defined_and_imported(tree) for m, tree in package.items()}
    found = set()
    for tree in importers.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in names:
                defined, imported = names[node.module]
                found |= {(node.module, a.name) for a in node.names if a.name in imported and a.name not in defined
                          and f"{node.module}.{a.name}" not in package}
    return found


def _parsed(paths: list[Path]) -> dict[str, ast.Module]:
    out = {}
    for path in paths:
        try:
            out[str(path)] = ast.parse(path.read_text())
        except SyntaxError:  # test data: kernels that do not compile on purpose
            continue
    return out


def test_a_name_is_imported_from_the_module_that_defines_it():
    package = {m: ast.parse(p.read_text()) for m, p in modules().items()}
    importers = _parsed([p for d in ("ksearch_ray", "actors", "tests", "experiments") for p in (ROOT / d).rglob("*.py")])
    assert reexports_used(package, importers) == set()


def test_the_reexport_check_finds_a_name_taken_from_a_module_that_only_imports_it():
    package = {"a": ast.parse("X = 1\n"), "b": ast.parse("from a import X\nY = X\n")}
    importer = {"c": ast.parse("from b import X, Y\n")}
    assert reexports_used(package, importer) == {("b", "X")}


# --- one name, one thing; docs that name what exists ------------------------------------------------------


def duplicate_basenames(paths: list[Path]) -> dict[str, list[str]]:
    """Module file names (not `__init__.py`) that more than one module of the package uses."""
    seen: dict[str, list[str]] = {}
    for path in paths:
        if path.name != "__init__.py":
            seen.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    return {name: where for name, where in seen.items() if len(where) > 1}


def test_every_module_has_a_name_of_its_own():
    assert duplicate_basenames(list(modules().values())) == {}


def test_the_basename_check_finds_two_modules_of_one_name():
    paths = [ROOT / "ksearch_ray/a/store.py", ROOT / "ksearch_ray/b/store.py", ROOT / "ksearch_ray/b/__init__.py",
             ROOT / "ksearch_ray/a/__init__.py"]
    assert duplicate_basenames(paths) == {"store.py": ["ksearch_ray/a/store.py", "ksearch_ray/b/store.py"]}


PATH_IN_TEXT = re.compile(r"(?<![\w./~$<>{-])((?:[A-Za-z_][\w-]*/)+[\w-]+\.(?:py|md|sh|yaml|json|c|toml))\b")
DOTTED_IN_TEXT = re.compile(r"\bksearch_ray((?:\.[A-Za-z_]\w*)+)")
INSTALLED = {"bundled_tasks"}
"""Packages installed under `ksearch_ray.` from folders of data, not modules (pyproject's package-dir)."""
ARCHIVE = "\n## Archive"
"""Where docs/benchmarks.md's archive starts: records of what was run then, under the names it had then."""


def prose(path: Path) -> str:
    """What a path holds for people: a document's text (not a benchmarks archive), or a module's comments and
    docstrings (string literals the code uses are data, not prose)."""
    text = path.read_text()
    if path.suffix == ".md":
        return text.split(ARCHIVE)[0]
    out = []
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type == tokenize.COMMENT or (token.type == tokenize.STRING and token.string.lstrip("rbfu").startswith(('"""', "'''"))):
                out.append(token.string)
    except (tokenize.TokenError, SyntaxError):  # test data that does not parse on purpose
        return ""
    return "\n".join(out)


def stale_names(texts: dict[str, str], files: list[str], package: dict[str, ast.Module]) -> list[str]:
    """Paths and `ksearch_ray.` names in prose that name nothing in the repository: a path under one of the
    repository's folders (whole, from the package's folder, or a tail such as `run/engine.py`) that no file has,
    a dotted name whose module does not exist, or one that names something its module does not define."""
    folders = {Path(f).parts[0] for f in files if len(Path(f).parts) > 1}
    folders |= {part for f in files if f.startswith(("ksearch_ray/", "actors/")) for part in Path(f).parts[1:-1]}
    tracked = set(files)
    names: dict[str, set[str]] = {}  # a module's defined names, read once
    found = []
    for where, text in texts.items():
        for match in PATH_IN_TEXT.finditer(text):
            path = match.group(1)
            if path.split("/")[0] not in folders:
                continue  # another project's path (GPUMode's, a solution's own files), or a placeholder
            if path in tracked or f"ksearch_ray/{path}" in tracked or any(f.endswith("/" + path) for f in files):
                continue
            found.append(f"{where}: {path}")
        for match in DOTTED_IN_TEXT.finditer(text):
            parts = ["ksearch_ray", *match.group(1).strip(".").split(".")]
            if parts[1] in INSTALLED:
                continue
            cut = max((i for i in range(1, len(parts) + 1) if ".".join(parts[:i]) in package), default=0)
            if cut == 0:
                found.append(f"{where}: {'.'.join(parts)}")
                continue
            module = ".".join(parts[:cut])
            if cut < len(parts):
                if module not in names:
                    names[module] = _named_in(package[module])
                if parts[cut] not in names[module]:
                    found.append(f"{where}: {'.'.join(parts)}")
    return found


def _named_in(tree: ast.Module) -> set[str]:
    """What a module's text gives a name: its functions and classes, what it assigns, what it imports."""
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out.add(n.name)
        elif isinstance(n, ast.Assign | ast.AnnAssign):
            out |= {t.id for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)}
        elif isinstance(n, ast.ImportFrom | ast.Import):
            out |= {a.asname or a.name for a in n.names}
    return out


def _tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=False).stdout.split()
    if not out:
        pytest.skip("not a git checkout")
    return out


def test_docs_and_comments_name_only_what_exists():
    files = _tracked()
    texts = {f: prose(ROOT / f) for f in files
             if (f.endswith(".md") and not f.startswith("tasks/"))
             or (f.endswith(".py") and f.split("/")[0] in ("ksearch_ray", "actors", "tests", "experiments"))}
    package = {m: ast.parse(p.read_text()) for m, p in modules().items()}
    assert stale_names(texts, files, package) == []


def test_the_stale_name_check_finds_a_path_and_a_name_that_are_gone():
    files = ["ksearch_ray/run/engine.py", "ksearch_ray/run/__init__.py", "docs/a.md"]
    package = {"ksearch_ray.run.engine": ast.parse("class Search: ...\n"), "ksearch_ray.run": ast.parse("")}
    text = ("`run/engine.py` and `ksearch_ray.run.engine.Search` exist; `run/search.py`, `ksearch_ray.search.engine` and "
            "`ksearch_ray.run.engine.Gone` do not; GPUMode's problems/bioml/trimul/eval.py is not ours.")
    assert stale_names({"docs/a.md": text}, files, package) == [
        "docs/a.md: run/search.py", "docs/a.md: ksearch_ray.search.engine", "docs/a.md: ksearch_ray.run.engine.Gone"]
