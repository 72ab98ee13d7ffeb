"""FlashInfer-Bench data in and out: definitions + workloads as task bundles, solution JSON both ways.

A FlashInfer-Bench dataset (definitions/<op_type>/<name>.json with workloads/<op_type>/<name>.jsonl,
or any other layout, flat included) becomes one generated task bundle per definition, written to
a cache directory keyed by the content it was made from:

    task.json          from the definition (prose and tolerance from a bundled twin when one exists)
    definition.json    the definition, verbatim
    reference.py       inputs from ksearch_ray.taskspec.flashinfer_inputs (fresh page tables per seed);
                       math from the definition's "reference" source (which defines `run`), or,
                       without one, the bundled twin's reference
    workloads/all.jsonl
    solutions/         "reference" (the reference math as a candidate) and the twin's seeds

Solutions: FlashInfer-Bench's JSON (name, definition, author, spec{language, target_hardware,
entry_point "file::function", dependencies, destination_passing_style, binding}, sources[{path,
content}], description) maps onto a Solution; a destination-passing Python solution gets a small
generated adapter that allocates the outputs, since ksearch-ray calls value-returning entries.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from ksearch_ray.models import Language, Solution
from ksearch_ray.taskspec.flashinfer_inputs import unsupported_reason
from ksearch_ray.taskspec.task import Task, TaskError, Workload, bundled_tasks_dir

log = logging.getLogger(__name__)

FORMAT_VERSION = 1  # part of every generated bundle's cache key: bump when the layout changes
DEFAULT_TOLERANCE = {"rule": "flashinfer", "atol": 1e-2, "rtol": 1e-2}
ADAPTER_FILE = "_ksearch_dps_adapter.py"
_ADAPTER_TARGET = re.compile(r'^_TARGET_FILE = "(?P<file>[^"]+)"\n_TARGET = "(?P<fn>[^"]+)"$', re.MULTILINE)


# --- definitions and workloads -----------------------------------------------------------------


def is_definition(data: Any) -> bool:
    return isinstance(data, dict) and {"name", "axes", "inputs", "outputs"} <= set(data)


def workload_from_fib(record: Mapping[str, Any]) -> Workload:
    """A FlashInfer-Bench workload (a JSONL line, or its "workload" object) as a ksearch Workload:
    name = uuid, axes = the workload's axes, params = {"inputs": its input descriptors}."""
    body = record.get("workload", record)
    try:
        return Workload(name=body["uuid"], axes=body.get("axes", {}), params={"inputs": body.get("inputs", {})})
    except (KeyError, ValidationError) as exc:
        raise TaskError(f"not a FlashInfer-Bench workload: {exc}") from None


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
        workload = workload_from_fib(record)
        found.setdefault(record["definition"], {}).setdefault(workload.name, workload)
    return {name: list(by_uuid.values()) for name, by_uuid in found.items()}


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
    name = definition["name"]
    reason = unsupported_reason(definition)
    if reason is not None:
        raise TaskError(f"{name}: cannot synthesize inputs: {reason}")
    twin = bundled_twin(name)
    has_reference = bool(definition.get("reference"))
    if not has_reference and twin is None:
        raise TaskError(f"{name}: the definition has no reference and no bundled task has its name")
    lines = "\n".join(w.model_dump_json() for w in workloads) + "\n"
    definition_text = json.dumps(definition, indent=1)
    target = cache_dir / f"{name}-{_digest(definition_text, lines, _tree_text(twin) if twin else '')}"
    if (target / "task.json").is_file():
        return target

    cache_dir.mkdir(parents=True, exist_ok=True)
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
    try:
        os.replace(staging, target)
    except OSError:
        # Another process built the same bundle first; theirs is identical by construction.
        shutil.rmtree(staging, ignore_errors=True)
    return target


def default_cache_dir() -> Path:
    return Path(tempfile.gettempdir()) / "ksearch-ray-flashinfer"


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

    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    bundles: dict[str, Path] = {}
    for name, definition in definitions.items():
        if name not in workloads:
            log.warning("flashinfer dataset %s: definition %s has no workloads; skipped", root, name)
            continue
        try:
            bundles[name] = build_bundle(definition, list(workloads[name].values()), cache)
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
    binding: str | None = None


class _FibSolution(BaseModel):
    name: str
    definition: str
    author: str
    spec: _FibSpec
    sources: list[_FibSource] = Field(min_length=1)
    description: str | None = None


def solution_from_json(path: Path, task: Task) -> Solution:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise TaskError(f"{path}: not a readable JSON file ({exc})") from None
    return solution_from_dict(data, task, origin=str(path))


def solution_from_dict(data: Mapping[str, Any], task: Task, *, origin: str = "solution") -> Solution:
    try:
        fib = _FibSolution.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise TaskError(f"{origin}: {'.'.join(str(p) for p in first['loc'])}: {first['msg']}") from None
    if fib.definition != task.name:
        raise TaskError(f"{origin}: solution for definition {fib.definition}, not for task {task.name}")
    languages: dict[str, Language] = {"python": "python", "triton": "triton", "cuda": "cuda", "cpp": "cuda"}
    language = languages.get(fib.spec.language)
    if language is None:
        raise TaskError(f"{origin}: language {fib.spec.language} is not supported (python, triton, cuda, cpp)")
    if language == "cuda" and fib.spec.binding not in (None, "torch"):
        raise TaskError(f"{origin}: binding {fib.spec.binding} is not supported; CUDA builds as a torch extension")
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
    if fib.spec.destination_passing_style:
        if language == "cuda":
            raise TaskError(f"{origin}: destination-passing CUDA solutions are not supported; export it value-returning")
        sources[ADAPTER_FILE] = dps_adapter(task, entry_file, entry_point)
        entry_file, entry_point = ADAPTER_FILE, "run"
    return Solution(
        name=fib.name, task=task.name, language=language, entry_file=entry_file, entry_point=entry_point,
        sources=sources, author=fib.author, description=fib.description or "",
    )


def solution_to_json(solution: Solution, task: Task, *, target_hardware: str | list[str]) -> dict[str, Any]:
    """FlashInfer-Bench solution JSON; an imported destination-passing solution goes back as it came."""
    if solution.task != task.name:
        raise TaskError(f"solution {solution.name} belongs to task {solution.task}, not {task.name}")
    sources = dict(solution.sources)
    entry_file, entry_point, dps = solution.entry_file, solution.entry_point, False
    target = _ADAPTER_TARGET.search(sources.get(ADAPTER_FILE, "")) if entry_file == ADAPTER_FILE else None
    if target is not None:
        entry_file, entry_point, dps = target["file"], target["fn"], True
        del sources[ADAPTER_FILE]
    spec: dict[str, Any] = {
        "language": solution.language,
        "target_hardware": [target_hardware] if isinstance(target_hardware, str) else list(target_hardware),
        "entry_point": f"{entry_file}::{entry_point}",
        "dependencies": [],
        "destination_passing_style": dps,
    }
    if solution.language == "cuda":
        spec["binding"] = "torch"
    return {
        "name": solution.name,
        "definition": task.name,
        "author": solution.author,
        "spec": spec,
        "sources": [{"path": path, "content": text} for path, text in sorted(sources.items())],
        "description": solution.description,
    }


_ADAPTER = '''"""Destination-passing adapter generated by ksearch-ray; do not edit.

ksearch-ray calls value-returning entry points; this one allocates the outputs from the
definition's shapes, lets the FlashInfer-Bench solution write into them, and returns them.
"""

import importlib.util
from pathlib import Path

import torch

_TARGET_FILE = "{entry_file}"
_TARGET = "{entry_point}"
_CONST_AXES = {const_axes!r}
_INPUT_SHAPES = {input_shapes!r}
_OUTPUTS = {outputs!r}


def _load():
    spec = importlib.util.spec_from_file_location("ksearch_dps_target", Path(__file__).with_name(_TARGET_FILE))
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
'''


def dps_adapter(task: Task, entry_file: str, entry_point: str) -> str:
    d = task.definition
    const_axes = {k: int(v["value"]) for k, v in d.axes.items() if isinstance(v, dict) and v.get("type") == "const"}
    return _ADAPTER.format(
        entry_file=entry_file,
        entry_point=entry_point,
        const_axes=const_axes,
        input_shapes=[spec.shape for spec in d.inputs.values()],
        outputs=[(spec.shape or [], spec.dtype) for spec in d.outputs.values()],
    )
