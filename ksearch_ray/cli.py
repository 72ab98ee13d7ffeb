"""The `ksearch` command line.

User mistakes (unknown task, missing file, bad option) end in one line on stderr and exit
status 2; a candidate that fails evaluation exits 1; nothing here prints a traceback for
either.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console

from ksearch_ray.config import RunConfig
from ksearch_ray.taskspec.task import TaskError, find_task, solution_from_file

app = typer.Typer(add_completion=False, no_args_is_help=True, help="K-Search on Ray: find fast GPU kernels.")
out = Console()
err = Console(stderr=True, soft_wrap=True)  # messages are never broken into lines: paths stay whole

TaskDirs = Annotated[list[Path] | None, typer.Option("--task-dir", help="Extra directory of task bundles (repeatable).")]
Isolation = Annotated[
    str | None,
    typer.Option("--isolation", help="Candidate isolation: require (refuse without it), best-effort (default; warns "
                 "about what the host lacks) or off."),
]
Datasets = Annotated[
    list[Path] | None,
    typer.Option("--dataset", help="FlashInfer-Bench dataset directory (definitions + workloads; repeatable)."),
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


def fail(message: str) -> NoReturn:
    err.print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(2)


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


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
) -> None:
    """Evaluate one candidate kernel: correctness on every workload, then timing."""
    if mode not in ("fresh", "reuse"):
        fail(f"--mode must be fresh or reuse, not {mode!r}")
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

    from ksearch_ray.evaluation.evaluator import Evaluator, TimingPolicy
    from ksearch_ray.evaluation.sandbox.client import SandboxError

    timing = TimingPolicy.for_device(device)
    if max_calls is not None:
        if max_calls < 3:
            fail("--max-calls must be at least 3")
        timing.max_calls = max_calls
    from ksearch_ray.evaluation.sandbox.isolation import Isolation as IsolationMode

    try:
        evaluator = Evaluator(device, work_dir, timing=timing, isolation=IsolationMode(isolation))
    except (RuntimeError, SandboxError) as exc:
        fail(str(exc))
    try:
        with _eval_progress() as say:
            say(f"evaluating {solution.name} on {task.workload_set_name(workloads, device)}")
            result = evaluator.evaluate(task, solution, workload_set=workloads, mode=mode, options=options,  # type: ignore[arg-type]
                                        progress=lambda text: say(f"{solution.name}: {text}"))
            base = None
            if reference is not None:
                say(f"evaluating {reference.name} for comparison")
                base = evaluator.evaluate(task, reference, workload_set=workloads, mode=mode, options=options,  # type: ignore[arg-type]
                                          progress=lambda text: say(f"{reference.name}: {text}"))
    except SandboxError as exc:
        fail(str(exc))
    finally:
        evaluator.close()

    if as_json:
        from ksearch_ray.report.console import workload_speedups

        payload: dict[str, object] = {"result": result.model_dump(mode="json")}
        if base is not None:
            payload["baseline"] = base.model_dump(mode="json")
            payload["speedup"] = _speedup(base, result, task)
            payload["workload_speedups"] = workload_speedups(result, base)
        print(json.dumps(payload, indent=2))
    else:
        from ksearch_ray.report.console import print_eval

        print_eval(out, result, base, _speedup(base, result, task))
    raise typer.Exit(0 if result.passed else 1)


@contextlib.contextmanager
def _eval_progress() -> Iterator[Callable[[str], None]]:
    """A one-line status that updates in place on a terminal, plain lines on stderr otherwise."""
    if err.is_terminal:
        with err.status("") as status:
            yield lambda text: status.update(text)
    else:
        yield lambda text: print(text, file=sys.stderr, flush=True)


def _default(field: str) -> str:
    """' [default: X]' from RunConfig, for options whose default lives there (flags override YAML)."""
    value = RunConfig.model_fields[field].default
    return f" \\[default: {'none' if value is None else value}]"  # escaped: help text is rich markup


@app.command()
def run(
    task: Annotated[str | None, typer.Option("--task", help="Task name or bundle path.")] = None,
    model: Annotated[str | None, typer.Option(help="litellm model string, e.g. openai/gpt-5; none = offline policy.")] = None,
    api_base: Annotated[str | None, typer.Option(help="OpenAI-compatible server URL (vLLM, SGLang, Ollama).")] = None,
    api_key_env: Annotated[str | None, typer.Option(help="Environment variable that holds the API key.")] = None,
    reasoning_effort: Annotated[str | None, typer.Option(help="low / medium / high, where the model supports it.")] = None,
    width: Annotated[int | None, typer.Option(help="Action cycles in parallel (search width W)." + _default("width"))] = None,
    rounds: Annotated[int | None, typer.Option(help="Budget of code generations." + _default("rounds"))] = None,
    stagnation_window: Annotated[int | None, typer.Option(help="Non-improving attempts that end a cycle." + _default("stagnation_window"))] = None,
    max_difficulty: Annotated[int | None, typer.Option(help="Difficulty gate (1-5)." + _default("max_difficulty"))] = None,
    max_cost_usd: Annotated[float | None, typer.Option(help="LLM spending budget." + _default("max_cost_usd"))] = None,
    max_wall_s: Annotated[float | None, typer.Option(help="Wall-clock budget, seconds." + _default("max_wall_s"))] = None,
    from_solution: Annotated[str | None, typer.Option(help="Start from this solution (task solution name or file).")] = None,
    device: Annotated[str | None, typer.Option(help="cuda or cpu.")] = None,
    evaluators: Annotated[int | None, typer.Option(help="Evaluator actors (default: one per GPU).")] = None,
    workloads: Annotated[str | None, typer.Option(help="Workload set that scores candidates.")] = None,
    mode: Annotated[str | None, typer.Option(help="Timing mode: fresh or reuse." + _default("mode"))] = None,
    language: Annotated[str | None, typer.Option(help="What the LLM writes: triton, cuda or python." + _default("language"))] = None,
    method: Annotated[str | None, typer.Option(help="Search method: ksearch (world model), evolve (program database with islands) or refine (improve the best, no world model)." + _default("method"))] = None,
    random_seed: Annotated[int | None, typer.Option(help="Seed of the method's random choices; repetitions of an experiment differ by it." + _default("random_seed"))] = None,
    price_per_mtok: Annotated[str | None, typer.Option(help="USD per million prompt and completion tokens, 'IN,OUT', for a model litellm has no price for.")] = None,
    max_llm_tokens: Annotated[int | None, typer.Option(help="Budget of LLM tokens, prompt and completion together.")] = None,
    structured_output: Annotated[str | None, typer.Option(help="JSON-schema planner replies: auto, on or off." + _default("structured_output"))] = None,
    noise_repeats: Annotated[int | None, typer.Option(help="Measurements of the baseline and the seed at the start (the noise estimate)." + _default("noise_repeats"))] = None,
    confirm_repeats: Annotated[int | None, typer.Option(help="Interleaved re-timings of the best against the baseline at the end (0: none)." + _default("confirm_repeats"))] = None,
    autotune: Annotated[int | None, typer.Option("--autotune", help="Evaluations the tuner may spend on each passed candidate's tunables (0: none)." + _default("autotune_variants"))] = None,
    config: Annotated[Path | None, typer.Option("--config", help="YAML file with the same keys; flags override it.")] = None,
    run_dir: Annotated[str | None, typer.Option(help="Run directory (default runs/<task>-<time>-<id>).")] = None,
    ray_address: Annotated[str | None, typer.Option(help="Attach to this Ray cluster.")] = None,
    task_dir: TaskDirs = None,
    dataset: Datasets = None,
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help="Live progress view.")] = True,
    isolation: Isolation = None,
) -> None:
    """Search for a faster kernel on Ray: by default K-Search, W action cycles in parallel on one shared world model."""
    from ksearch_ray.config import ConfigError, load_config

    overrides = {
        "task": task, "model": model, "api_base": api_base, "api_key_env": api_key_env,
        "reasoning_effort": reasoning_effort, "width": width, "rounds": rounds,
        "stagnation_window": stagnation_window, "max_difficulty": max_difficulty, "max_cost_usd": max_cost_usd,
        "max_wall_s": max_wall_s, "from_solution": from_solution, "device": device, "evaluators": evaluators,
        "workloads": workloads, "mode": mode, "language": language, "run_dir": run_dir,
        "ray_address": ray_address, "task_dirs": task_dirs(task_dir, dataset) or None,
        "noise_repeats": noise_repeats, "confirm_repeats": confirm_repeats, "autotune_variants": autotune, "method": method, "random_seed": random_seed,
        "price_per_mtok": _price(price_per_mtok), "max_llm_tokens": max_llm_tokens, "structured_output": structured_output,
        "isolation": isolation,
    }
    try:
        cfg = load_config(config, overrides)
    except ConfigError as exc:
        fail(str(exc))
    _run_search(lambda: _runner().start(cfg, progress=progress))


@app.command()
def resume(
    run_dir: Annotated[Path, typer.Argument(help="A run directory left by `ksearch run`.")],
    rounds: Annotated[int | None, typer.Option(help="New budget of code generations for the whole run (extends a finished run).")] = None,
    max_cost_usd: Annotated[float | None, typer.Option(help="New LLM spending budget for the whole run.")] = None,
    max_wall_s: Annotated[float | None, typer.Option(help="New wall-clock budget for the whole run, seconds.")] = None,
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help="Live view on a terminal (plain lines otherwise).")] = True,
) -> None:
    """Continue a run that was stopped, killed or finished: nothing lost, nothing counted twice."""
    budget = {"rounds": rounds, "max_cost_usd": max_cost_usd, "max_wall_s": max_wall_s}
    _run_search(lambda: (run_dir.resolve(), _runner().resume(run_dir, progress=progress, budget=budget)))


@app.command()
def show(
    run_dir: Annotated[Path, typer.Argument(help="A run directory.")],
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep redrawing as the run goes on; stops when it ends.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the run's summary as JSON.")] = False,
) -> None:
    """Print a run's counters, failures, world model and best kernel (from its run directory)."""
    from ksearch_ray.search.store import RunDirError

    if follow and as_json:
        fail("--follow and --json do not go together: --json prints one summary")
    try:
        if follow:
            _follow(run_dir)
            return
        from ksearch_ray.report.tables import Run

        run = Run.load(run_dir)
        if as_json:
            from ksearch_ray.report.summary import summarize

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
    run_dir: Annotated[Path, typer.Argument(help="A run directory (finished or still running).")],
    out_file: Annotated[Path | None, typer.Option("--out", help="HTML file to write (default: RUN_DIR/report.html).")] = None,
) -> None:
    """Write one self-contained HTML file that tells the story of a run: open it anywhere, offline."""
    from ksearch_ray.report.html import write_report
    from ksearch_ray.report.tables import Run
    from ksearch_ray.search.store import RunDirError

    target = out_file or run_dir / "report.html"
    if target.is_dir():
        fail(f"--out {target} is a directory; name the HTML file to write")
    try:
        write_report(Run.load(run_dir), target)
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
    target_hardware: Annotated[str, typer.Option(help="FlashInfer-Bench target_hardware, e.g. H100 or H200.")] = "H100",
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
            _export_traces(source, traces, task_name, target_hardware, task_dirs(task_dir, dataset))
            return
        if is_run:
            best_file = source / "best.json"
            if not best_file.is_file():
                fail(f"{source}: the run has no best solution yet")
            solution = Solution.model_validate(json.loads(best_file.read_text())["solution"])
            task = find_task(task_name or solution.task, task_dirs(task_dir, dataset))
        else:
            if task_name is None:
                fail("--task is needed to export a solution file")
            task = find_task(task_name, task_dirs(task_dir, dataset))
            solution = _resolve_candidate(str(source), task)
        payload = solution_to_json(solution, task, target_hardware=target_hardware)
    except TaskError as exc:
        fail(str(exc))
    text = json.dumps(payload, indent=2)
    if out_file:
        out_file.write_text(text + "\n")
        err.print(f"wrote {out_file}")
    else:
        print(text)


def _export_traces(run_dir: Path, target: Path, task_name: str | None, target_hardware: str, extra: list[str]) -> None:
    from ksearch_ray.taskspec.flashinfer_traces import Environment, write_dataset

    manifest, evaluated = _run_evaluations(run_dir)
    root = manifest.get("task_root")  # the bundle the run used, where it is still there; else the task by name
    task = find_task(task_name or (root if root and (Path(root) / "task.json").is_file() else manifest["config"]["task"]), extra)
    hardware = next((ev.result.device_name for ev in evaluated if ev.result.device_name), "unknown")
    libs = {k: str(v) for k, v in (manifest.get("versions") or {}).items()}
    counts = write_dataset(target, [task], evaluated=[(task, ev) for ev in evaluated],
                           environment=Environment(hardware=hardware, libs=libs), target_hardware=target_hardware)
    err.print(f"wrote {target}: {counts['solutions']} solutions, {counts['traces']} traces "
              f"({len(evaluated)} evaluations of {task.name})", highlight=False)


def _run_evaluations(run_dir: Path):  # type: ignore[no-untyped-def]
    """The run's manifest and its recorded evaluations (seed, baseline and search evaluations), each
    with its solution. The one reader of the event log behind `export --traces`."""
    from ksearch_ray.models import EvalResult
    from ksearch_ray.search.store import RunDirError, RunStore
    from ksearch_ray.taskspec.flashinfer_traces import Evaluated

    store = RunStore(run_dir)
    try:
        events = store.read_events()
    except RunDirError as exc:
        fail(str(exc))
    evaluated = []
    for event in events:
        if event.get("kind") not in ("evaluation", "seed", "baseline") or not event.get("result"):
            continue
        solution_id = event.get("solution_id")
        if not solution_id or not store.has_solution(solution_id):
            continue  # nothing to name the trace after (the run kept no code for it)
        evaluated.append(Evaluated(kind=event["kind"], solution=store.load_solution(solution_id),
                                   result=EvalResult.model_validate(event["result"]), time=float(event.get("t", 0.0))))
    return store.manifest(), evaluated


@app.command()
def standin(
    port: Annotated[int, typer.Option(help="Port on 127.0.0.1 (0: any free port).")] = 8000,
    seed: Annotated[int, typer.Option(help="Seed of its choices: the same prompt and seed get the same answer.")] = 0,
) -> None:
    """Serve the LLM stand-in: an OpenAI-compatible server on loopback that plays planner and coder.

    It reads the prompts ksearch sends and answers as a model would (tunable changes, risky drafts
    that fail, replies that drift from the format, now and then a 429), for demos and tests
    without an LLM. It is not a model: it knows nothing of kernels beyond what the prompt shows.
    """
    import time

    from ksearch_ray.standin.server import StandIn

    try:
        server = StandIn(port, seed=seed).start()
    except OSError as exc:
        fail(f"cannot listen on 127.0.0.1:{port}: {exc.strerror}")
    print(f"LLM stand-in at {server.api_base}; use --model hosted_vllm/standin --api-base {server.api_base}", flush=True)
    try:
        while True:
            time.sleep(3600)
    finally:
        server.stop()


def _runner():  # type: ignore[no-untyped-def]
    from ksearch_ray.search import runner

    return runner


def _run_search(go) -> None:  # type: ignore[no-untyped-def]
    """Run or resume; the outcome on stdout. Exit 0 finished, 2 a usage error, 3 stopped by an
    error (resumable), 130 interrupted (resumable)."""
    from ksearch_ray.config import ConfigError
    from ksearch_ray.evaluation.sandbox.client import SandboxError
    from ksearch_ray.search.errors import RunInterrupted, RunStopped, SearchError
    from ksearch_ray.search.outcome import outcome_lines
    from ksearch_ray.search.store import RunDirError

    try:
        run_dir, state = go()
    except RunInterrupted as exc:
        err.print(f"interrupted; resume with: ksearch resume {exc.run_dir}", highlight=False)
        raise typer.Exit(130) from None
    except RunStopped as exc:
        err.print(f"[bold red]error:[/] {exc}", highlight=False)
        err.print(f"the run stopped and can be resumed: ksearch resume {exc.run_dir}", highlight=False)
        raise typer.Exit(3) from None
    except (ConfigError, TaskError, SearchError, RunDirError, SandboxError) as exc:
        fail(str(exc))
    print("\n".join(outcome_lines(state, run_dir)))  # plain lines: paths and ids are never wrapped or cut


def _price(text: str | None) -> tuple[float, float] | None:
    if text is None:
        return None
    try:
        prompt, completion = (float(part) for part in text.split(","))
    except ValueError:
        fail(f"--price-per-mtok wants two numbers 'IN,OUT' (USD per million prompt, completion tokens), not {text!r}")
    return prompt, completion


def _speedup(base, result, task) -> float | None:  # type: ignore[no-untyped-def]
    from ksearch_ray.evaluation.scoring import speedup

    return None if base is None else speedup(task.definition, base, result)


def _resolve_candidate(candidate: str, task):  # type: ignore[no-untyped-def]
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
