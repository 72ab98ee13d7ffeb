"""FlashInfer-Bench's formats in and out: definitions, workloads, solutions (and, in
flashinfer_traces.py, evaluations as traces).

Reading. A FlashInfer-Bench dataset (definitions/<op_type>/<name>.json with workloads/<op_type>/<name>.jsonl,
or any other layout, flat included) becomes one generated task bundle per definition, written to
a private cache folder (private_dir.py: this user's alone, checked before use), named by a hash of
the content it was made from and reused only while its files match the manifest written with it:

    task.json          from the definition (prose and tolerance from a bundled twin when one exists)
    definition.json    the definition, verbatim
    reference.py       inputs from ksearch_ray.taskspec.flashinfer_inputs (fresh page tables per seed);
                       math from the definition's "reference" source (which defines `run`), or,
                       without one, the bundled twin's reference
    workloads/all.jsonl
    solutions/         "reference" (the reference math as a candidate) and the twin's seeds

Solutions: FlashInfer-Bench's JSON (name, definition, author, spec{language, target_hardware,
entry_point "file::function", dependencies, destination_passing_style, binding}, sources[{path,
content}], description) maps onto a Solution, read as the package reads it: destination-passing
unless it says otherwise, and a C++/CUDA solution without `binding` is a tvm-ffi one. ksearch-ray
calls value-returning entries, so a destination-passing solution (Python, Triton, or C++/CUDA with
the torch binding) gets a small generated adapter that allocates the outputs and calls it; tvm-ffi
solutions are refused in one line (ksearch-ray builds C++/CUDA as torch extensions).

Writing. `solution_to_json` gives what the package accepts, checked against its rules here (and by
the package itself where it is installed): names unique within a dataset (the content id is part
of the name), no empty author or file. Bundled definitions are FlashInfer-Bench definitions,
reference and tags included; workload files are FlashInfer-Bench workload traces.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

from pydantic import BaseModel, Field, ValidationError

from ksearch_ray.models import Language, Solution
from ksearch_ray.private_dir import (
    PrivateDirError,
    check_private,
    manifest_matches,
    private_dir,
    write_manifest,
)
from ksearch_ray.private_dir import cache_dir as user_cache_dir
from ksearch_ray.taskspec.spec import TaskDefinition, TaskError, Workload, bundled_tasks_dir

log = logging.getLogger(__name__)

FORMAT_VERSION = 2  # part of every generated bundle's cache key: bump when the layout changes
DEFAULT_TOLERANCE = {"rule": "flashinfer", "atol": 1e-2, "rtol": 1e-2}
ADAPTER_FILE = "_ksearch_dps_adapter.py"
_ADAPTER_TARGET = re.compile(
    r'^_TARGET_FILE = "(?P<file>[^"]+)"\n_TARGET = "(?P<fn>[^"]+)"\n_TARGET_LANGUAGE = "(?P<lang>[^"]+)"$', re.MULTILINE
)
FIB_LANGUAGES = ("python", "triton", "cpp", "cuda", "tilelang")  # the package's SupportedLanguages
FIB_STATUSES = ("PASSED", "INCORRECT_SHAPE", "INCORRECT_NUMERICAL", "INCORRECT_DTYPE", "RUNTIME_ERROR",
                "COMPILE_ERROR", "TIMEOUT")  # the package's EvaluationStatus


class CacheRefused(TaskError):
    """The cache of converted datasets (or a bundle in it) is not this user's alone: nothing there is used."""


class TaskLike(Protocol):
    """What the conversions need of a task: its name and task.json's records (a Task is one)."""

    @property
    def name(self) -> str: ...

    @property
    def definition(self) -> TaskDefinition: ...


# --- definitions --------------------------------------------------------------------------------


def is_definition(data: Any) -> bool:
    return isinstance(data, dict) and {"name", "axes", "inputs", "outputs"} <= set(data)


def definition_problems(data: Mapping[str, Any]) -> list[str]:
    """Why FlashInfer-Bench's Definition model would refuse `data` (empty when it would not):
    its field rules and validators, restated so that nothing is written that the package refuses."""
    problems = [f"{key} is missing or empty" for key in ("name", "op_type", "reference") if not data.get(key)]
    for key in ("axes", "inputs", "outputs"):
        if not isinstance(data.get(key), dict):
            problems.append(f"{key} is not an object")
    if problems:
        return problems
    try:
        tree = ast.parse(data["reference"])
        if not any(isinstance(node, ast.FunctionDef) and node.name == "run" for node in tree.body):
            problems.append("reference defines no top-level run()")
    except SyntaxError as exc:
        problems.append(f"reference is not valid Python ({exc.msg})")
    if set(data["inputs"]) & set(data["outputs"]):
        problems.append("an input and an output share a name")
    for name, spec in {**data["inputs"], **data["outputs"]}.items():
        for axis in spec.get("shape") or []:
            if axis not in data["axes"]:
                problems.append(f"{name} names undefined axis {axis}")
    for constraint in data.get("constraints", []):
        try:
            ast.parse(constraint, mode="eval")
        except SyntaxError:
            problems.append(f"constraint {constraint!r} is not a Python expression")
    return problems


def bundle_definition(task_root: Path) -> dict[str, Any]:
    """The FlashInfer-Bench definition of a bundle: its definition.json, which must be a valid one."""
    path = Path(task_root) / "definition.json"
    if not path.is_file():
        raise TaskError(f"{task_root} has no definition.json: it is not a FlashInfer-Bench definition")
    definition = json.loads(path.read_text())
    problems = definition_problems(definition)
    if problems:
        raise TaskError(f"{path}: not a valid FlashInfer-Bench definition: {'; '.join(problems)}")
    return definition


# --- workloads ----------------------------------------------------------------------------------


def workload_from_trace(record: Mapping[str, Any]) -> Workload:
    """A FlashInfer-Bench workload (a workload-trace line, or its "workload" object) as a ksearch
    Workload: name = uuid, axes = the workload's axes, params = {"inputs": its input descriptors}."""
    body = record.get("workload", record)
    if not isinstance(body, Mapping) or not body.get("uuid"):
        raise TaskError("not a FlashInfer-Bench workload (no workload.uuid)")
    try:
        return Workload(name=body["uuid"], axes=body.get("axes", {}), params={"inputs": body.get("inputs", {})})
    except ValidationError as exc:
        raise TaskError(f"not a FlashInfer-Bench workload: {exc.errors()[0]['msg']}") from None


def workload_to_trace(definition: str, workload: Workload) -> dict[str, Any]:
    """A workload as a FlashInfer-Bench workload trace (solution and evaluation null)."""
    extra = set(workload.params) - {"inputs"}
    if extra:
        raise TaskError(f"workload {workload.name} has generator parameters FlashInfer-Bench cannot hold: {sorted(extra)}")
    return {"definition": definition, "solution": None,
            "workload": {"uuid": workload.name, "axes": dict(workload.axes), "inputs": workload.params.get("inputs", {})},
            "evaluation": None}


def read_fib_workloads(path: Path) -> dict[str, list[Workload]]:
    """Workloads of a JSONL file by definition name; trace lines count too, deduplicated by uuid."""
    found: dict[str, dict[str, Workload]] = {}
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TaskError(f"{path}:{lineno}: not JSON ({exc.msg})") from None
        if not isinstance(record, dict) or "definition" not in record or "workload" not in record:
            continue
        try:
            workload = workload_from_trace(record)
        except TaskError as exc:
            raise TaskError(f"{path}:{lineno}: {exc}") from None
        found.setdefault(record["definition"], {}).setdefault(workload.name, workload)
    return {name: list(by_uuid.values()) for name, by_uuid in found.items()}


# --- datasets as generated bundles --------------------------------------------------------------


def task_json(
    definition: Mapping[str, Any], *, workload_sets: Mapping[str, str], twin: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """task.json for a definition; prose, tolerance and compat options come from a bundled twin."""
    if twin is not None:
        description, tolerance = twin["description"], twin["tolerance"]
        compat = twin.get("compat_options", {})
    else:
        description = _generic_description(definition)
        tolerance = dict(DEFAULT_TOLERANCE, required_fraction=0.95 if definition.get("op_type") == "moe" else 1.0)
        compat = {}
    return {
        "name": definition["name"],
        "description": description,
        "axes": definition["axes"],
        "inputs": definition["inputs"],
        "outputs": definition["outputs"],
        "constraints": definition.get("constraints", []),
        "interface": "flashinfer",
        "entry_point": "run",
        "tolerance": tolerance,
        "score": {"kind": "mean_speedup"},
        "workload_sets": dict(workload_sets),
        "baseline": "reference",
        "compat_options": compat,
    }


def _generic_description(definition: Mapping[str, Any]) -> str:
    inputs = ", ".join(definition["inputs"])
    outputs = ", ".join(definition["outputs"])
    return (
        f"{definition.get('description', definition['name'])}\n\n"
        f"Interface (FlashInfer-Bench, value-returning): a Python module defining run({inputs}) that "
        f"returns ({outputs}) in that order, with the shapes and dtypes of the definition; scalars are "
        "Python numbers. Inputs are synthesized afresh for every evaluation (float tensors N(0,1), fp8 as "
        "N(0,1) clamped to [-2, 2], page tables and request lengths redrawn from the seed with the workload's "
        "totals), so nothing derived from one call's inputs may be reused for the next.\n\n"
        "Tolerance (FlashInfer-Bench's rule): an element fails when |x - y| > 1e-2 and |x - y|/|y| > 1e-2; "
        "no NaN, and an infinity only where the reference has the same one."
    )


# --- generated bundles --------------------------------------------------------------------------


def bundled_twin(name: str, search: Iterable[Path] | None = None) -> Path | None:
    """The bundled task of the same name under tasks/flashinfer, if there is one."""
    for base in search if search is not None else [bundled_tasks_dir() / "flashinfer"]:
        candidate = Path(base) / name
        if (candidate / "task.json").is_file() and (candidate / "definition.json").is_file():
            return candidate
    return None


_REFERENCE_STUB = '''"""Generated by ksearch_ray.taskspec.flashinfer_format from a FlashInfer-Bench definition; do not edit.

Inputs: ksearch_ray.taskspec.flashinfer_inputs (fresh page tables and tensors per seed).
Math: `run` of the definition's own reference source, definition_reference.py.
"""

import importlib.util
import json
from pathlib import Path

from ksearch_ray.taskspec.flashinfer_inputs import synthesize

_HERE = Path(__file__).parent
DEFINITION = json.loads((_HERE / "definition.json").read_text())


def _reference_run():
    spec = importlib.util.spec_from_file_location(
        "ksearch_fib_reference_" + DEFINITION["name"], _HERE / "definition_reference.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.run


_RUN = _reference_run()


def generate_inputs(workload, seed, device, options=frozenset()):
    return synthesize(DEFINITION, workload, seed, device, options)


def reference(inputs):
    return _RUN(*inputs.values())
'''


def _digest(*parts: str) -> str:
    h = hashlib.sha256(f"v{FORMAT_VERSION}".encode())
    for part in parts:
        h.update(b"\0" + part.encode())
    return h.hexdigest()[:16]


_BUNDLE_SUFFIXES = {".py", ".json", ".jsonl", ".cu", ".cuh", ".cpp", ".cc", ".h", ".hpp"}


def _tree_text(root: Path) -> str:
    """The text of a bundle's files, for the cache key (bytecode caches and the like left out)."""
    files = (p for p in sorted(root.rglob("*")) if p.is_file() and p.suffix in _BUNDLE_SUFFIXES)
    return "\n".join(f"{p.relative_to(root)}:{p.read_text()}" for p in files if "__pycache__" not in p.parts)


def build_bundle(definition: Mapping[str, Any], workloads: list[Workload], cache_dir: Path) -> Path:
    """Write (or reuse) the generated bundle of one definition; returns its directory."""
    from ksearch_ray.taskspec.flashinfer_inputs import unsupported_reason  # torch: only when bundles are made

    name = definition["name"]
    reason = unsupported_reason(definition)
    if reason is not None:
        raise TaskError(f"{name}: cannot synthesize inputs: {reason}")
    twin = bundled_twin(name)
    has_reference = bool(definition.get("reference"))
    if not has_reference and twin is None:
        raise TaskError(f"{name}: the definition has no reference and no bundled task has its name")
    lines = "\n".join(json.dumps(workload_to_trace(name, w)) for w in workloads) + "\n"
    definition_text = json.dumps(definition, indent=1)
    key = _digest(definition_text, lines, _tree_text(twin) if twin else '')
    target = cache_dir / f"{name}-{key}"
    if target.exists() or target.is_symlink():
        # Reused only when it is this user's alone and holds exactly what was written (the manifest);
        # a folder someone else owns or can write is refused, a damaged one of ours is rebuilt.
        try:
            check_private(target)
        except PrivateDirError as exc:
            raise CacheRefused(f"cached bundle refused: {exc}") from None
        if manifest_matches(target, key):
            return target
        log.warning("cached bundle %s does not match its manifest; rebuilding it", target)
        doomed = Path(tempfile.mkdtemp(prefix=f".{name}-stale-", dir=cache_dir))
        with contextlib.suppress(FileNotFoundError):
            os.replace(target, doomed / "bundle")
        shutil.rmtree(doomed, ignore_errors=True)

    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=cache_dir))
    (staging / "definition.json").write_text(definition_text)
    (staging / "workloads").mkdir()
    (staging / "workloads" / "all.jsonl").write_text(lines)
    sets = {"all": "workloads/all.jsonl"}
    twin_spec: dict[str, Any] | None = None
    if twin is not None:
        twin_spec = json.loads((twin / "task.json").read_text())
        # The twin's reduced CPU sets and the paper's feedback set carry over unchanged.
        for set_name, rel in twin_spec["workload_sets"].items():
            if set_name != "all":
                shutil.copyfile(twin / rel, staging / rel)
                sets[set_name] = rel
        shutil.copytree(twin / "solutions", staging / "solutions", ignore=shutil.ignore_patterns("__pycache__", "build"))
    if has_reference:
        (staging / "definition_reference.py").write_text(definition["reference"])
        (staging / "reference.py").write_text(_REFERENCE_STUB)
        ref_dir = staging / "solutions" / "reference"
        shutil.rmtree(ref_dir, ignore_errors=True)
        ref_dir.mkdir(parents=True)
        (ref_dir / "main.py").write_text(definition["reference"])
        (ref_dir / "solution.json").write_text(json.dumps({
            "name": "reference", "language": "python", "entry_file": "main.py", "entry_point": "run",
            "author": "flashinfer-bench", "description": "The definition's own reference implementation.",
        }, indent=2))
    else:
        assert twin is not None
        shutil.copyfile(twin / "reference.py", staging / "reference.py")
    (staging / "task.json").write_text(json.dumps(task_json(definition, workload_sets=sets, twin=twin_spec), indent=2))
    write_manifest(staging, key)
    _readable_not_writable(staging)  # others may read (a sandboxed worker as `nobody`), none but us may write
    try:
        os.replace(staging, target)
    except OSError:
        # Another process built the same bundle first; theirs is identical by construction.
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _readable_not_writable(root: Path) -> None:
    for p in [root, *root.rglob("*")]:
        if not p.is_symlink():
            p.chmod(0o755 if p.is_dir() else 0o644)


def default_cache_dir() -> Path:
    """Where converted datasets are kept: the user's private cache (private_dir.py), never a shared /tmp path."""
    return user_cache_dir("flashinfer")


def load_dataset(directory: str | Path, *, cache_dir: str | Path | None = None) -> dict[str, Path]:
    """Definition name -> generated bundle, for every definition under `directory` that has
    workloads; definitions that cannot be made into a task are logged and left out."""
    root = Path(directory)
    if not root.is_dir():
        raise TaskError(f"no such directory: {root}")
    definitions: dict[str, dict[str, Any]] = {}
    for path in sorted(root.rglob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue  # not every .json in a dataset is ours to read
        if is_definition(data):
            definitions.setdefault(data["name"], data)
    workloads: dict[str, dict[str, Workload]] = {}
    for path in sorted(root.rglob("*.jsonl")):
        for name, found in read_fib_workloads(path).items():
            for w in found:
                workloads.setdefault(name, {}).setdefault(w.name, w)

    try:
        cache = private_dir(Path(cache_dir)) if cache_dir is not None else default_cache_dir()
    except PrivateDirError as exc:
        raise CacheRefused(f"dataset cache refused: {exc}") from None
    bundles: dict[str, Path] = {}
    for name, definition in definitions.items():
        if name not in workloads:
            log.warning("flashinfer dataset %s: definition %s has no workloads; skipped", root, name)
            continue
        try:
            bundles[name] = build_bundle(definition, list(workloads[name].values()), cache)
        except CacheRefused:
            raise  # never skipped: someone else may hold the cache
        except TaskError as exc:
            log.warning("flashinfer dataset %s: %s; skipped", root, exc)
    return bundles


# --- solutions ----------------------------------------------------------------------------------


class _FibSource(BaseModel):
    path: str
    content: str


class _FibSpec(BaseModel):
    language: str
    target_hardware: list[str] = Field(min_length=1)
    entry_point: str
    dependencies: list[str] = Field(default_factory=list)
    destination_passing_style: bool = True  # FlashInfer-Bench's default
    binding: str | None = None  # FlashInfer-Bench reads None as tvm-ffi for C++/CUDA


class _FibSolution(BaseModel):
    name: str
    definition: str
    author: str
    spec: _FibSpec
    sources: list[_FibSource] = Field(min_length=1)
    description: str | None = None


def solution_from_json(path: Path, task: TaskLike) -> Solution:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise TaskError(f"{path}: not a readable JSON file ({exc})") from None
    return solution_from_dict(data, task, origin=str(path))


def solution_from_dict(data: Mapping[str, Any], task: TaskLike, *, origin: str = "solution") -> Solution:
    """A FlashInfer-Bench solution as a Solution, read as the package reads it."""
    if not isinstance(data, Mapping):
        kind = "a list" if isinstance(data, list) else f"a JSON {type(data).__name__}"
        raise TaskError(f"{origin}: is {kind}, not a FlashInfer-Bench solution (one JSON object with name, definition, "
                        "spec and sources)")
    try:
        fib = _FibSolution.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise TaskError(f"{origin}: {'.'.join(str(p) for p in first['loc'])}: {first['msg']}") from None
    if fib.definition != task.name:
        raise TaskError(f"{origin}: solution for definition {fib.definition}, not for task {task.name}")
    lang = fib.spec.language
    if lang not in ("python", "triton", "cuda", "cpp"):
        raise TaskError(f"{origin}: language {lang} is not supported (python, triton, cuda, cpp)")
    native = lang in ("cuda", "cpp")
    if native and fib.spec.binding != "torch":
        implied = " (what FlashInfer-Bench reads when spec.binding is absent)" if fib.spec.binding is None else ""
        raise TaskError(
            f"{origin}: the {fib.spec.binding or 'tvm-ffi'} binding{implied} is not supported: ksearch-ray builds "
            "C++/CUDA as a torch extension; give the solution \"binding\": \"torch\" and a PYBIND11_MODULE")
    entry_file, sep, entry_point = fib.spec.entry_point.partition("::")
    if not sep or not entry_file or not entry_point or "::" in entry_point:
        raise TaskError(f"{origin}: entry_point {fib.spec.entry_point!r} is not 'file::function'")
    sources: dict[str, str] = {}
    for src in fib.sources:
        if "/" in src.path or "\\" in src.path or src.path.startswith("."):
            raise TaskError(f"{origin}: source path {src.path!r} is not a plain file name (nested paths are not supported)")
        if src.path in sources:
            raise TaskError(f"{origin}: duplicate source path {src.path}")
        sources[src.path] = src.content
    if entry_file not in sources:
        raise TaskError(f"{origin}: entry file {entry_file} is not among the sources")
    language: Language = "cuda" if native else lang  # type: ignore[assignment]
    if fib.spec.destination_passing_style:
        if native and not entry_file.endswith((".cu", ".cpp", ".cc")):
            raise TaskError(f"{origin}: entry file {entry_file} of a C++/CUDA solution is not a .cu, .cpp or .cc file")
        sources[ADAPTER_FILE] = dps_adapter(task, entry_file, entry_point, language)
        entry_file, entry_point = ADAPTER_FILE, "run"
        if native:
            language = "python"  # the adapter is Python; it builds the extension as a CUDA candidate's is built
    return Solution(
        name=fib.name, task=task.name, language=language, entry_file=entry_file, entry_point=entry_point,
        sources=sources, author=fib.author, description=fib.description or "",
    )


def export_name(solution: Solution, task: TaskLike) -> str:
    """The solution's name in a FlashInfer-Bench dataset, where names must be unique across all
    definitions: <definition>_<name>_<first 8 of the content id>, so that `reference` or
    `triton_seed` of two definitions, or two versions of one, never collide. Idempotent."""
    tag = solution.id[:8]
    base = re.sub(r"[^A-Za-z0-9_.-]+", "_", solution.name).strip("_") or "solution"
    if base.endswith(f"_{tag}"):
        return base
    if not base.startswith(task.name):
        base = f"{task.name}_{base}"
    return f"{base}_{tag}"


def solution_to_json(solution: Solution, task: TaskLike, *, target_hardware: str | list[str]) -> dict[str, Any]:
    """FlashInfer-Bench solution JSON; an imported destination-passing solution goes back as it came.
    Checked against the package's rules before it is returned: what it refuses is never written."""
    if solution.task != task.name:
        raise TaskError(f"solution {solution.name} belongs to task {solution.task}, not {task.name}")
    sources = dict(solution.sources)
    language: str = solution.language
    entry_file, entry_point, dps = solution.entry_file, solution.entry_point, False
    target = _ADAPTER_TARGET.search(sources.get(ADAPTER_FILE, "")) if entry_file == ADAPTER_FILE else None
    if target is not None:
        entry_file, entry_point, language, dps = target["file"], target["fn"], target["lang"], True
        del sources[ADAPTER_FILE]
    spec: dict[str, Any] = {
        "language": language,
        "target_hardware": [target_hardware] if isinstance(target_hardware, str) else list(target_hardware),
        "entry_point": f"{entry_file}::{entry_point}",
        "dependencies": [],
        "destination_passing_style": dps,
    }
    if language == "cuda":
        spec["binding"] = "torch"
    payload = {
        "name": export_name(solution, task),
        "definition": task.name,
        "author": solution.author or "unknown",  # the package refuses an empty author
        "spec": spec,
        # An empty file is the same program as a one-newline file; the package refuses empty content.
        "sources": [{"path": path, "content": text or "\n"} for path, text in sorted(sources.items())],
        "description": solution.description,
    }
    problems = solution_problems(payload)
    if problems:
        raise TaskError(f"solution {solution.name} cannot be written as FlashInfer-Bench JSON: {'; '.join(problems)}")
    return payload


def solution_problems(data: Mapping[str, Any]) -> list[str]:
    """Why FlashInfer-Bench's Solution model would refuse `data` (empty when it would not)."""
    problems = [f"{key} is empty" for key in ("name", "definition", "author") if not data.get(key)]
    spec = data.get("spec") or {}
    if spec.get("language") not in FIB_LANGUAGES:
        problems.append(f"language {spec.get('language')!r} is not one of {', '.join(FIB_LANGUAGES)}")
    if not spec.get("target_hardware"):
        problems.append("target_hardware is empty")
    entry = str(spec.get("entry_point", ""))
    if entry.count("::") != 1:
        problems.append(f"entry_point {entry!r} is not 'file::function'")
    if spec.get("binding") not in (None, "torch", "tvm-ffi"):
        problems.append(f"binding {spec.get('binding')!r} is not torch or tvm-ffi")
    paths = [str(src.get("path", "")) for src in data.get("sources", [])]
    if not paths:
        problems.append("there are no sources")
    for src in data.get("sources", []):
        path = str(src.get("path", ""))
        if not path or PurePosixPath(path).is_absolute() or ".." in PurePosixPath(path).parts:
            problems.append(f"source path {path!r} is empty, absolute or leaves the solution")
        if not src.get("content"):
            problems.append(f"source {path} is empty")
    if len(set(paths)) != len(paths):
        problems.append("two sources share a path")
    if entry.count("::") == 1 and entry.split("::")[0] not in paths:
        problems.append(f"entry file {entry.split('::')[0]} is not among the sources")
    return problems


_ADAPTER = """\"\"\"Destination-passing adapter generated by ksearch-ray; do not edit.

ksearch-ray calls value-returning entry points; this one allocates the outputs from the
definition's shapes, lets the FlashInfer-Bench solution write into them, and returns them. A C++/CUDA
target is built here, at import, with the builder and flags every CUDA candidate is built with.
\"\"\"

import importlib.util
from pathlib import Path

import torch

_TARGET_FILE = "{entry_file}"
_TARGET = "{entry_point}"
_TARGET_LANGUAGE = "{language}"
_CONST_AXES = {const_axes!r}
_INPUT_SHAPES = {input_shapes!r}
_OUTPUTS = {outputs!r}


def _load():
    here = Path(__file__).parent
    if _TARGET_LANGUAGE == "cuda":
        from ksearch_ray.evaluation.sandbox.build import arch_for, compile_extension

        archs = [arch_for(*torch.cuda.get_device_capability())] if torch.cuda.is_available() else []
        module = compile_extension(here, here.parent / "dps_build", __name__ + "_ext", archs)
    else:
        spec = importlib.util.spec_from_file_location(__name__ + "_target", here / _TARGET_FILE)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return getattr(module, _TARGET)


_impl = _load()


def run(*args):
    axes = dict(_CONST_AXES)
    device = None
    for shape, value in zip(_INPUT_SHAPES, args):
        if shape is None or not isinstance(value, torch.Tensor):
            continue
        device = device or value.device
        for dim, size in zip(shape, value.shape):
            if isinstance(dim, str):
                axes.setdefault(dim, int(size))
    outs = [
        torch.empty([axes[d] if isinstance(d, str) else d for d in shape], dtype=getattr(torch, dtype), device=device)
        for shape, dtype in _OUTPUTS
    ]
    _impl(*args, *outs)
    return outs[0] if len(outs) == 1 else tuple(outs)
"""


def dps_adapter(task: TaskLike, entry_file: str, entry_point: str, language: Language = "python") -> str:
    d = task.definition
    const_axes = {k: int(v["value"]) for k, v in d.axes.items() if isinstance(v, dict) and v.get("type") == "const"}
    return _ADAPTER.format(
        entry_file=entry_file,
        entry_point=entry_point,
        language=language,
        const_axes=const_axes,
        input_shapes=[spec.shape for spec in d.inputs.values()],
        outputs=[(spec.shape or [], spec.dtype) for spec in d.outputs.values()],
    )
