"""The text a request turns into, field by field, for the prompt templates.

Pure functions of the request records: what an evaluation, a history of attempts or a cycle's
evidence looks like to a model. The templates (`prompts/*.md`) decide where each goes.
"""

from __future__ import annotations

import difflib

from ksearch_ray.evaluation.profiling import ProfileResult
from ksearch_ray.models import EvalResult, Solution
from ksearch_ray.policies.contract import (
    Attempt,
    AttemptEvidence,
    Facts,
    FailedAttempt,
    Inspiration,
    WorkloadTime,
)
from ksearch_ray.policies.failure import decisive_text
from ksearch_ray.policies.llm.prompting import format_sources
from ksearch_ray.taskspec.spec import TaskDefinition, TensorSpec
from ksearch_ray.worldmodel.render import format_speedup, render_hypotheses, render_summary
from ksearch_ray.worldmodel.tree import Tree

CHARS_PER_TOKEN = 3
"""A conservative estimate (code runs about 3 characters a token, prose about 4)."""


def interface_text(task: TaskDefinition) -> str:
    def spec(name: str, s: TensorSpec) -> str:
        shape = "scalar" if s.shape is None else "[" + ", ".join(str(d) for d in s.shape) + "]"
        return f"  {name}: {shape} {s.dtype}" + (f"  ({s.description})" if s.description else "")

    call = (
        f"def {task.entry_point}(data)  # data = the inputs below, packed as the task description says"
        if task.interface == "gpumode"
        else f"def {task.entry_point}({', '.join(task.inputs)})  # returns the outputs in order (a tuple, or one tensor)"
    )
    lines = [call, "Inputs:", *(spec(n, s) for n, s in task.inputs.items()), "Outputs:"]
    lines += [spec(n, s) for n, s in task.outputs.items()]
    return "\n".join(lines)


def noise_text(noise: float | None) -> str:
    if noise is None:
        return "unknown (no kernel was measured twice yet)"
    return (f"repeated measurements of one unchanged kernel differ by up to {100 * noise:.2g}%: "
            "a speedup difference smaller than that is not evidence")


def profile_section(profiles: dict[str, ProfileResult]) -> str:
    """The planner head's profiler section ('' without a profile, so prompts without one are unchanged).
    Every figure is a checked number, every name a folded identifier or a known stall reason
    (evaluation/ncu.py): the profiled process was the candidate's, so nothing in it is free text."""
    shown = {role: p for role, p in profiles.items() if p.ok}
    if not shown:
        return ""
    parts = ["\n\n# Profile (Nsight Compute)\n\nOne call of the kernel on its slowest workload, profiled once outside "
             "the timed measurements. Throughputs are percentages of this GPU's peak; achieved occupancy is the "
             "share of the SM's warp slots in use; stalls are warp cycles per issued instruction, largest first. "
             "Leads for where the time goes, not measurements (the timings are those)."]
    for role, profile in shown.items():
        head, *kernels = profile.lines()
        parts.append(f"\n\nOf {role} (solution {profile.solution_id}), {head}:\n" + "\n".join(f"  {k}" for k in kernels))
    return "".join(parts)


def hardware_text(hardware: str, facts: Facts | None) -> str:
    """The device in the terms a kernel engineer sizes tiles by, its datasheet peaks and the software."""
    info = facts.device if facts else None
    if info is None:
        return hardware or "(not known)"
    lines = [info.hardware or hardware]
    per_sm = [f"{info.shared_memory_per_sm_kib:.0f} KiB shared memory" if info.shared_memory_per_sm_kib else "",
              f"{info.registers_per_sm} 32-bit registers" if info.registers_per_sm else ""]
    if any(per_sm):
        lines.append("Per SM: " + ", ".join(p for p in per_sm if p)
                     + (f"; L2 cache {info.l2_cache_mib:.0f} MiB" if info.l2_cache_mib else "") + ".")
    if info.peaks:
        p = info.peaks
        lines.append(f"Datasheet peaks: memory bandwidth {p.memory_bandwidth_gb_s / 1000:.2g} TB/s; tensor cores "
                     f"{p.bf16_dense_tflop_s:g} TFLOP/s dense bf16/fp16 (TF32 half that)"
                     + (f", {p.fp8_dense_tflop_s:g} dense fp8" if p.fp8_dense_tflop_s else "")
                     + f"; {p.fp32_tflop_s:g} TFLOP/s fp32 without tensor cores.")
    if info.software:
        lines.append("Software the candidate runs with: " + ", ".join(f"{k} {v}" for k, v in info.software.items())
                     + " (write for these versions: APIs drift between releases).")
    return "\n".join(lines)


def measurement_text(facts: Facts | None) -> str:
    """How a candidate is judged and timed, and every workload's shapes and least work per call."""
    if facts is None:
        return "(not stated)"
    lines = ["Every workload below is checked against the reference before anything is timed; the first failure "
             "decides the verdict."]
    if facts.timing_rule:
        lines.append(f"Timing, {facts.timing_rule}.")
    if facts.fresh_inputs:
        lines.append("Inputs and weights are regenerated (new random values, the same shapes) before every timed "
                     "call, and the outputs of the timed calls are checked again: a kernel that keeps outputs, weights "
                     "or anything computed from them between calls fails with a mismatch.")
    else:
        lines.append("Every timed call of a workload gets the same input set.")
    if facts.workloads:
        which = facts.workload_set or "the task's set"
        lines.append(f"Workloads scored ({which}; the score is over all of them):")
        shown = facts.workloads if len(facts.workloads) <= 24 else facts.workloads[:24]
        for w in shown:
            axes = ", ".join(f"{k}={v}" for k, v in w.axes.items())
            params = ", ".join(f"{k}={_value(v)}" for k, v in w.params.items() if k != "seed")
            work = ""
            if w.flops is not None and w.bytes is not None:
                work = f"; at least {_quantity(w.flops, 'FLOP')} and {_quantity(w.bytes, 'B')} a call"
            lines.append(f"  {w.name}: {axes}" + (f"; {params}" if params else "") + work)
        if len(facts.workloads) > len(shown):
            lines.append(f"  ... and {len(facts.workloads) - len(shown)} more of the same kinds")
    return "\n".join(lines)


def _value(v: object) -> str:
    return ("true" if v else "false") if isinstance(v, bool) else str(v)


def _quantity(value: float, unit: str) -> str:
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def roofline_text(workload: str, ms: float, facts: Facts | None) -> str:
    """Achieved FLOP rate and bandwidth of one timed workload against the device's peaks ('' off a GPU)."""
    info = facts.device if facts else None
    if facts is None or info is None or info.device != "cuda" or ms <= 0:
        return ""
    shape = next((w for w in facts.workloads if w.name == workload), None)
    if shape is None or shape.flops is None or shape.bytes is None:
        return ""
    tflops = shape.flops / (ms * 1e-3) / 1e12
    tbytes = shape.bytes / (ms * 1e-3) / 1e12
    parts = [f"{tflops:.3g} TFLOP/s", f"{tbytes:.3g} TB/s"]
    if info.peaks:
        p = info.peaks
        parts = [f"{tflops:.3g} TFLOP/s ({tflops / p.fp32_tflop_s:.0%} of the fp32 peak, "
                 f"{tflops / p.bf16_dense_tflop_s:.1%} of the bf16 tensor peak)",
                 f"{tbytes:.3g} TB/s ({tbytes * 1000 / p.memory_bandwidth_gb_s:.0%} of memory bandwidth)"]
    return "; " + ", ".join(parts)


def times_text(times: list[WorkloadTime], facts: Facts | None = None) -> str:
    lines = []
    for t in times:
        parts = [f"{t.ms:.4g} ms"]
        if t.parent_ms:
            parts.append(f"parent {t.parent_ms:.4g} ms ({t.parent_ms / t.ms:.2f}x)")
        if t.baseline_ms:
            parts.append(f"baseline {t.baseline_ms:.4g} ms ({t.baseline_ms / t.ms:.2f}x)")
        lines.append(f"  {t.workload}: " + ", ".join(parts) + roofline_text(t.workload, t.ms, facts))
    return "\n".join(lines)


def code_against(solution: Solution, shown: Solution | None, what: str) -> str:
    """`solution`'s code, as a unified diff against `shown` (code the prompt shows in full elsewhere) when
    that is much shorter than the code itself, else in full."""
    full = format_sources(solution.sources)
    if shown is None or set(shown.sources) != set(solution.sources):
        return full
    lines: list[str] = []
    for name, text in solution.sources.items():
        lines += difflib.unified_diff(shown.sources[name].splitlines(), text.splitlines(), f"{name} ({what})", name,
                                      lineterm="", n=2)
    diff = "\n".join(lines)
    if not diff or len(diff) > len(full) // 2:
        return full
    return f"As a change to the {what} shown in this prompt:\n\n```diff\n{diff}\n```"


def failure_text(failure: FailedAttempt | None, chars: int = 4000, shown: Solution | None = None,
                 what: str = "code") -> str:
    """The previous attempt that failed: its code (a diff against `shown`, the code the prompt shows in
    full, where shorter) and the evidence of why; or why there was no code."""
    if failure is None:
        return ""
    head = f"Round {failure.round} ({failure.kind}) failed."
    if failure.solution is None:
        said = " ".join(failure.reply_start.split())[:300]
        return (f"{head} It returned no usable code: {failure.error or 'no code came back'}"
                + (f"\nThe reply began: {said!r}" if said else ""))
    evidence = decisive_text(failure.result, chars) if failure.result else "(not evaluated)"
    code = code_against(failure.solution, shown, what)
    return f"{head} Its code:\n\n{code}\n\nIts evaluation:\n\n```\n{evidence}\n```"


def result_text(result: EvalResult | None, speedup: float | None, times: list[WorkloadTime],
                facts: Facts | None = None) -> str:
    """A result and the speedup of that same result (never another attempt's)."""
    if result is None:
        return "(not evaluated)"
    if not result.passed:
        return decisive_text(result)
    head = f"PASSED; {format_speedup(speedup)} over the baseline" if speedup else "PASSED"
    body = times_text(times, facts) or "\n".join(
        f"  {w.workload}: mean {w.timing.mean_ms:.4g} ms" for w in result.workloads if w.timing
    )
    return f"{head}\nPer workload:\n{body}" if body else head


def history_text(history: list[Attempt], limit: int = 12, earlier: int = 0) -> str:
    """The last `limit` attempts, one line each; `earlier`: attempts before `history` (not carried)."""
    lines = []
    for a in history[-limit:]:
        what = a.error or (a.result.status.value if a.result else "pending")
        if a.result is not None and not a.result.passed and a.result.message.strip():
            what += ": " + " ".join(a.result.message.split())[:200]
        if a.speedup:
            what += f", {format_speedup(a.speedup)} over the baseline"
        lines.append(f"- round {a.round} ({a.kind}): {what}")
    if (hidden := earlier + max(0, len(history) - limit)) > 0:
        lines.insert(0, f"({hidden} earlier attempts not shown)")
    return "\n".join(lines) or "(none yet)"


def evidence_text(evidence: list[AttemptEvidence], facts: Facts | None = None) -> str:
    """Every attempt of a cycle: what changed, what happened, why it failed, where time went."""
    blocks = []
    for e in evidence:
        head = f"attempt {e.round} ({e.kind}): {e.status}"
        if e.speedup is not None:
            head += f", {format_speedup(e.speedup)} over the baseline"
            if e.over_parent is not None:
                head += f", {format_speedup(e.over_parent)} over the parent"
        lines = [head]
        if e.change.strip():
            lines.append("  change: " + " ".join(e.change.split())[:400])
        if e.error.strip():
            lines.append("  error:\n" + "\n".join("    " + line for line in e.error.strip().splitlines()))
        if e.times:
            lines.append("  per workload:\n" + "\n".join("  " + line for line in times_text(e.times, facts).splitlines()))
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) or "(no attempts)"


def inspirations_text(inspirations: list[Inspiration], budget_chars: int) -> str:
    """Other programs of the database: how each did, why it is shown, its code (cut to share the budget)."""
    if not inspirations:
        return "(none yet: the database holds only the parent)"
    share = max(budget_chars // len(inspirations), 1_000)
    blocks = []
    for i, insp in enumerate(inspirations, 1):
        how = f"{format_speedup(insp.speedup)} over the baseline" if insp.speedup is not None else insp.status
        blocks.append(f"## Inspiration {i}: {how} ({insp.why})\n\n" + cut_middle(format_sources(insp.solution.sources), share))
    return "\n\n".join(blocks)


def knowledge_text(tree: Tree) -> str:
    """What a coder should know of the world model: the kernel summary and the open hypotheses."""
    hypotheses = "\n".join(line for line in render_hypotheses(tree).splitlines() if "[open]" in line or line.startswith("  "))
    return render_summary(tree) + ("\nOpen hypotheses:\n" + hypotheses if hypotheses else "")


def cut_middle(text: str, limit: int) -> str:
    """`text` within `limit` characters, keeping its head and tail (where code declares and returns)."""
    if len(text) <= limit:
        return text
    keep = max(limit - 60, 40)
    head, tail = text[: keep // 2], text[-(keep // 2):]
    return f"{head}\n... ({len(text) - keep} characters cut to fit the prompt budget) ...\n{tail}"
