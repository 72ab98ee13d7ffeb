"""An experiment grid: tasks × methods × widths × seeds (repetitions) at one budget, from YAML and flags.

    tasks: [trimul, gqa_paged_decode_h32_kv4_d128_ps1]
    methods: [ksearch, evolve, refine]
    widths: [8]
    seeds: 3                  # repetitions (random seeds 0, 1, 2), or a list of seeds
    rounds: 120               # budget per run; and/or
    max_cost_usd: 40
    references:               # per task: solutions to report and draw against (names or paths)
      gqa_paged_decode_h32_kv4_d128_ps1: [flashinfer]
    check_workloads: all      # the set each best kernel is checked and timed on at the end
    settings:                 # any setting of a run for every cell, in the run file's sections
      llm: {model: openai/gpt-5}

Each cell is one `ksearch run` in its own run directory, `<out>/runs/<task>-<method>-w<width>-s<seed>`,
configured by a YAML file beside it (`<run dir>.yaml`: the settings, the budget and the cell's own keys).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ksearch_ray.config import ConfigError

CPU_SETTINGS = {"search.noise_repeats": 1, "search.confirm_repeats": 0, "search.retime_best": False, "cluster.ray": False}
"""On the CPU path (Triton's interpreter: a TriMul evaluation takes tens of seconds) numbers only rank
variants on one machine: the grid takes the cheapest settings unless it names others (one measurement
of the baseline and the seed, no final re-timing, no independent re-timing of each new best: that
guards GPU timings against hostile code, and costs a whole evaluation; each run in its own process,
without Ray, since it has one evaluator anyway), and the `smoke` set where a task has one."""

OWNED = {"task", "run_dir", "search.method", "search.width", "search.random_seed", "budget.rounds", "budget.max_cost_usd"}
"""Settings the grid sets per cell."""


class Grid(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tasks: list[str] = Field(min_length=1, description="Task names or bundle paths.")
    methods: list[str] = Field(default_factory=lambda: ["ksearch"], min_length=1)
    widths: list[int] = Field(default_factory=lambda: [2], min_length=1)
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1, description="Random seeds, one run each.")
    rounds: int | None = Field(default=None, ge=1)
    max_cost_usd: float | None = Field(default=None, gt=0)
    references: dict[str, list[str]] = Field(default_factory=dict, description="Task -> reference solutions.")
    check_workloads: str = Field(default="all", description="Set the bests are checked on (else the runs' scoring set).")
    target_speedup: float | None = Field(default=None, gt=0, description="Width study: the speedup to reach.")
    settings: dict[str, Any] = Field(default_factory=dict, description="Run settings for every cell, in sections.")

    @field_validator("seeds", mode="before")
    @classmethod
    def _repetitions(cls, value: Any) -> Any:
        return list(range(value)) if isinstance(value, int) else value

    @field_validator("settings")
    @classmethod
    def _known_keys(cls, value: dict[str, Any]) -> dict[str, Any]:
        from ksearch_ray.config import flat_settings, validate_config

        value = nested(value)
        owned = set(flat_settings(value)) & OWNED
        if owned:
            raise ValueError(f"set by the grid for each cell, not in settings: {', '.join(sorted(owned))}")
        try:
            validate_config({**value, "task": "any"}, "settings")
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        return value


def nested(settings: dict[str, Any]) -> dict[str, Any]:
    """Settings in sections; dotted keys ("search.width") are sections too."""
    from ksearch_ray.config import set_path

    out: dict[str, Any] = {}
    for key, value in settings.items():
        key = key.replace("-", "_")
        if isinstance(value, dict) and key != "timing":
            for inner, inner_value in nested(value).items():
                set_path(out, f"{key}.{inner}", inner_value)
        else:
            set_path(out, key, value)
    return out


def load_grid(path: Path | None, overrides: dict[str, Any]) -> Grid:
    """The YAML file (if any), then the flags given (None = not given); one-line errors."""
    data: dict[str, Any] = {}
    if path is not None:
        if not Path(path).is_file():
            raise ConfigError(f"grid file not found: {path}")
        try:
            loaded = yaml.safe_load(Path(path).read_text()) or {}
        except yaml.YAMLError:
            raise ConfigError(f"{path}: not valid YAML") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: expected a mapping at the top level")
        data.update({k.replace("-", "_"): v for k, v in loaded.items()})
    settings = {**nested(data.get("settings") or {}), **nested(overrides.pop("settings", {}))}
    data.update({k: v for k, v in overrides.items() if v is not None})
    data["settings"] = settings
    try:
        grid = Grid.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "grid"
        raise ConfigError(f"{where}: {first['msg']}") from None
    if grid.rounds is None and grid.max_cost_usd is None:
        raise ConfigError("the grid needs a budget: rounds and/or max_cost_usd")
    return grid


class Cell(BaseModel):
    """One run of the grid."""

    task: str
    method: str
    width: int
    seed: int
    settings: dict[str, Any]

    @property
    def name(self) -> str:
        """Unique in a grid: also the run directory's name, and so the run's label in every frame."""
        return f"{Path(self.task).name}-{self.method}-w{self.width}-s{self.seed}"

    def run_dir(self, out: Path) -> Path:
        return Path(out) / "runs" / self.name

    def config(self) -> dict[str, Any]:
        """The cell's run configuration (the nested keys of a `--config` YAML file)."""
        from ksearch_ray.config import set_path

        config = nested(self.settings)
        config["task"] = self.task
        for path, value in (("search.method", self.method), ("search.width", self.width), ("search.random_seed", self.seed)):
            set_path(config, path, value)
        return config

    def setting(self, path: str) -> Any:
        from ksearch_ray.config import flat_settings

        return flat_settings(self.settings).get(path)


def budget(grid: Grid) -> dict[str, Any]:
    return {"budget.rounds": grid.rounds, "budget.max_cost_usd": grid.max_cost_usd}


def cells(grid: Grid, device: str | None) -> list[Cell]:
    """Every cell, tasks outermost; CPU-path defaults filled in where the grid names none."""
    from ksearch_ray.config import flat_settings, set_path
    from ksearch_ray.taskspec.task import find_task

    out = []
    for task_name in grid.tasks:
        flat = {**flat_settings(grid.settings), **{k: v for k, v in budget(grid).items() if v is not None}}
        # A cell runs in a directory of its own: paths are made absolute here, against ours.
        flat["task_dirs"] = [str(Path(d).expanduser().resolve()) for d in flat.get("task_dirs") or []]
        seed = flat.get("search.from_solution")
        if seed and Path(seed).exists():
            flat["search.from_solution"] = str(Path(seed).resolve())
        if (Path(task_name) / "task.json").is_file():
            task_name = str(Path(task_name).resolve())
        if device is not None:
            flat["evaluation.device"] = device
        if flat.get("evaluation.device") == "cpu":
            flat = {**CPU_SETTINGS, **flat}
            task = find_task(task_name, flat.get("task_dirs") or [])
            if "evaluation.workloads" not in flat and "smoke" in task.definition.workload_sets:
                flat["evaluation.workloads"] = "smoke"
        settings: dict[str, Any] = {}
        for path, value in flat.items():
            set_path(settings, path, value)
        for method in grid.methods:
            for width in grid.widths:
                for seed_ in grid.seeds:
                    out.append(Cell(task=task_name, method=method, width=width, seed=seed_, settings=settings))
    return out
