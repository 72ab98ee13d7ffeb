"""Human-readable views of results and runs (rich). Reads records only; computes nothing new.

Names, ids and paths are never cut. In a terminal, long lines are left for the terminal to
wrap (`soft_wrap`) and table cells that hold names fold instead of ending in "…"; anywhere
else (a pipe, a file, a job log) tables come out at their natural width, whatever COLUMNS says.
"""

from __future__ import annotations

import io
import math
import time
from typing import TYPE_CHECKING

from rich.console import Console, Group, RenderableType
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from ksearch_ray.evaluation.profiling import ProfileResult
from ksearch_ray.events import (
    NO_CODE,
    Baseline,
    Best,
    Candidate,
    Confirm,
    Evaluation,
    Event,
    NoStream,
    Outage,
    Profile,
    Resume,
    RunEnd,
    Seed,
    SeedFailed,
    Stopped,
    Tuned,
)
from ksearch_ray.measure import Noise, format_noise, with_noise
from ksearch_ray.models import EvalResult, Status, WorkloadResult
from ksearch_ray.report.listing import TaskEntry
from ksearch_ray.text import clip
from ksearch_ray.worldmodel.render import format_speedup, render_tree

if TYPE_CHECKING:
    from ksearch_ray.report.run_summary import RunSummary
    from ksearch_ray.report.run_tables import Run

# The views of runs draw plain rows (`run_tables.Run`), so `show` needs no polars; the run's modules are still
# imported where they are drawn, to keep `ksearch eval`'s start light.

RECENT = 8
"""Evaluations the live view (`show --follow`) keeps on screen."""


def _fmt(value: float | None, spec: str = ".4g") -> str:
    return "—" if value is None else format(value, spec)


def print_table(console: Console, table: Table) -> None:
    """In a terminal as rich lays it out; elsewhere at its natural width, never squeezed to COLUMNS."""
    if console.is_terminal:
        console.print(table)
        return
    wide = Console(file=io.StringIO(), width=100_000, color_system=None)
    wide.print(table)
    text = "\n".join(line.rstrip() for line in wide.file.getvalue().splitlines())  # type: ignore[attr-defined]
    console.print(text, markup=False, highlight=False, soft_wrap=True)


def say(console: Console, text: str, *, markup: bool = False) -> None:
    """One or more lines that are never wrapped or cropped by rich."""
    console.print(text, markup=markup, highlight=False, soft_wrap=True)


# --------------------------------------------------------------------------------------- eval


def eval_table(result: EvalResult, base: EvalResult | None = None) -> Table:
    clock = "GPU (CUDA events)" if result.device == "cuda" else "CPU host wall clock, not GPU latency"
    table = Table(title=f"{result.task} · {result.solution_name} · {result.workload_set} · {result.mode} · {clock} · "
                        f"objective: {result.objective}")
    # Both figures; `*` marks the objective's (the score's). On the CPU there is no graph replay.
    marks = {name: " *" if result.objective == name else "" for name in ("kernel", "call")}
    cols = ["workload", "status", f"kernel ms{marks['kernel']}", f"call ms{marks['call']}", "median ms", "min ms",
            "noise", "n", "max abs err", "max rel err"]
    for col in cols:
        table.add_column(col, justify="left" if col in ("workload", "status") else "right",
                         overflow="fold" if col == "workload" else "ellipsis")
    if base is not None:
        table.add_column("speedup", justify="right")
        table.add_column(f"speedup ({other_objective(result.objective)})", justify="right")
    ratios = workload_speedups(result, base) if base else {}
    others = workload_speedups(result, base, figure=other_objective(result.objective)) if base else {}
    for w in result.workloads:
        t = w.timing
        colour = "green" if w.status is Status.PASSED else "red"
        row: list[str | Text] = [
            Text(w.workload), f"[{colour}]{w.status.value}[/]", _fmt(w.kernel_ms), _fmt(w.call_ms),
            _fmt(t.median_ms if t else None), _fmt(t.min_ms if t else None),
            f"±{100 * t.robust_rel_err:.2g}%" if t and t.robust_rel_err is not None else "—",
            str(t.count) if t else "—", _fmt(w.max_abs_error, ".2e"), _fmt(w.max_rel_error, ".2e"),
        ]
        if base is not None:
            row += [_fmt(ratios.get(w.workload), ".3f"), _fmt(others.get(w.workload), ".3f")]
        table.add_row(*row)
    return table


def other_objective(objective: str) -> str:
    return "call" if objective == "kernel" else "kernel"


def workload_speedups(result: EvalResult, base: EvalResult, figure: str | None = None) -> dict[str, float]:
    """Baseline mean over candidate mean, per workload both timed: the objective's figure, or `figure`
    (kernel or call) where both have it."""
    def ms(w: WorkloadResult) -> float | None:
        if figure is None:
            return w.timing.mean_ms if w.timing else None
        return w.kernel_ms if figure == "kernel" else w.call_ms

    base_by_name = {w.workload: w for w in base.workloads}
    ratios = {}
    for w in result.workloads:
        b = base_by_name.get(w.workload)
        mine, theirs = ms(w), (ms(b) if b else None)
        if mine and theirs and mine > 0:
            ratios[w.workload] = theirs / mine
    return ratios


def print_eval(console: Console, result: EvalResult, base: EvalResult | None, speedup: float | None) -> None:
    print_table(console, eval_table(result, base))
    if not result.passed:
        say(console, f"[bold red]{result.status.value}[/]: {escape(result.message)}", markup=True)
        if result.log:
            say(console, result.log)
        return
    where = f"{result.device_name}" + (f", compat: {', '.join(result.compat)}" if result.compat else "")
    if result.score is not None:
        say(console, f"score: {result.score:.4g} ({result.score_kind}, objective: {result.objective}) on {where}")
        other = other_objective(result.objective)
        figures = [w.kernel_ms if other == "kernel" else w.call_ms for w in result.workloads]
        if figures and all(f is not None and f > 0 for f in figures):
            mean = math.exp(sum(math.log(f) for f in figures if f) / len(figures))
            say(console, f"the {other} figure beside it: geomean {mean:.4g} ms")
        elif result.device == "cpu":
            say(console, "no kernel figure on the CPU path (no CUDA graph replay): the call is the interpreter's call")
    else:
        say(console, f"PASSED (correctness only) on {where}")
    if base is not None and speedup is not None:
        untimed = " (its per-input setup, e.g. a plan, ran outside the timing)" if base.prepared_untimed else ""
        say(console, f"baseline {base.solution_name}: {base.score:.4g}{untimed}; speedup {speedup:.3f}x")
    say(console, f"evaluation took {result.seconds:.1f} s, of which sandbox overhead {result.overhead_seconds:.2f} s")


# -------------------------------------------------------------------------------------- tasks


def print_tasks(console: Console, entries: list[TaskEntry], device: str) -> None:
    """`ksearch tasks`: one block per task; the name alone on its first line, ready to copy."""
    for entry in entries:
        say(console, f"[bold]{escape(entry.name)}[/]", markup=True)
        if entry.error:
            say(console, f"  [red]cannot be loaded: {escape(entry.error)}[/]", markup=True)
        else:
            sets = ", ".join(
                f"{s.name} ({s.workloads}" + (f", as {s.resolved}" if s.resolved != s.name else "") + (", default" if s.default else "") + ")"
                for s in entry.workload_sets
            )
            say(console, f"  workloads on {device}: {sets or 'none'}")
            sols = ", ".join(s.name + "".join(f" ({note})" for note in (s.role, s.missing and f"needs {', '.join(s.missing)}")
                                              if note) for s in entry.solutions)
            say(console, f"  solutions: {sols or 'none'}")
        say(console, f"  path: {entry.path}")


# ---------------------------------------------------------------------------------------- runs


def header_lines(summary: RunSummary, *, now: float | None = None, last_event_t: float | None = None) -> list[str]:
    facts = (summary.run_id, f"task {summary.task}", f"method {summary.method}", summary.policy, summary.hardware)
    lines = [" · ".join(f for f in facts if f)]
    if summary.finished:
        state = f"finished ({summary.finished})"
    elif summary.stopped:
        state = f"stopped ({summary.stopped}); `ksearch resume {summary.run_dir}` continues it"
    else:
        age = f", last event {duration((now or time.time()) - last_event_t)} ago" if last_event_t else ""
        state = f"not finished{age} (running, or stopped: `ksearch resume {summary.run_dir}` continues it)"
    lines.append(
        f"status: {state}; rounds {summary.rounds_used}/{summary.rounds_budget if summary.rounds_budget is not None else '?'}; "
        f"running time {duration(summary.wall_s)}; resumed {summary.resumes}×"
    )
    outcomes = ", ".join(f"{status} {n}" for status, n in summary.outcomes.items()) or "none yet"
    lines.append(f"candidates: {outcomes}")
    if summary.llm_calls:
        lines.append(f"LLM: {summary.llm_calls} calls, {summary.llm_tokens} tokens, ${summary.llm_cost_usd:.2f}")
    noise = Noise(value=summary.noise, measurements=summary.noise_measurements, floor=summary.noise_floor) \
        if summary.noise is not None else None
    seed = summary.seed
    seed_text = f"; seed {with_noise(seed['speedup'], noise)}" if seed else ""
    best = summary.best
    if best and seed and best.get("solution_id") == seed.get("solution_id"):
        lines.append(f"best: the seed, {with_noise(best.get('speedup'), noise)} over the baseline; nothing faster found yet")
    elif best:
        lines.append(f"best: {with_noise(best.get('speedup'), noise)} over the baseline, node {best.get('node')}, "
                     f"round {best.get('round')}, solution {best.get('solution_id')}{seed_text}")
    else:
        lines.append(f"best: none yet{seed_text}")
    lines.append(f"measurement {format_noise(noise)}")
    if summary.lost:
        lines.append(f"evaluations lost to evaluator failures: {len(summary.lost)} ({'; '.join(summary.lost)})")
    for confirm in summary.confirmed:
        where = f" on {confirm['gpu']}" if len(summary.confirmed) > 1 else ""
        lines.append(f"re-timed{where}, interleaved with the baseline: {confirm.get('verdict')}")
    lines += profile_lines(summary)
    return lines


def profile_lines(summary: RunSummary) -> list[str]:
    """The best's profile in a line or two (`ksearch report` has every kernel of every best)."""
    if summary.profiler is None:
        return []
    if summary.profiler.get("problem"):
        return [f"profiling (--profile-bests): {summary.profiler['problem']}"]
    best = summary.best or {}
    mine = [p for p in summary.profiles if p["solution_id"] == best.get("solution_id") and p["gpu"] == best.get("gpu")]
    if not mine:
        return [f"profile of the best: not yet ({len(summary.profiles)} profile(s) of earlier bests)"]
    profile = ProfileResult.model_validate({k: v for k, v in mine[-1].items() if k != "gpu"})
    head, *kernels = profile.lines(kernels=1)
    return [f"profile of the best: {head}", *(f"  slowest kernel {k}" for k in kernels)]


def ledger_table(summary: RunSummary) -> Table | None:
    if not summary.ledger:
        return None
    table = Table("role", "call kind", "calls", "cached", "failed", "tokens", "cost USD", title="LLM ledger")
    for row in summary.ledger:
        table.add_row(Text(row.role), Text(row.kind), str(row.calls), str(row.cached), str(row.failed),
                      str(row.prompt_tokens + row.completion_tokens), f"{row.cost_usd:.4f}")
    return table


def print_run(console: Console, run: Run) -> None:
    """`ksearch show`: everything comes from the run directory."""
    from ksearch_ray.report.run_summary import summarize
    summary_ = summarize(run)
    for line in header_lines(summary_, last_event_t=run.last_event_t):
        say(console, line)
    ledger = ledger_table(summary_)
    if ledger is not None:
        print_table(console, ledger)
    failures = evaluations_table(run, failed_only=True)
    if failures is not None:
        print_table(console, failures)
    tree = run.tree
    if tree is not None:
        say(console, render_tree(tree))
    elif run.keeps_world_model:
        say(console, "(no world model yet)")
    else:
        say(console, f"(this run keeps no world model: method {run.method})")
    best = run.best
    if best:
        solution = run.solution(best.solution_id)
        if solution is None:
            say(console, f"\nthe best solution {best.solution_id} is missing from {run.root / 'solutions'}")
            return
        say(console, f"\nbest kernel: solution {solution.id} by {solution.author}")
        figures = figures_table(run)
        if figures is not None:
            print_table(console, figures)
        for name, text in solution.sources.items():
            say(console, f"--- {name}")
            say(console, text)
    else:
        say(console, "\nno passing candidate yet")


def figures_table(run: Run) -> Table | None:
    """The best against the baseline per workload: the objective's speedup, and each figure's beside it."""
    rows = run.workload_rows()
    base = run.best_baseline()
    if base is None or all(r["best_ms"] is None for r in rows):
        return None
    table = Table("workload", "baseline ms", "best ms", f"speedup ({base.objective})", "kernel speedup", "call speedup",
                  title="the best per workload (kernel: CUDA-graph replay; call: host work included)")
    for r in rows:
        table.add_row(r["workload"], _fmt(r["baseline_ms"]), _fmt(r["best_ms"]),
                      *(_fmt(r[c], ".3f") for c in ("speedup", "kernel_speedup", "call_speedup")))
    return table


def evaluations_table(run: Run, *, failed_only: bool = False, last: int | None = None) -> Table | None:
    from ksearch_ray.report.run_tables import Origin
    rows = [r for r in run.evaluation_rows if r["origin"] == Origin.CANDIDATE]
    if failed_only:
        rows = [r for r in rows if r["status"] != Status.PASSED.value]
    if last is not None:
        rows = rows[-last:]
    if not rows:
        return None
    title = "failed candidates" if failed_only else "recent evaluations"
    table = Table("round", "cycle", "node", "status", "speedup", "error", title=title)
    for col in table.columns:
        col.overflow = "fold"
    for r in rows:
        colour = "green" if r["status"] == Status.PASSED.value else "yellow" if r["status"] == NO_CODE else "red"
        error = (r["error"] or "").splitlines()
        table.add_row(str(r["round"] if r["round"] is not None else ""), Text(r["cycle"] or ""), Text(r["node"] or ""),
                      Text(r["status"], style=colour), format_speedup(r["speedup"]) if r["speedup"] is not None else "",
                      Text(error[0] if error else ""))
    return table


def live_view(run: Run, *, now: float | None = None) -> RenderableType:
    """What `ksearch show --follow` redraws in a terminal."""
    from ksearch_ray.report.run_summary import summarize
    summary_ = summarize(run, with_tree=False)
    parts: list[RenderableType] = [Text("\n".join(header_lines(summary_, now=now, last_event_t=run.last_event_t)))]
    if summary_.cycles_open:
        titles = {n.id: n.title for n in run.tree.nodes.values()} if run.tree else {}
        parts.append(Text("cycles open: " + "; ".join(f"{c['cycle']} {c['node']} {titles.get(c['node'], '')}".rstrip()
                                                      for c in summary_.cycles_open)))
    table = evaluations_table(run, last=RECENT)
    if table is not None:
        parts.append(table)
    return Group(*parts)


def event_line(ev: Event, elapsed_s: float) -> str | None:
    """One plain line for an event worth a line in a followed log (pipes, job logs); None otherwise."""
    at = f"[{duration(elapsed_s)}]"
    if isinstance(ev, Evaluation | Candidate | Tuned):
        where = " ".join(x for x in (ev.cycle, ev.node, ev.lane) if x)
        head = f"{at} round {ev.round} {where}".rstrip()
    if isinstance(ev, Evaluation):
        line = f"{head} {ev.result.status.value}"
        if ev.speedup is not None:
            line += f" {format_speedup(ev.speedup)}"
        if not ev.result.passed and ev.result.message:
            line += f": {ev.result.message.splitlines()[0]}"
        return line
    if isinstance(ev, Candidate) and not ev.solution_id:
        error = (ev.error or "no code came back").splitlines()[0]
        said = f" (the reply began: {clip(ev.reply_start, 100)!r})" if ev.reply_start else ""
        return f"{head} {NO_CODE}: {error}{said}"
    if isinstance(ev, Tuned):
        if ev.solution_id == ev.original:
            return f"{head} tuning: nothing faster in {ev.variants} variant(s)"
        values = ", ".join(f"{k}={v!r}" for k, v in ev.values.items())
        return (f"{head} tuned {values}: {format_speedup(ev.speedup_before)} -> {format_speedup(ev.speedup)} "
                f"({ev.variants} variant(s))")
    if isinstance(ev, Best):
        what = "new best" if ev.why == "new best" else f"best ({ev.why})"
        return f"{at} {what}: {format_speedup(ev.speedup)} over the baseline (node {ev.node}, round {ev.round})"
    if isinstance(ev, Baseline):
        return f"{at} baseline on evaluator {ev.evaluator} {ev.result.status.value}, score {_fmt(ev.result.score)}"
    if isinstance(ev, Seed):
        if not ev.solution_id:
            return f"{at} starting from the specification (no seed kernel)"
        status = ev.result.status.value if ev.result else "?"
        return f"{at} seed {status}, {format_speedup(ev.speedup)} over the baseline"
    if isinstance(ev, SeedFailed):
        return f"{at} seed {ev.result.status.value}: the starting solution does not pass"
    if isinstance(ev, Confirm):
        return f"{at} re-timed against the baseline: {ev.verdict}"
    if isinstance(ev, Profile):
        r = ev.result
        if not r.ok:
            return f"{at} profile of {ev.solution_id} {r.status}: {r.message}"
        top = r.kernels[0] if r.kernels else None
        slowest = f"; the slowest {top.name} {top.duration_ms:.3g} ms" if top else ""
        return f"{at} profiled {ev.solution_id} on {r.workload} in {r.seconds:.0f} s: {r.kernel_count} kernel(s){slowest}"
    if isinstance(ev, Outage):
        if ev.state == "began":
            return f"{at} the LLM provider is failing ({clip(ev.error, 120)}): the run waits; no round is spent"
        if ev.state == "ended":
            return f"{at} the LLM provider answers again after {duration(ev.waited_s)} ({ev.failed_calls} failed calls)"
        return f"{at} the LLM provider kept failing for {duration(ev.waited_s)}: the session stops (resumable)"
    if isinstance(ev, NoStream):
        return f"{at} the LLM endpoint does not stream ({clip(ev.reason, 120)}): asked without streaming from now on"
    if isinstance(ev, Resume):
        return f"{at} resumed"
    if isinstance(ev, Stopped):
        return f"{at} session stopped: {ev.reason}"
    if isinstance(ev, RunEnd):
        return f"{at} run ended: {ev.reason}"
    return None


def duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"
