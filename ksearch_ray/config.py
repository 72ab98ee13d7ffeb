"""Run configuration: defaults, then a YAML file, then command-line flags; validated once.

The resolved `RunConfig` is written into the run's manifest and handed to every actor, so a
resumed run uses exactly the configuration it started with.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ksearch_ray.llm.types import LLMConfig


class ConfigError(Exception):
    """Bad configuration; the message is one line for the user."""


class RunConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    task: str = Field(description="Task name or bundle path.")
    task_dirs: list[str] = Field(default_factory=list, description="Extra directories of task bundles.")
    model: str | None = Field(default=None, description="litellm model string; none = the offline policy.")
    api_base: str | None = Field(default=None, description="OpenAI-compatible server URL (vLLM, SGLang, Ollama).")
    api_key_env: str | None = Field(default=None, description="Environment variable holding the API key.")
    reasoning_effort: str | None = None
    temperature: float | None = None
    max_tokens: int | None = Field(default=None, gt=0)
    llm_timeout_s: float = Field(default=600.0, gt=0)
    llm_max_retries: int = Field(default=4, ge=0)
    llm_backoff_base_s: float = Field(default=2.0, ge=0)
    llm_concurrency: int = Field(default=8, ge=1, description="LLM calls in flight per planner/coder actor.")
    method: Literal["ksearch", "evolve", "refine"] = Field(
        default="ksearch",
        description="Search method: ksearch (the world-model search), evolve (an evolutionary program database, "
        "OpenEvolve-style) or refine (improve or debug the best so far, no world model).",
    )
    random_seed: int = Field(default=0, ge=0, description="Seed of the method's random choices (evolve's sampling); repetitions differ by it.")
    evolve_islands: int = Field(default=3, ge=1, description="evolve: populations that evolve apart, exchanging their best now and then.")
    evolve_inspirations: int = Field(default=2, ge=0, description="evolve: other programs shown beside the parent.")
    evolve_migration_interval: int = Field(
        default=10, ge=1, description="evolve: children evaluated between migrations (each island's best copied to the next)."
    )
    width: int = Field(default=2, ge=1, description="Action cycles in parallel (the search width W).")
    rounds: int = Field(default=40, ge=1, description="Budget of code generations.")
    stagnation_window: int = Field(default=5, ge=1, description="Non-improving attempts in a row that end a cycle.")
    parent_patience: int = Field(
        default=5, ge=1, description="Attempts in a row, after one passed, that leave the cycle no faster than its parent: the cycle ends."
    )
    lease_ttl_s: float = Field(default=3600.0, gt=0, description="A cycle that stops reporting this long loses its action.")
    prompt_budget_tokens: int = Field(
        default=100_000, ge=2_000, description="Largest prompt, in tokens (estimated); fits a 128k-context model with room to answer."
    )
    structured_output: Literal["auto", "on", "off"] = Field(
        default="auto", description="Ask for JSON-schema replies from the planner: auto = where litellm says the model supports it."
    )
    planner_reasks: int = Field(default=1, ge=0, description="Times a planner reply that cannot be used is asked again, with the reasons.")
    price_per_mtok: tuple[float, float] | None = Field(
        default=None, description="USD per million prompt and completion tokens, for a model litellm has no price for."
    )
    max_llm_tokens: int | None = Field(default=None, gt=0, description="Budget of LLM tokens (prompt + completion).")
    max_difficulty: int = Field(default=4, ge=1, le=5)
    relax_difficulty_at_speedup: float | None = Field(default=1.5, gt=0)
    max_cost_usd: float | None = Field(default=None, ge=0)
    max_wall_s: float | None = Field(default=None, gt=0, description="Wall-clock budget in seconds.")
    from_solution: str | None = Field(default=None, description="Seed: a solution name of the task, or a file.")
    device: Literal["cuda", "cpu"] | None = Field(default=None, description="Default: cuda if Ray sees GPUs.")
    evaluators: int | None = Field(default=None, ge=1, description="Default: one per GPU, or one on the CPU.")
    evaluator_cpus: float = Field(default=1.0, gt=0, description="num_cpus reserved by each evaluator actor.")
    evaluator_gpus: bool = Field(
        default=False, description="Reserve one GPU per evaluator even on --device cpu (tests with fake GPUs)."
    )
    build_pool: bool = Field(
        default=True,
        description="Compile CUDA/C++ candidates in CPU build tasks ahead of their evaluation (false: inside the "
        "evaluation, on the evaluator's GPU, as before).",
    )
    build_cpus: float = Field(default=2.0, gt=0, description="num_cpus of each build task (also its ninja MAX_JOBS).")
    build_resource: str | None = Field(
        default=None,
        description="A custom Ray resource builds ask a little of, so they run only on nodes declaring it "
        "(cluster.yaml's CPU build nodes declare ksearch_build); none: any node with free CPUs.",
    )
    build_timeout_s: float = Field(default=900.0, gt=0, description="A build that gives no result this long is a TIMEOUT.")
    scratch_dir: str | None = Field(
        default=None,
        description="Node-local working directory on every node: the build cache, build sandboxes, and the sandboxes "
        "of evaluators away from the driver's node. Default: <system temp>/ksearch-ray-<uid>.",
    )
    evaluator_replace_timeout_s: float = Field(
        default=600.0, gt=0,
        description="An evaluator started to replace a lost one and not running after this long is given up.",
    )
    language: Literal["triton", "cuda", "python"] = Field(default="triton", description="What the LLM coder writes.")
    workloads: str | None = Field(default=None, description="Workload set that scores candidates.")
    mode: Literal["fresh", "reuse"] = "fresh"
    eval_idle_timeout_s: float = Field(default=180.0, gt=0, description="A candidate silent this long is a hang.")
    noise_repeats: int = Field(
        default=2, ge=1,
        description="Measurements of the baseline (per evaluator) and of the seed in a run's first session: the noise estimate.",
    )
    retime_best: bool = Field(
        default=True, description="Believe a new best only once a second, independent measurement agrees with the first."
    )
    autotune_variants: int = Field(
        default=0, ge=0,
        description="Evaluations the tuner may spend on the tunables of each passed candidate that declares some (0: no tuning).",
    )
    confirm_repeats: int = Field(
        default=3, ge=0, description="Interleaved re-timings of the best against the baseline at the end (0: none)."
    )
    isolation: Literal["require", "best-effort", "off"] = Field(
        default="best-effort",
        description="Candidate isolation (namespaces): require = refuse to evaluate on a host without it; "
        "best-effort = use what the host offers and warn about what is lost; off = none (debugging).",
    )
    run_dir: str | None = Field(default=None, description="Default: runs/<run-id>.")
    ray_address: str | None = Field(default=None, description="Attach to this cluster; default: auto / local.")
    progress: bool = True


    def llm_config(self) -> LLMConfig:
        """What the LLM client needs, from this run's settings."""
        assert self.model is not None
        return LLMConfig(
            model=self.model, api_base=self.api_base, api_key_env=self.api_key_env, temperature=self.temperature,
            max_tokens=self.max_tokens, reasoning_effort=self.reasoning_effort, timeout_s=self.llm_timeout_s,
            max_retries=self.llm_max_retries, backoff_base_s=self.llm_backoff_base_s,
            max_concurrency=self.llm_concurrency, structured_output=self.structured_output,
            planner_reasks=self.planner_reasks, price_per_mtok=self.price_per_mtok,
        )


def load_config(path: str | Path | None, overrides: dict[str, Any]) -> RunConfig:
    """Defaults < YAML file < overrides (flags given on the command line; None = not given)."""
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}")
        try:
            loaded = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" (line {mark.line + 1})" if mark else ""
            raise ConfigError(f"{p}: not valid YAML{where}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"{p}: expected a mapping of settings at the top level")
        data.update({k.replace("-", "_"): v for k, v in loaded.items()})
    data.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "config"
        raise ConfigError(f"{where}: {first['msg']}") from None
