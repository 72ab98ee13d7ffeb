"""Run configuration: defaults, then a YAML file, then command-line flags; validated once.

One `RunConfig`, in sections (`llm`, `search` with a section per method, `budget`, `evaluation`,
`cluster`), is written into the run's manifest and handed to every part of the run, so a resumed
run uses exactly the configuration it started with. The command line's options are made from
these fields (their help is the fields' descriptions: `cli.RUN_FLAGS`), and a YAML file uses the
same nested keys:

    task: trimul
    search: {width: 8, method: ksearch, ksearch: {stagnation_window: 4}}
    budget: {rounds: 200, max_cost_usd: 50}
    llm: {model: openai/gpt-5}
    evaluation: {workloads: benchmarks, timing: {max_calls: 50}}
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from ksearch_ray.evaluation.settings import Limits, ProfilerSettings, TimingPolicy


class ConfigError(Exception):
    """Bad configuration; the message is one line for the user."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LLMConfig(_Section):
    """Which model to call and how patiently (none: the offline policy plays planner and coder)."""

    model: str | None = Field(default=None, description="litellm model string, e.g. openai/gpt-5; none = the offline policy.")
    api_base: str | None = Field(default=None, description="OpenAI-compatible server URL (vLLM, SGLang, Ollama).")
    api_key_env: str | None = Field(
        default=None, description="Environment variable that holds the API key (default: the provider's own variable)."
    )
    temperature: float | None = Field(default=None, description="None sends nothing: reasoning models reject most values.")
    max_tokens: int | None = Field(default=None, gt=0, description="Completion token limit; none leaves it to the server.")
    reasoning_effort: str | None = Field(default=None, description="low / medium / high, where the model supports it.")
    timeout_s: float = Field(default=600.0, gt=0, description="Seconds per HTTP attempt.")
    max_retries: int = Field(default=4, ge=0, description="Retries of a retryable failure within one call.")
    backoff_base_s: float = Field(default=2.0, ge=0, description="First retry waits about this long, then doubling.")
    backoff_max_s: float = Field(default=60.0, ge=0, description="Cap on one wait, a server's Retry-After included.")
    outage_s: float = Field(
        default=1800.0, ge=0,
        description="How long a provider may keep failing (timeouts, 5xx, 429) before the run stops, resumable; "
        "such failures spend no round.",
    )
    concurrency: int = Field(default=8, ge=1, description="LLM calls in flight per planner/coder actor.")
    requests_per_min: int | None = Field(
        default=None, ge=1, description="The provider's request limit per window, shared by every planner and coder "
        "(one limiter per model and api_base); none: learned from the first 429s.")
    tokens_per_min: int | None = Field(
        default=None, ge=1, description="The provider's token limit (prompt and completion) per window, shared "
        "likewise; none: not limited here.")
    limit_window_s: float = Field(default=60.0, gt=0, description="The window of those limits (a provider's minute).")
    structured_output: Literal["auto", "on", "off"] = Field(
        default="auto", description="JSON-schema planner replies: auto = where litellm says the model supports them."
    )
    planner_reasks: int = Field(default=1, ge=0, description="Times a planner reply that cannot be used is asked again.")
    price_per_mtok: tuple[float, float] | None = Field(
        default=None, description="USD per million prompt and completion tokens, for a model litellm has no price for."
    )
    prompt_budget_tokens: int | None = Field(
        default=None, ge=2_000,
        description="Largest prompt in tokens (estimated); default: what the model's context window leaves for the "
        "answer (litellm knows it for most models), else 100,000.",
    )
    stream: bool = Field(default=True, description="Stream replies (a proxy that cuts idle connections cannot cut a long call).")

    def reply_parameters(self) -> dict[str, Any]:
        """The parameters that change what the model says; they key the response cache."""
        return {"model": self.model, "temperature": self.temperature, "max_tokens": self.max_tokens,
                "reasoning_effort": self.reasoning_effort}


class KSearchConfig(_Section):
    stagnation_window: int = Field(default=5, ge=1, description="Non-improving attempts in a row that end a cycle.")
    parent_patience: int = Field(
        default=5, ge=1, description="Attempts in a row, after one passed, that leave the cycle no faster than its parent."
    )
    lease_ttl_s: float = Field(default=3600.0, gt=0, description="A cycle that stops reporting this long loses its action.")
    max_difficulty: int = Field(default=4, ge=1, le=5, description="Difficulty gate (1-5) of the selection policy.")
    relax_difficulty_at_speedup: float | None = Field(default=1.5, gt=0, description="The gate opens once the best reaches this.")
    max_new_actions: int = Field(default=3, ge=1, description="New actions one planner batch may add (K-Search: 3).")
    max_proposals: int = Field(
        default=32, ge=1, description="New actions one batch may add when the frontier leaves more cycle slots idle "
        "than max_new_actions would fill (the planner is asked for what is missing, up to this).")
    max_parallel_attempts: int | None = Field(
        default=None, ge=1, description="Attempts one cycle may have in flight while fewer cycles run than the width "
        "(their slots go to the running cycles' attempts); none: as many as the width leaves; 1: K-Search's sequential "
        "cycle.")


class EvolveConfig(_Section):
    islands: int = Field(default=3, ge=1, description="Populations that evolve apart, exchanging their best now and then.")
    inspirations: int = Field(default=2, ge=0, description="Other programs shown beside the parent.")
    migration_interval: int = Field(default=10, ge=1, description="Children evaluated between migrations.")


class RefineConfig(_Section):
    debug_window: int = Field(default=5, ge=1, description="Failed attempts in a row a lane debugs before it improves the best again.")


class SearchConfig(_Section):
    method: Literal["ksearch", "evolve", "refine"] = Field(
        default="ksearch",
        description="Search method: ksearch (the world-model search), evolve (program database with islands) or "
        "refine (improve the best so far, no world model).",
    )
    width: int = Field(default=2, ge=1, description="Action cycles (or lanes) in parallel: the search width W.")
    start: Literal["seed", "spec"] = Field(
        default="seed",
        description="seed: start from the task's seed kernel (or --from-solution); spec: write the first kernel from the "
        "specification, as in the K-Search paper.",
    )
    from_solution: str | None = Field(default=None, description="Start from this solution (a task solution name or a file).")
    language: Literal["triton", "cuda", "python"] = Field(default="triton", description="What the LLM coder writes.")
    random_seed: int = Field(default=0, ge=0, description="Seed of the method's random choices; repetitions differ by it.")
    autotune_variants: int = Field(
        default=0, ge=0, description="Evaluations the tuner may spend on each passed candidate's tunables (0: none)."
    )
    tune_when_idle: bool = Field(
        default=False, description="Lend evaluators that would otherwise idle (no candidate waiting) to tuning the "
        "tunables of the fastest passed candidates, nearest values first, until each one's grid is tried: evaluations, "
        "not rounds."
    )
    noise_repeats: int = Field(
        default=24, ge=1, description="Measurements of the baseline per evaluator at the start of every session, for the "
        "noise: this many, or fewer (never below 3) once they have taken noise_budget_s; the seed is measured "
        "min(this, 2) times at the start."
    )
    noise_budget_s: float = Field(
        default=20.0, ge=0, description="Evaluator seconds within which the session's first baseline measurements stop "
        "short of noise_repeats (at least 3 are made; the rest are made up between candidates at noise_share)."
    )
    noise_share: float = Field(
        default=0.1, ge=0, lt=1, description="Share of each evaluator's time spent, between candidates, measuring the "
        "baseline the session's start left out of noise_repeats for noise_budget_s (0: none); none once it has them all."
    )
    warmup: bool = Field(
        default=True, description="Measure the baseline once, unrecorded, before the first measurement of each session."
    )
    confirm_repeats: int = Field(
        default=3, ge=0, description="Interleaved re-timings of the best against the baseline and the seed at the end (0: none)."
    )
    retime_best: bool = Field(
        default=True, description="Believe a new best only once a second, independent measurement agrees with the first."
    )
    ksearch: KSearchConfig = Field(default_factory=KSearchConfig)
    evolve: EvolveConfig = Field(default_factory=EvolveConfig)
    refine: RefineConfig = Field(default_factory=RefineConfig)


class BudgetConfig(_Section):
    """What a run may spend; `ksearch resume` may change these and nothing else."""

    rounds: int = Field(default=40, ge=1, description="Budget of code generations.")
    max_cost_usd: float | None = Field(default=None, ge=0, description="LLM spending budget, USD.")
    max_llm_tokens: int | None = Field(default=None, gt=0, description="Budget of LLM tokens, prompt and completion together.")
    max_wall_s: float | None = Field(default=None, gt=0, description="Wall-clock budget, seconds (the final re-timing included).")


class ProfileConfig(_Section):
    """Profiler evidence: each new best profiled once with Nsight Compute, outside its timed measurement."""

    bests: bool = Field(
        default=False,
        description="Profile each new best once with Nsight Compute (ncu) on its slowest workload, outside any timed "
        "measurement, for the planner's evidence and the report (a host without ncu says so and goes on).",
    )
    ncu: str | None = Field(default=None, description="The ncu executable (default: PATH, CUDA_HOME/bin, /opt/nvidia/nsight-compute).")
    limit_s: float = Field(default=300.0, gt=0, description="Wall-clock limit of one profile, seconds.")
    kernels: int = Field(default=5, ge=1, le=50, description="Kernels kept per profile, slowest first.")

    def settings(self) -> ProfilerSettings | None:
        """What an evaluator needs to profile; None when profiling was not asked for."""
        return ProfilerSettings(ncu=self.ncu, timeout_s=self.limit_s, kernels=self.kernels) if self.bests else None


SCREEN_FIELDS = ("max_calls", "min_calls", "target_rel_err", "max_total_s", "max_wall_s", "warmup_calls")
"""The TimingPolicy fields `evaluation.screen` may change: when to stop, not what is timed."""


class EvaluationConfig(_Section):
    device: Literal["cuda", "cpu"] | None = Field(default=None, description="cuda or cpu (default: cuda where there is a GPU).")
    workloads: str | None = Field(default=None, description="Workload set that scores candidates (default: the task's).")
    mode: Literal["fresh", "reuse"] = Field(default="fresh", description="Timing mode: fresh inputs every timed call, or reuse.")
    objective: Literal["kernel", "call"] | None = Field(
        default=None, description="What the score times: kernel (the call replayed as a CUDA graph) or call (the "
        "candidate's own call, host work included); default: the task's, after its source benchmark.")
    isolation: Literal["require", "best-effort", "off"] = Field(
        default="best-effort",
        description="Candidate isolation: require (refuse without it), best-effort (warns about what the host lacks) or off.",
    )
    evaluators: int | None = Field(default=None, ge=1, description="Evaluators (default: one per GPU, or one on the CPU).")
    evaluator_cpus: float = Field(default=1.0, gt=0, description="num_cpus reserved by each evaluator actor.")
    evaluator_gpus: bool = Field(default=False, description="Reserve one GPU per evaluator even on the CPU path (tests with fake GPUs).")
    triton_helper_ahead: bool = Field(
        default=True, description="GPU evaluators: compile Triton's CUDA driver helper (a C module its launches go "
        "through) once, in the evaluator's own process, and give each Triton candidate's cache a copy, so that a new "
        "candidate's worker does not compile it again (with gcc, on the GPU's host).")
    overlap: bool = Field(
        default=False, description="Each evaluator takes a second evaluation while one runs. The second's sandbox "
        "worker starts (a fork and a CUDA context; none of the candidate's code) while the first is timed, and "
        "imports and checks its candidate while the first's last outputs are judged; a profile's processes start "
        "beside an evaluation and its candidate runs in a turn of its own. Timed calls, re-timing and the profiled "
        "call have the device to themselves. Busy time counts overlapping evaluations once (`device_seconds`). "
        "Off by default: not yet measured on a GPU.")
    replace_timeout_s: float = Field(
        default=600.0, gt=0, description="An evaluator started to replace a lost one and not running after this long is given up."
    )
    limits: Limits = Field(default_factory=Limits, description="Time limits of one evaluation, seconds.")
    timing: dict[str, Any] = Field(
        default_factory=dict, description="Changes to the device's timing rule (TimingPolicy fields), e.g. {max_calls: 50}."
    )
    screen: dict[str, Any] | None = Field(
        default_factory=lambda: {"target_rel_err": 0.01, "max_calls": 20},
        description="A search's new candidates are timed by the timing rule with these changes "
        "(TimingPolicy fields), e.g. {target_rel_err: 0.01, max_calls: 20}: a coarser figure, enough to rank them. A "
        "candidate that would be a new best is measured again by the full rule, and only that figure counts; the seed, "
        "the baseline and the end's re-timing always use the full rule. null: every evaluation by the full rule.")
    profile: ProfileConfig = Field(default_factory=ProfileConfig)

    @field_validator("timing", "screen")
    @classmethod
    def _timing_fields(cls, value: dict[str, Any] | None, info: ValidationInfo) -> dict[str, Any] | None:
        if value is None:
            return value
        TimingPolicy.model_validate({**TimingPolicy().model_dump(), **value})  # unknown or bad fields fail here
        if info.field_name == "screen" and (what := sorted(set(value) - set(SCREEN_FIELDS))):
            raise ValueError(f"{', '.join(what)}: a screened figure must measure what the full rule measures; "
                             f"screen may change only the stop rule ({', '.join(SCREEN_FIELDS)})")
        return value

    def timing_for(self, device: str) -> TimingPolicy:
        objective = {"objective": self.objective} if self.objective else {}
        return TimingPolicy.model_validate({**TimingPolicy.for_device(device).model_dump(), **self.timing, **objective})

    def screen_timing_for(self, device: str) -> TimingPolicy | None:
        """The rule a search's new candidates are timed by; None: the full rule (`timing_for`)."""
        if self.screen is None:
            return None
        return TimingPolicy.model_validate({**self.timing_for(device).model_dump(), **self.screen})


class ClusterConfig(_Section):
    ray: bool = Field(default=True, description="Run on Ray (local or a cluster); false: everything in this process.")
    address: str | None = Field(default=None, description="Attach to this Ray cluster (default: RAY_ADDRESS, or a local Ray).")
    policy_actors: int = Field(
        default=1, ge=1, description="Planner actors and coder actors (each): calls are spread over them, each takes "
        "llm.concurrency at once, and all share the endpoint's one rate limit.")
    build_pool: bool = Field(
        default=True, description="Compile CUDA/C++ candidates in CPU build tasks ahead of their evaluation (Ray only)."
    )
    triton_builds: bool = Field(
        default=True, description="Also compile Python candidates' Triton kernels for the evaluators' GPU in CPU build "
        "tasks, so that a GPU worker only loads them (GPU evaluators, with build_pool).")
    build_cpus: float = Field(default=2.0, gt=0, description="num_cpus of each build task (also its ninja MAX_JOBS).")
    build_resource: str | None = Field(
        default=None,
        description="A custom Ray resource builds ask a little of, so they run only on nodes declaring it "
        "(cluster.yaml's build nodes declare ksearch_build); none: any node with free CPUs.",
    )
    build_timeout_s: float = Field(default=900.0, gt=0, description="A build that gives no result this long is a TIMEOUT.")
    warm_builders: bool = Field(
        default=True, description="With a session's first build, start the sandboxes of up to search.width - 1 more "
        "build workers (as many as the cluster's CPUs hold beside the evaluators and that build), so that the first "
        "candidates' builds do not each wait seconds for a cold worker's imports.")
    build_ahead: bool | None = Field(
        default=None, description="Build a session's starting kernel (the seed; on a resume, the bests) while the "
        "baselines are measured, so that its evaluation does not wait for a cold build after them. Default: on with "
        "GPU evaluators; off on CPU ones, where the build would share the cores the baselines are timed on.")
    build_wait_s: float = Field(
        default=600.0, ge=0, description="While no node of the cluster could ever take a build task (none with "
        "build_cpus CPUs, or none declaring build_resource), a build waits this long for an autoscaler to add one, "
        "then the run ends with one line; 0: wait for ever. A local Ray started by the run cannot grow: it ends at once.")
    scratch_dir: str | None = Field(
        default=None,
        description="Node-local working directory on every node (build cache, build sandboxes, remote evaluators' "
        "sandboxes); made 0700 and refused unless it is this user's alone. Default: $XDG_CACHE_HOME (or ~/.cache)"
        "/ksearch-ray/scratch.",
    )


TRACKERS = ("wandb", "mlflow")
"""Experiment trackers a run can stream its events to (`--track`); each is an extra of the package."""


class RunConfig(_Section):
    task: str = Field(description="Task name or bundle path.")
    task_dirs: list[str] = Field(default_factory=list, description="Extra directories of task bundles.")
    run_dir: str | None = Field(default=None, description="Run directory (default: runs/<task>-<time>-<id>).")
    progress: bool = Field(default=True, description="Live progress view on a terminal.")
    llm: LLMConfig = Field(default_factory=LLMConfig)
    search: SearchConfig = Field(default_factory=SearchConfig)
    budget: BudgetConfig = Field(default_factory=BudgetConfig)
    evaluation: EvaluationConfig = Field(default_factory=EvaluationConfig)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    track: list[Literal["wandb", "mlflow"]] = Field(
        default_factory=list,
        description="Experiment trackers that receive the run's events: wandb, mlflow (repeat the flag or give "
        "them comma-separated); none: nothing of either is imported.",
    )

    @field_validator("track", mode="before")
    @classmethod
    def _trackers(cls, value: Any) -> Any:
        # `--track wandb,mlflow` and `--track wandb --track mlflow` mean the same; an unknown name is one line.
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list):
            return value
        names = [part.strip() for item in value for part in (item.split(",") if isinstance(item, str) else [item])]
        for name in names:
            if name not in TRACKERS:
                raise PydanticCustomError("tracker", "unknown tracker {name}: --track takes wandb or mlflow",
                                          {"name": repr(name)})
        return list(dict.fromkeys(names))

    @property
    def workload_set(self) -> str | None:
        return self.evaluation.workloads

    def with_settings(self, settings: dict[str, Any]) -> RunConfig:
        """A copy with dotted settings changed ({"budget.rounds": 80}), validated."""
        data = self.model_dump(mode="json")
        for path, value in settings.items():
            set_path(data, path, value)
        return validate_config(data)


BUDGET_KEYS = tuple(BudgetConfig.model_fields)
"""What `ksearch resume` may change: the budget, never what the run searches."""


# ---------------------------------------------------------------------------------------- loading


def field_paths(model: type[BaseModel] = RunConfig, prefix: str = "") -> dict[str, Any]:
    """Every leaf setting's dotted path -> its pydantic FieldInfo."""
    out: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, _Section):
            out.update(field_paths(annotation, f"{prefix}{name}."))
        else:
            out[f"{prefix}{name}"] = info
    return out


def field_info(path: str) -> Any:
    return field_paths()[path]


def flat_settings(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested settings as dotted paths: {"search": {"width": 2}} -> {"search.width": 2}."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) and key != "timing":
            out.update(flat_settings(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def set_path(data: dict[str, Any], path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    for key in parents:
        data = data.setdefault(key, {})
    data[leaf] = value


def _did_you_mean(path: str) -> str:
    known = list(field_paths())
    leaf = path.split(".")[-1]
    by_leaf = [p for p in known if p.split(".")[-1] == leaf]
    close = by_leaf or difflib.get_close_matches(path, known, n=1) or difflib.get_close_matches(
        leaf, [p.split(".")[-1] for p in known], n=1)
    if not close:
        return ""
    guess = close[0] if close[0] in known else next(p for p in known if p.endswith("." + close[0]) or p == close[0])
    return f" (did you mean {guess}?)"


def validate_config(data: dict[str, Any], where: str = "config") -> RunConfig:
    """RunConfig from nested data; ConfigError with one line naming the setting (and a guess for a typo)."""
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        path = ".".join(str(p) for p in first["loc"]) or "config"
        if first["type"] == "extra_forbidden":
            raise ConfigError(f"{where}: unknown setting {path}{_did_you_mean(path)}") from None
        if first["type"] == "missing":
            raise ConfigError(f"{where}: {path} is required") from None
        raise ConfigError(f"{where}: {path}: {first['msg']}") from None


def load_config(path: str | Path | None, overrides: dict[str, Any]) -> RunConfig:
    """Defaults < YAML file < overrides (dotted paths from the command line; None = not given)."""
    data: dict[str, Any] = {}
    where = "config"
    if path is not None:
        p = Path(path)
        where = str(p)
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}")
        try:
            loaded = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            line = f" (line {mark.line + 1})" if mark else ""
            raise ConfigError(f"{p}: not valid YAML{line}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"{p}: expected a mapping of settings at the top level")
        data = _normalise_keys(loaded)
    for dotted, value in overrides.items():
        if value is not None:
            set_path(data, dotted, value)
    return validate_config(data, where)


def _normalise_keys(data: dict[str, Any]) -> dict[str, Any]:
    """YAML keys may use dashes (`max-wall-s`); nested mappings are sections."""
    return {k.replace("-", "_"): _normalise_keys(v) if isinstance(v, dict) else v for k, v in data.items()}
