"""Task bundles: a directory holding everything needed to judge a kernel.

Layout of a bundle (see docs/architecture.md, "Task bundles"):

    task.json        definition: axes, inputs, outputs, constraints, prose, tolerance, score,
                     calling convention, named workload sets
    reference.py     generate_inputs(workload, seed, device, options), reference(inputs), and
                     pack_data(inputs) for tasks with the gpumode calling convention: trusted code
                     only in a bundle that shipped with the package (`Task.trusted`)
    workloads/*.jsonl
    solutions/<name>/solution.json + source files   (baseline and seed kernels)

Bundles are found by path, never imported by name: the bundle's reference.py is loaded from
its file under a private module name.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import operator
import os
from collections.abc import Callable, Iterable
from functools import cached_property
from pathlib import Path
from types import ModuleType
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, ValidationError

from ksearch_ray.models import Solution
from ksearch_ray.taskspec import flashinfer_format
from ksearch_ray.taskspec.spec import (  # the records of a bundle (a leaf: flashinfer_format needs nothing from here)
    TaskDefinition,
    TaskError,
    Workload,
    bundled_tasks_dir,
)


def load_module_file(path: Path, module_name: str) -> ModuleType:
    """Import one Python file under a private module name (not entered in sys.modules)."""
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise TaskError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Task:
    """A loaded bundle. Cheap to construct; reference code is loaded on first use."""

    def __init__(self, root: Path, definition: TaskDefinition):
        self.root = root
        self.definition = definition

    @property
    def name(self) -> str:
        return self.definition.name

    @cached_property
    def trusted(self) -> bool:
        """Whether the bundle shipped with the package (under `bundled_tasks_dir()`, links resolved):
        only then may its reference.py run in a trusted process. Every other bundle (--task-dir,
        KSEARCH_TASK_PATH, a path, a converted --dataset) brings code from outside: its reference and
        input generator run sandboxed, like a candidate (evaluation/reference.py)."""
        return self.root.resolve().is_relative_to(bundled_tasks_dir().resolve())

    @classmethod
    def load(cls, root: str | Path) -> Task:
        root = Path(root).resolve()
        spec_file = root / "task.json"
        if not spec_file.is_file():
            raise TaskError(f"{root} is not a task bundle: no task.json")
        try:
            definition = TaskDefinition.model_validate_json(spec_file.read_text())
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise TaskError(f"{spec_file}: {where}: {first['msg']}") from None
        seed = definition.default_seed
        if seed is not None and not (root / "solutions" / seed / "solution.json").is_file():
            raise TaskError(f"{spec_file}: default_seed {seed!r} is not a solution under {root / 'solutions'}")
        return cls(root, definition)

    # --- reference code (trusted only where `trusted`) -------------------------------------

    @cached_property
    def module(self) -> ModuleType:
        path = self.root / "reference.py"
        if not path.is_file():
            raise TaskError(f"task {self.name}: missing reference.py")
        return load_module_file(path, f"ksearch_task_{self.name}")

    def generate_inputs(
        self, workload: Workload, seed: int, device: str, options: frozenset[str] = frozenset()
    ) -> dict[str, Any]:
        return self.module.generate_inputs(workload, seed, device, options)

    def reference(self, inputs: dict[str, Any]) -> dict[str, Any]:
        return self.normalize_outputs(self.module.reference(inputs))

    def arguments(self, inputs: dict[str, Any]) -> tuple[Any, ...]:
        """The positional arguments of a call on `inputs` in the task's calling convention: GPUMode's one
        `data` tuple, or the inputs in order. Made before a timed call's clock starts, as eval.py's `data` is."""
        if self.definition.interface == "gpumode":
            return (self.module.pack_data(inputs),)
        return tuple(inputs.values())

    def call(self, entry: Callable[..., Any], inputs: dict[str, Any]) -> Any:
        """Call a candidate's entry point with the task's calling convention."""
        return entry(*self.arguments(inputs))

    def normalize_outputs(self, result: Any) -> dict[str, Any]:
        """A single tensor, a tuple in output order, or a dict by name -> dict by name."""
        names = list(self.definition.outputs)
        if isinstance(result, dict):
            return dict(result)
        if isinstance(result, (tuple, list)):
            if len(result) != len(names):
                raise ValueError(f"expected {len(names)} outputs ({', '.join(names)}), got {len(result)}")
            return dict(zip(names, result, strict=True))
        return {names[0]: result} if len(names) == 1 else {"__single__": result}

    # --- workloads ----------------------------------------------------------------------

    def workload_cost(self, workload: Workload) -> tuple[float, float] | None:
        """(FLOPs, bytes) one call of `workload` must at least cost, from task.json's formulas."""
        cost = self.definition.cost
        if cost is None:
            return None
        names = {k: v["value"] for k, v in self.definition.axes.items() if isinstance(v, dict) and "value" in v}
        names.update(workload.axes)
        try:
            return eval_formula(cost.flops, names), eval_formula(cost.bytes, names)
        except (KeyError, ValueError, ZeroDivisionError) as exc:
            raise TaskError(f"task {self.name}: cost formula for workload {workload.name}: {exc}") from None

    def workload_set_name(self, name: str, device: str) -> str:
        """On the CPU a set `X` means its reduced variant `X-cpu` where the bundle has one."""
        if device == "cpu" and f"{name}-cpu" in self.definition.workload_sets:
            return f"{name}-cpu"
        return name

    def workloads(self, name: str, device: str = "cuda") -> list[Workload]:
        resolved = self.workload_set_name(name, device)
        rel = self.definition.workload_sets.get(resolved)
        if rel is None:
            known = ", ".join(sorted(s for s in self.definition.workload_sets if not s.endswith("-cpu")))
            raise TaskError(f"task {self.name} has no workload set '{name}' (known: {known})")
        return read_workloads(self.root / rel)

    # --- solutions ----------------------------------------------------------------------

    def solution_names(self, *, include_unavailable: bool = False) -> list[str]:
        """The bundle's solutions; those whose `requires` modules are missing here only on request."""
        sol_dir = self.root / "solutions"
        if not sol_dir.is_dir():
            return []
        names = sorted(p.name for p in sol_dir.iterdir() if (p / "solution.json").is_file())
        return names if include_unavailable else [n for n in names if not self.missing_requirements(n)]

    def missing_requirements(self, name: str) -> list[str]:
        """Modules that solution `name` declares in `requires` and this Python cannot import."""
        return [m for m in _read_meta(self.root / "solutions" / name).requires if importlib.util.find_spec(m) is None]

    def solution(self, name: str) -> Solution:
        path = self.root / "solutions" / name
        if not (path / "solution.json").is_file():
            raise TaskError(f"task {self.name} has no solution '{name}' (known: {', '.join(self.solution_names())})")
        missing = self.missing_requirements(name)
        if missing:
            raise TaskError(f"solution {name} of task {self.name} needs the Python module {', '.join(missing)}, "
                            "which is not installed here")
        return load_solution_dir(path, self.name)

    def baseline(self) -> Solution:
        return self.solution(self.definition.baseline)


_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.Pow: operator.pow}


def eval_formula(text: str, names: dict[str, Any]) -> float:
    """Arithmetic over axis names; nothing else is evaluated (task.json is data, not code)."""

    def walk(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return float(node.value)
        if isinstance(node, ast.Name):
            if node.id not in names:
                raise KeyError(f"unknown axis {node.id!r}")
            return float(names[node.id])
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            return float(_BINARY[type(node.op)](walk(node.left), walk(node.right)))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -walk(node.operand)
        raise ValueError(f"not allowed in a formula: {ast.dump(node)[:60]}")

    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise ValueError(f"not a formula: {text!r}") from None
    return walk(tree)


def read_workloads(path: Path) -> list[Workload]:
    """A workload set: one workload per line, in ksearch-ray's shape ({name, axes, params}) or as a
    FlashInfer-Bench workload trace ({definition, workload: {uuid, axes, inputs}, ...})."""
    out = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TaskError(f"{path}:{lineno}: not JSON ({exc.msg})") from None
        try:
            if isinstance(record, dict) and "workload" in record:
                out.append(flashinfer_format.workload_from_trace(record))
            else:
                out.append(Workload.model_validate(record))
        except ValidationError as exc:
            raise TaskError(f"{path}:{lineno}: not a workload: {exc.errors()[0]['msg']}") from None
        except TaskError as exc:
            raise TaskError(f"{path}:{lineno}: {exc}") from None
    return out


class _SolutionMeta(BaseModel):
    name: str
    language: Literal["python", "triton", "cuda"]
    entry_file: str
    entry_point: str
    author: str = "ksearch-ray"
    description: str = ""
    prepare: str | None = Field(default=None, description="Untimed per-input setup function (trusted baselines only).")
    requires: list[Annotated[str, Field(pattern=r"^[A-Za-z_]\w*$")]] = Field(default=[], description="Optional Python modules the solution imports (a library "
                                "baseline such as flashinfer); without them the solution is not offered.")


def _read_meta(path: Path) -> _SolutionMeta:
    meta = path / "solution.json"
    if not meta.is_file():
        raise TaskError(f"{path}: not a solution directory (no solution.json); give a source file or a directory holding solution.json")
    try:
        return _SolutionMeta.model_validate_json(meta.read_text())
    except ValidationError as exc:
        raise TaskError(f"{path / 'solution.json'}: {exc.errors()[0]['msg']}") from None


def load_solution_dir(path: Path, task_name: str) -> Solution:
    meta = _read_meta(path)
    sources = {
        p.name: p.read_text()
        for p in sorted(path.iterdir())
        if p.is_file() and p.name != "solution.json" and p.suffix in SOURCE_SUFFIXES
    }
    if meta.entry_file not in sources:
        raise TaskError(f"{path}: entry file {meta.entry_file} is missing")
    return Solution(task=task_name, sources=sources, **meta.model_dump(exclude={"requires"}))


SOURCE_SUFFIXES = {".py", ".cu", ".cuh", ".cpp", ".cc", ".h", ".hpp"}


def solution_from_file(path: Path, task: Task, *, name: str | None = None) -> Solution:
    """A candidate given on the command line: a solution directory, or one source file."""
    if not path.exists():
        raise TaskError(f"no such file: {path}")
    if path.is_dir():
        return load_solution_dir(path, task.name)
    if path.suffix == ".json":  # FlashInfer-Bench solution JSON
        return flashinfer_format.solution_from_json(path, task)
    if path.suffix not in SOURCE_SUFFIXES:
        raise TaskError(f"{path}: not a source file (expected one of {', '.join(sorted(SOURCE_SUFFIXES))})")
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        raise TaskError(f"{path}: not a text file") from None
    language: Literal["cuda", "python"] = "cuda" if path.suffix in {".cu", ".cpp", ".cc"} else "python"
    return Solution(
        name=name or path.stem,
        task=task.name,
        language=language,
        entry_file=path.name,
        entry_point=task.definition.entry_point,
        sources={path.name: text},
        author="user",
    )


# --- finding bundles -----------------------------------------------------------------------

TASK_PATH_ENV = "KSEARCH_TASK_PATH"


def search_dirs(extra: Iterable[str | Path] = ()) -> list[Path]:
    dirs = [Path(p) for p in extra]
    dirs += [Path(p) for p in os.environ.get(TASK_PATH_ENV, "").split(os.pathsep) if p]
    dirs.append(bundled_tasks_dir())
    return dirs


def discover(extra: Iterable[str | Path] = ()) -> dict[str, Path]:
    """Task name -> bundle directory; earlier search directories win."""
    found: dict[str, Path] = {}
    for base in search_dirs(extra):
        if (base / "task.json").is_file():
            found.setdefault(_peek_name(base), base)
            continue
        if not base.is_dir():
            continue
        for spec in sorted(base.glob("**/task.json")):
            found.setdefault(_peek_name(spec.parent), spec.parent)
    return found


def _peek_name(root: Path) -> str:
    try:
        return str(json.loads((root / "task.json").read_text())["name"])
    except (OSError, ValueError, KeyError):
        return root.name


def find_task(name_or_path: str, extra: Iterable[str | Path] = ()) -> Task:
    path = Path(name_or_path)
    if (path / "task.json").is_file():
        return Task.load(path)
    found = discover(extra)
    if name_or_path not in found:
        known = ", ".join(sorted(found)) or "none"
        raise TaskError(f"unknown task '{name_or_path}' (known: {known})")
    return Task.load(found[name_or_path])
