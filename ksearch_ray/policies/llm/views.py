"""The text a request turns into, field by field, for the prompt templates.

Pure functions of the request records: what an evaluation, a history of attempts or a cycle's
evidence looks like to a model. The templates (`prompts/*.md`) decide where each goes.
"""

from __future__ import annotations

from ksearch_ray.models import EvalResult
from ksearch_ray.policies.contract import Attempt, AttemptEvidence, Inspiration, WorkloadTime
from ksearch_ray.policies.llm.prompting import format_sources
from ksearch_ray.taskspec.task import TaskDefinition
from ksearch_ray.worldmodel.render import format_speedup, render_hypotheses, render_summary
from ksearch_ray.worldmodel.tree import Tree

CHARS_PER_TOKEN = 3
"""A conservative estimate (code runs about 3 characters a token, prose about 4)."""


def interface_text(task: TaskDefinition) -> str:
    def spec(name: str, s) -> str:  # type: ignore[no-untyped-def]
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


def times_text(times: list[WorkloadTime]) -> str:
    lines = []
    for t in times:
        parts = [f"{t.ms:.4g} ms"]
        if t.parent_ms:
            parts.append(f"parent {t.parent_ms:.4g} ms ({t.parent_ms / t.ms:.2f}x)")
        if t.baseline_ms:
            parts.append(f"baseline {t.baseline_ms:.4g} ms ({t.baseline_ms / t.ms:.2f}x)")
        lines.append(f"  {t.workload}: " + ", ".join(parts))
    return "\n".join(lines)


def result_text(result: EvalResult | None, speedup: float | None, times: list[WorkloadTime]) -> str:
    """A result and the speedup of that same result (never another attempt's)."""
    if result is None:
        return "(not evaluated)"
    if not result.passed:
        return f"{result.status.value}: {result.message}\n{result.log[-2500:]}".strip()
    head = f"PASSED; {format_speedup(speedup)} over the baseline" if speedup else "PASSED"
    body = times_text(times) or "\n".join(
        f"  {w.workload}: mean {w.timing.mean_ms:.4g} ms" for w in result.workloads if w.timing
    )
    return f"{head}\nPer workload:\n{body}" if body else head


def history_text(history: list[Attempt], limit: int = 12) -> str:
    lines = []
    for a in history[-limit:]:
        what = a.error or (a.result.status.value if a.result else "pending")
        if a.speedup:
            what += f", {format_speedup(a.speedup)} over the baseline"
        lines.append(f"- round {a.round} ({a.kind}): {what}")
    if len(history) > limit:
        lines.insert(0, f"({len(history) - limit} earlier attempts not shown)")
    return "\n".join(lines) or "(none yet)"


def evidence_text(evidence: list[AttemptEvidence]) -> str:
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
            lines.append("  per workload:\n" + "\n".join("  " + line for line in times_text(e.times).splitlines()))
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
