"""The `ksearch` command line.

User mistakes (unknown task, missing file, bad option) end in one line on stderr and exit
status 2; a candidate that fails evaluation exits 1; nothing here prints a traceback for
either.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, NoReturn, get_args, get_origin

import typer
from rich.console import Console
from rich.text import Text

from ksearch_ray.config import BUDGET_KEYS, field_info
from ksearch_ray.taskspec.spec import TaskError
from ksearch_ray.taskspec.task import find_task, solution_from_file

if TYPE_CHECKING:
    from ksearch_ray.report.run_tables import Run

# In a pipe, help is plain text (click's), which wraps without cutting: rich's tables end long defaults in "…".
RICH_HELP = sys.stdout.isatty()
app = typer.Typer(add_completion=False, no_args_is_help=True, help="K-Search on Ray: find fast GPU kernels.",
                  rich_markup_mode="rich" if RICH_HELP else None)
out = Console()
err = Console(stderr=True, soft_wrap=True)  # messages are never broken into lines: paths stay whole

TaskDirs = Annotated[list[Path] | None, typer.Option("--task-dir", metavar="DIR", help="Extra directory of task bundles (repeatable).")]
Isolation = Annotated[
    str | None,
    typer.Option("--isolation", help="Candidate isolation: require (refuse without it), best-effort (default; warns "
                 "about what the host lacks) or off."),
]
Datasets = Annotated[
    list[Path] | None,
    typer.Option("--dataset", metavar="DIR", help="FlashInfer-Bench dataset directory (definitions + workloads; repeatable)."),
]


def task_dirs(task_dir: list[Path] | None, dataset: list[Path] | None) -> list[str]:
    """--task-dir folders, then one generated bundle per definition of each --dataset."""
    dirs = [str(p.resolve()) for p in task_dir or []]
    for d in dataset or []:
        if not d.is_dir():
            fail(f"--dataset {d}: not a directory")
        from ksearch_ray.taskspec.flashinfer_format import load_dataset

        try:
            dirs += [str(p) for p in load_dataset(d).values()]
        except TaskError as exc:
            fail(f"--dataset {d}: {exc}")
    return dirs


def error_line(message: str) -> Text:
    """"error: MESSAGE", the message verbatim: brackets in task names, paths and advice
    (`pip install '.[mlflow]'`) are text, never rich markup."""
    return Text.assemble(("error:", "bold red"), " ", message)


def fail(message: str) -> NoReturn:
    err.print(error_line(message), highlight=False)
    raise typer.Exit(2)


def default_device() -> str:
    """cuda where torch can use a GPU; cpu where there is none. A GPU whose driver this torch cannot use
    is said in one line (exit 2), not silently replaced by the CPU."""
    import torch

    if torch.cuda.is_available():
        return "cuda"
    from ksearch_ray.evaluation.gpu_driver import GpuDriverError, check

    try:
        check()
    except GpuDriverError as exc:
        fail(str(exc))
    return "cpu"


@app.command()
def tasks(
    task_dir: TaskDirs = None,
    dataset: Datasets = None,
    device: Annotated[str | None, typer.Option(help="Count the workloads that run on cuda or cpu (default: this machine).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the listing as JSON.")] = False,
) -> None:
    """List the task bundles that can be found, with their workloads and solutions."""
    from ksearch_ray.report.listing import list_tasks

    device = device or default_device()
    if device not in ("cuda", "cpu"):
        fail(f"--device must be cuda or cpu, not {device!r}")
    entries = list_tasks(task_dirs(task_dir, dataset), device)
    if as_json:
        print(json.dumps([e.model_dump(mode="json") for e in entries], indent=2))
        return
    from ksearch_ray.report.console import print_tasks

    print_tasks(out, entries, device)


@app.command("eval")
def eval_(
    candidate: Annotated[str, typer.Argument(help="A source file, a solution directory, or the name of one of the task's solutions.")],
    task_name: Annotated[str, typer.Option("--task", help="Task name or bundle path.")],
    mode: Annotated[str, typer.Option(help="fresh: new inputs every timed call; reuse: the same inputs.")] = "fresh",
    workloads: Annotated[str | None, typer.Option("--workloads", help="Workload set (default: the task's; tests = correctness only).")] = None,
    device: Annotated[str | None, typer.Option(help="cuda or cpu (default: cuda when a GPU is visible).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
    compat: Annotated[list[str] | None, typer.Option("--compat", help="Compatibility option of the task (repeatable).")] = None,
    baseline: Annotated[bool, typer.Option("--baseline/--no-baseline", help="Also measure the task's baseline, side by side.")] = False,
    against: Annotated[str | None, typer.Option("--against", help="Also measure this solution (name or file) side by side, as the baseline.")] = None,
    task_dir: TaskDirs = None,
    dataset: Datasets = None,
    work_dir: Annotated[Path | None, typer.Option(help="Sandbox working directory.")] = None,
    max_calls: Annotated[int | None, typer.Option(help="Cap on timed calls per workload (default 100, GPUMode's).")] = None,
    isolation: Isolation = None,
    objective: Annotated[str | None, typer.Option(
        "--objective", metavar="kernel|call", help="Which figure scores: kernel (graph replay) or call (the candidate's "
        "own call, host work included); default: the task's. Both are shown.")] = None,
) -> None:
    """Evaluate one candidate kernel: correctness on every workload, then timing."""
    if mode not in ("fresh", "reuse"):
        fail(f"--mode must be fresh or reuse, not {mode!r}")
    if objective not in (None, "kernel", "call"):
        fail(f"--objective must be kernel or call, not {objective!r}")
    isolation = isolation or "best-effort"
    if isolation not in ("require", "best-effort", "off"):
        fail(f"--isolation must be require, best-effort or off, not {isolation!r}")
    try:
        task = find_task(task_name, task_dirs(task_dir, dataset))
        solution = _resolve_candidate(candidate, task)
        if baseline and against:
            fail("--baseline and --against both name the comparison: give one")
        reference = task.baseline() if baseline else _resolve_candidate(against, task) if against else None
        options = set(compat or [])
        unknown = options - set(task.definition.compat_options)
        if unknown:
            fail(f"task {task.name} has no compat option {', '.join(sorted(unknown))} (known: {', '.join(task.definition.compat_options) or 'none'})")
        device = device or default_device()
        if device not in ("cuda", "cpu"):
            fail(f"--device must be cuda or cpu, not {device!r}")
        workloads = workloads or task.definition.default_workloads
        task.workloads(workloads, device)  # validates the set name before any work starts
    except TaskError as exc:
        fail(str(exc))

    from ksearch_ray.config import EvaluationConfig
    from ksearch_ray.evaluation.sandbox.handle import SandboxError
    from ksearch_ray.run.evaluators import build_evaluator

    if max_calls is not None and max_calls < 3:
        fail("--max-calls must be at least 3")
    settings = EvaluationConfig(isolation=isolation, timing={"max_calls": max_calls} if max_calls else {},  # type: ignore[arg-type]
                                objective=objective)  # type: ignore[arg-type]
    try:
        evaluator = build_evaluator(settings, device, work_dir, start=True)
    except (RuntimeError, SandboxError) as exc:
        fail(str(exc))
    try:
        with _eval_progress() as say:
            say(f"evaluating {solution.name} on {task.workload_set_name(workloads, device)}")
            say(objective_line(task, evaluator.objective_for(task), objective is not None, device))
            base = None
            if reference is not None:
                # The comparison first: a bundled solution's waits scale the hang limits of the candidate's.
                say(f"evaluating {reference.name} for comparison")
                base = evaluator.evaluate(task, reference, workload_set=workloads, mode=mode, options=options,  # type: ignore[arg-type]
                                          progress=lambda text: say(f"{reference.name}: {text}"))
                if _bundled(task, reference):
                    evaluator.learn_stage_times(task, base)
            result = evaluator.evaluate(task, solution, workload_set=workloads, mode=mode, options=options,  # type: ignore[arg-type]
                                        progress=lambda text: say(f"{solution.name}: {text}"))
    except SandboxError as exc:
        fail(str(exc))
    finally:
        evaluator.close()

    if as_json:
        from ksearch_ray.report.console import other_objective, workload_speedups

        payload: dict[str, object] = {"result": result.model_dump(mode="json"), "objective": result.objective}
        if base is not None:
            payload["baseline"] = base.model_dump(mode="json")
            payload["speedup"] = _speedup(base, result, task)
            payload["workload_speedups"] = workload_speedups(result, base)
            other = other_objective(result.objective)
            payload[f"workload_speedups_{other}"] = workload_speedups(result, base, figure=other)
        print(json.dumps(payload, indent=2))
    else:
        from ksearch_ray.report.console import print_eval

        print_eval(out, result, base, _speedup(base, result, task))
    raise typer.Exit(0 if result.passed else 1)


def _bundled(task: Any, solution: Any) -> bool:
    """`solution` is, byte for byte, one of the task's own solutions (trusted: it may teach wait limits)."""
    try:
        return bool(task.solution(solution.name).id == solution.id)
    except TaskError:
        return False


def objective_line(task: Any, objective: str, overridden: bool, device: str) -> str:
    """The run's first lines say which figure scores, and why."""
    rule = task.definition.objective
    why = "set by --objective" if overridden else f"the task's rule: {rule.source or 'the default'}"
    cpu = "; on the CPU there is no graph replay: the call figure is the only one" if device == "cpu" else ""
    return f"objective: {objective} ({why}){cpu}"


@contextlib.contextmanager
def _eval_progress() -> Iterator[Callable[[str], None]]:
    """A one-line status that updates in place on a terminal, plain lines on stderr otherwise."""
    if err.is_terminal:
        with err.status("") as status:
            yield lambda text: status.update(text)
    else:
        yield lambda text: print(text, file=sys.stderr, flush=True)


RUN_FLAGS: list[tuple[str, str, str]] = [
    # (parameter, flag, setting): each option's type, help and default come from the setting's field.
    ("task", "--task", "task"),
    ("model", "--model", "llm.model"),
    ("api_base", "--api-base", "llm.api_base"),
    ("api_key_env", "--api-key-env", "llm.api_key_env"),
    ("reasoning_effort", "--reasoning-effort", "llm.reasoning_effort"),
    ("structured_output", "--structured-output", "llm.structured_output"),
    ("price_per_mtok", "--price-per-mtok", "llm.price_per_mtok"),
    ("outage_s", "--outage-s", "llm.outage_s"),
    ("stream", "--stream/--no-stream", "llm.stream"),
    ("method", "--method", "search.method"),
    ("width", "--width", "search.width"),
    ("start", "--start", "search.start"),
    ("from_solution", "--from-solution", "search.from_solution"),
    ("language", "--language", "search.language"),
    ("random_seed", "--random-seed", "search.random_seed"),
    ("autotune", "--autotune", "search.autotune_variants"),
    ("tune_when_idle", "--tune-when-idle/--no-tune-when-idle", "search.tune_when_idle"),
    ("noise_repeats", "--noise-repeats", "search.noise_repeats"),
    ("confirm_repeats", "--confirm-repeats", "search.confirm_repeats"),
    ("stagnation_window", "--stagnation-window", "search.ksearch.stagnation_window"),
    ("max_difficulty", "--max-difficulty", "search.ksearch.max_difficulty"),
    ("rounds", "--rounds", "budget.rounds"),
    ("max_cost_usd", "--max-cost-usd", "budget.max_cost_usd"),
    ("max_llm_tokens", "--max-llm-tokens", "budget.max_llm_tokens"),
    ("max_wall_s", "--max-wall-s", "budget.max_wall_s"),
    ("device", "--device", "evaluation.device"),
    ("evaluators", "--evaluators", "evaluation.evaluators"),
    ("workloads", "--workloads", "evaluation.workloads"),
    ("mode", "--mode", "evaluation.mode"),
    ("objective", "--objective", "evaluation.objective"),
    ("isolation", "--isolation", "evaluation.isolation"),
    ("profile_bests", "--profile-bests/--no-profile-bests", "evaluation.profile.bests"),
    ("ray", "--ray/--no-ray", "cluster.ray"),
    ("ray_address", "--ray-address", "cluster.address"),
    ("run_dir", "--run-dir", "run_dir"),
    ("progress", "--progress/--no-progress", "progress"),
    ("track", "--track", "track"),
]
"""`ksearch run`'s options that set a configuration field."""

RESUME_FLAGS = [(name, f"--{name.replace('_', '-')}", f"budget.{name}") for name in BUDGET_KEYS]


def _option(flag: str, path: str, *, resume: bool = False) -> Any:
    """A typer option for a configuration field: its type and help from the field, its default shown."""
    info = field_info(path)
    kind = info.annotation
    many = get_origin(kind) is list  # a repeatable option (list[Literal[...]]: --track)
    if many:
        kind = get_args(kind)[0]
    choices = get_args(kind) if get_origin(kind) is Literal else None
    if choices is None:
        kind = next((a for a in get_args(kind) if a is not type(None)), kind)  # X | None -> X
    metavar = "|".join(choices) if choices else {int: "N", float: "X", bool: None}.get(kind, "TEXT")
    if path == "llm.price_per_mtok" or choices:
        kind = str  # 'IN,OUT' parsed below; choices checked by the configuration, in one line
    default = None if info.is_required() else info.get_default(call_default_factory=True)
    description = (info.description or "").rstrip(".") + "."
    bracket = "\\[" if RICH_HELP else "["  # rich markup needs its brackets escaped
    said = info.is_required() or (default is None and "default" in description)
    shown = "" if said else f" {bracket}default: {'none' if default is None else default}]"
    help_text = description + (" For the whole run, from now on." if resume else shown)
    if path == "llm.price_per_mtok":
        help_text = "USD per million prompt and completion tokens, 'IN,OUT', for a model litellm has no price for."
        metavar = "IN,OUT"
    if many:
        shown = "" if said or default else f" {bracket}default: none]"
        help_text = description + shown
        return Annotated[list[kind] | None, typer.Option(flag, help=help_text, show_default=False, metavar=metavar)]  # type: ignore[valid-type]
    return Annotated[kind | None, typer.Option(flag, help=help_text, show_default=False, metavar=metavar)]


def _command(flags: list[tuple[str, str, str]], extra: list[inspect.Parameter], body: Callable[..., None], *,
             resume: bool = False) -> Callable[..., None]:
    """A command function whose options are made from configuration fields (typer reads __signature__)."""
    params = list(extra)
    for name, flag, path in flags:
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None,
                                        annotation=_option(flag, path, resume=resume)))

    def command(**kwargs: Any) -> None:
        body(**kwargs)

    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__doc__ = body.__doc__
    return command


def _run(config: Path | None = None, task_dir: list[Path] | None = None, dataset: list[Path] | None = None,
         **flags: Any) -> None:
    """Search for a faster kernel: by default K-Search, W action cycles in parallel on one shared world model, on Ray.

    Every option sets a field of the run's configuration; a YAML file (--config) sets the same fields in sections (search, budget, llm, evaluation, cluster), and options given here win.
    """
    from ksearch_ray.config import ConfigError, load_config

    overrides = {path: flags[name] for name, _flag, path in RUN_FLAGS}
    overrides["llm.price_per_mtok"] = _price(flags["price_per_mtok"])
    overrides["task_dirs"] = task_dirs(task_dir, dataset) or None
    try:
        cfg = load_config(config, overrides)
    except ConfigError as exc:
        fail(str(exc))
    _run_search(lambda: _session().start(cfg, progress=cfg.progress))


_RUN_EXTRA = [
    inspect.Parameter("config", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Annotated[
        Path | None, typer.Option("--config", metavar="FILE", help="YAML file of settings (the same fields, in sections); options given win.")]),
    inspect.Parameter("task_dir", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=TaskDirs),
    inspect.Parameter("dataset", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Datasets),
]
app.command("run")(_command(RUN_FLAGS, _RUN_EXTRA, _run))


def _resume(run_dir: Path, progress: bool = True, **budget: Any) -> None:
    """Continue a run that was stopped, killed or finished: nothing lost, nothing counted twice."""
    _run_search(lambda: _session().resume(run_dir, progress=progress, budget=budget))


_RESUME_EXTRA = [
    inspect.Parameter("run_dir", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Annotated[
        Path, typer.Argument(help="A run directory left by `ksearch run`.")]),
    inspect.Parameter("progress", inspect.Parameter.KEYWORD_ONLY, default=True, annotation=Annotated[
        bool, typer.Option("--progress/--no-progress", help="Live view on a terminal (plain lines otherwise).")]),
]
app.command("resume")(_command(RESUME_FLAGS, _RESUME_EXTRA, _resume, resume=True))


@app.command()
def show(
    run_dir: Annotated[Path | None, typer.Argument(help="A run directory (default: the latest under ./runs).")] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep redrawing as the run goes on; stops when it ends.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the run's summary as JSON.")] = False,
) -> None:
    """Print a run's counters, failures, world model and best kernel (from its run directory)."""
    from ksearch_ray.store import RunDirError

    if follow and as_json:
        fail("--follow and --json do not go together: --json prints one summary")
    run_dir = run_dir or _latest_run()
    try:
        if follow:
            _follow(run_dir)
            return
        with _loaded(run_dir) as run:
            if run.torn:
                err.print(run.torn, highlight=False, markup=False, soft_wrap=True)
            if as_json:
                from ksearch_ray.report.run_summary import summarize

                print(summarize(run).model_dump_json(indent=2))
                return
            from ksearch_ray.report.console import print_run

            print_run(out, run)
    except RunDirError as exc:
        fail(str(exc))


def _follow(run_dir: Path) -> None:
    from ksearch_ray.report.follow import follow

    try:
        follow(run_dir, out)
    except KeyboardInterrupt:
        err.print(f"stopped following {run_dir}; the run itself goes on", highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(130) from None


@app.command()
def report(
    run_dir: Annotated[Path | None, typer.Argument(help="A run directory, finished or still running (default: the "
                                                     "latest under ./runs).")] = None,
    out_file: Annotated[Path | None, typer.Option("--out", help="HTML file to write (default: RUN_DIR/report.html).")] = None,
) -> None:
    """Write one self-contained HTML file that tells the story of a run: open it anywhere, offline."""
    from ksearch_ray.report.html import write_report
    from ksearch_ray.store import RunDirError

    run_dir = run_dir or _latest_run("report", "reporting on")
    target = out_file or run_dir / "report.html"
    if target.is_dir():
        fail(f"--out {target} is a directory; name the HTML file to write")
    try:
        with _loaded(run_dir) as run:
            if run.torn:
                err.print(run.torn, highlight=False, markup=False, soft_wrap=True)
            write_report(run, target)
    except RunDirError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"cannot write {target}: {exc.strerror or exc}")
    err.print(f"wrote {target}", highlight=False, markup=False, soft_wrap=True)


@app.command()
def export(
    source: Annotated[Path, typer.Argument(help="A run directory (exports its best solution) or a solution file/directory.")],
    task_name: Annotated[str | None, typer.Option("--task", help="Task (default: the run's).")] = None,
    out_file: Annotated[Path | None, typer.Option("--out", help="Write here instead of standard output.")] = None,
    traces: Annotated[Path | None, typer.Option("--traces", help="Write the run's evaluations as a FlashInfer-Bench "
                                                "dataset (definition, workloads, solutions, traces) in this new directory.")] = None,
    target_hardware: Annotated[str | None, typer.Option(
        help="FlashInfer-Bench target_hardware, e.g. H100 or H200 (default: the GPU a run measured on, CPU for a run on "
        "the CPU path; H100 for a solution file).")] = None,
    task_dir: TaskDirs = None,
    dataset: Datasets = None,
) -> None:
    """Write a solution as FlashInfer-Bench solution JSON, or a run's evaluations as FlashInfer-Bench traces."""
    from ksearch_ray.models import Solution
    from ksearch_ray.taskspec.flashinfer_format import solution_to_json

    is_run = (source / "manifest.json").is_file()
    try:
        if source.is_dir() and not is_run and not (source / "solution.json").is_file():
            fail(f"{source}: neither a run directory (no manifest.json) nor a solution directory (no solution.json)")
        if traces is not None:
            if not is_run:
                fail(f"--traces exports a run's evaluations: {source} is not a run directory (no manifest.json)")
            if out_file is not None:
                fail("--traces and --out write different things: give one")
            _export_traces(source, traces, task_name, target_hardware or _run_hardware(source), task_dirs(task_dir, dataset))
            return
        if is_run:
            best_file = source / "best.json"
            if not best_file.is_file():
                fail(f"{source}: the run has no best solution yet")
            solution = Solution.model_validate(json.loads(best_file.read_text())["solution"])
            task = find_task(task_name or solution.task, task_dirs(task_dir, dataset))
            target_hardware = target_hardware or _run_hardware(source)
        else:
            if task_name is None:
                fail("--task is needed to export a solution file")
            task = find_task(task_name, task_dirs(task_dir, dataset))
            solution = _resolve_candidate(str(source), task)
        _fib_definition(task)
        payload = solution_to_json(solution, task, target_hardware=target_hardware or "H100")
    except TaskError as exc:
        fail(str(exc))
    text = json.dumps(payload, indent=2)
    if out_file:
        out_file.write_text(text + "\n")
        err.print(f"wrote {out_file}", highlight=False, markup=False)
    else:
        print(text)


def _fib_definition(task) -> None:
    """The one rule of both exports: FlashInfer-Bench files are written for tasks that are
    FlashInfer-Bench definitions (a bundle with its definition.json), never under a name the package
    cannot resolve."""
    from ksearch_ray.taskspec.flashinfer_format import bundle_definition

    if not (task.root / "definition.json").is_file():
        raise TaskError(f"task {task.name} is not a FlashInfer-Bench definition (its bundle has no definition.json), "
                        "so it has no FlashInfer-Bench export; a run's best kernel is in RUN_DIR/best/")
    bundle_definition(task.root)  # and a valid one


def _export_traces(run_dir: Path, target: Path, task_name: str | None, target_hardware: str, extra: list[str]) -> None:
    from ksearch_ray.taskspec.flashinfer_traces import Environment, write_dataset

    manifest, evaluated = _run_evaluations(run_dir)
    root = manifest.get("task_root")  # the bundle the run used, where it is still there; else the task by name
    task = find_task(task_name or (root if root and (Path(root) / "task.json").is_file() else manifest["config"]["task"]), extra)
    _fib_definition(task)
    hardware = next((ev.result.device_name for ev in evaluated if ev.result.device_name), "unknown")
    libs = {k: str(v) for k, v in (manifest.get("versions") or {}).items()}
    counts = write_dataset(target, [task], evaluated=[(task, ev) for ev in evaluated],
                           environment=Environment(hardware=hardware, libs=libs), target_hardware=target_hardware)
    err.print(f"wrote {target}: {counts['solutions']} solutions, {counts['traces']} traces "
              f"({len(evaluated)} evaluations of {task.name})", highlight=False, markup=False)


def _run_evaluations(run_dir: Path):
    """The run's manifest and its recorded evaluations (seed, baseline and search evaluations), each
    with its solution, from the run's typed events."""
    from ksearch_ray.events import Baseline, Evaluation, Seed
    from ksearch_ray.store import RunDirError, RunStore
    from ksearch_ray.taskspec.flashinfer_traces import Evaluated

    store = RunStore(run_dir)
    try:
        store.check_schema()
        events = store.read_events()
    except RunDirError as exc:
        fail(str(exc))
    evaluated = []
    for event in events:
        if not isinstance(event, Evaluation | Seed | Baseline) or event.result is None or not event.solution_id:
            continue
        if not store.has_solution(event.solution_id):
            continue  # nothing to name the trace after (the run kept no code for it)
        evaluated.append(Evaluated(kind=event.kind, solution=store.load_solution(event.solution_id), result=event.result,
                                   time=event.t))
    return store.manifest(), evaluated


def _run_hardware(run_dir: Path) -> str:
    """What a run measured on, as FlashInfer-Bench names hardware: the GPU's model (H200), or CPU."""
    from ksearch_ray.events import RunView
    from ksearch_ray.store import RunDirError, RunStore

    try:
        view = RunView.of(RunStore(run_dir).read_events())
    except RunDirError as exc:
        fail(str(exc))
    name = next((r.device_name for r in view.results_at.values() if r.device_name), "")
    if not name or name.startswith("cpu"):
        return "CPU"
    return next((word for word in name.replace("NVIDIA", "").split() if any(c.isdigit() for c in word)), name)


@app.command()
def standin(
    port: Annotated[int, typer.Option(help="Port on 127.0.0.1 (0: any free port).")] = 8000,
    seed: Annotated[int, typer.Option(help="Seed of its choices: the same prompt and seed get the same answer.")] = 0,
    habits: Annotated[Path | None, typer.Option(help="YAML or JSON file of habits (latency_s, outages, reasoning, "
                                                     "truncate, ...: see ksearch_ray/policies/standin/habits.py).")] = None,
) -> None:
    """Serve the LLM stand-in: an OpenAI-compatible server on loopback that plays planner and coder.

    It reads the prompts ksearch sends and answers as a model would (tunable changes, broken drafts
    it then debugs from the error text, replies that drift from the format, now and then a 429), for
    demos and tests without an LLM. It is not a model: it knows nothing of kernels beyond what the
    prompt shows.
    """
    import time

    import yaml
    from pydantic import ValidationError

    from ksearch_ray.policies.standin.habits import Habits
    from ksearch_ray.policies.standin.server import StandIn

    chosen = None
    if habits is not None:
        try:
            chosen = Habits.model_validate(yaml.safe_load(habits.read_text()) or {})
        except ValidationError as exc:
            first = exc.errors()[0]
            fail(f"--habits {habits}: {'.'.join(str(p) for p in first['loc'])}: {first['msg']}")
        except (OSError, yaml.YAMLError) as exc:
            fail(f"--habits {habits}: {str(exc).splitlines()[0]}")
    try:
        server = StandIn(port, seed=seed, habits=chosen).start()
    except OSError as exc:
        fail(f"cannot listen on 127.0.0.1:{port}: {exc.strerror}")
    print(f"LLM stand-in at {server.api_base}; use --model hosted_vllm/standin --api-base {server.api_base}", flush=True)
    try:
        while True:
            time.sleep(3600)
    finally:
        server.stop()


def _session():
    from ksearch_ray import session

    return session


@contextlib.contextmanager
def _loaded(run_dir: Path) -> Iterator[Run]:
    """A whole run, read for one command: while the command draws its tables and page, what was read is frozen out
    of the cyclic collector, which would otherwise walk every event again each time new objects pile up."""
    import gc

    from ksearch_ray.report.run_tables import Run

    run = Run.load(run_dir)
    gc.freeze()
    try:
        yield run
    finally:
        gc.unfreeze()


def _latest_run(command: str = "show", doing: str = "showing") -> Path:
    """The most recently started run under ./runs (what `ksearch run` makes by default)."""
    runs = sorted((p for p in Path("runs").glob("*/manifest.json")), key=lambda p: p.stat().st_mtime)
    if not runs:
        fail(f"no run directory given, and ./runs holds none: name one (ksearch {command} RUN_DIR)")
    err.print(f"{doing} the latest run: {runs[-1].parent}", highlight=False, markup=False, soft_wrap=True)
    return runs[-1].parent


def _run_search(go) -> None:
    """Run or resume; the outcome on stdout. Exit 0 finished, 2 a usage error, 3 stopped by an
    error (resumable), 4 ended without evaluating a candidate of its own (the first line says why),
    130 interrupted (resumable)."""
    from ksearch_ray.config import ConfigError
    from ksearch_ray.evaluation.sandbox.handle import SandboxError
    from ksearch_ray.run.errors import RunInterrupted, RunStopped, SearchError
    from ksearch_ray.run.outcome import NOTHING_EVALUATED_EXIT, nothing_evaluated, outcome_lines
    from ksearch_ray.store import RunDirError

    try:
        search = go()
    except RunInterrupted as exc:
        err.print(f"interrupted; resume with: ksearch resume {exc.run_dir}", highlight=False, markup=False)
        raise typer.Exit(130) from None
    except RunStopped as exc:
        err.print(error_line(str(exc)), highlight=False)
        err.print(f"the run stopped and can be resumed: ksearch resume {exc.run_dir}", highlight=False, markup=False)
        raise typer.Exit(3) from None
    except (ConfigError, TaskError, SearchError, RunDirError, SandboxError) as exc:
        fail(str(getattr(exc, "cause", None) or exc))  # a Ray actor's error (a snapshot on a full disk): its own line
    # Plain lines: paths and ids are never wrapped or cut.
    print("\n".join(outcome_lines(search.view, search.store.root, search.llm.policy_name)))
    if nothing_evaluated(search.view) is not None:
        raise typer.Exit(NOTHING_EVALUATED_EXIT)


def _price(text: str | None) -> tuple[float, float] | None:
    if text is None:
        return None
    try:
        prompt, completion = (float(part) for part in text.split(","))
    except ValueError:
        fail(f"--price-per-mtok wants two numbers 'IN,OUT' (USD per million prompt, completion tokens), not {text!r}")
    return prompt, completion


def _speedup(base, result, task) -> float | None:
    from ksearch_ray.evaluation.scoring import speedup

    return None if base is None else speedup(task.definition, base, result)


def _resolve_candidate(candidate: str, task):
    path = Path(candidate)
    if path.exists():
        return solution_from_file(path, task)
    if candidate in task.solution_names(include_unavailable=True):
        return task.solution(candidate)
    raise TaskError(f"no such file or solution of task {task.name}: {candidate}")


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
