"""What a failed evaluation says that someone fixing the code needs, in a bounded number of characters.

The coder and the planner both read it: the verdict, then per workload what was wrong (which element,
how far off, what share of the output was within tolerance), then the evidence the kind of failure
calls for: a compiler's output with its source context (Triton prints the offending source line and
a caret under the column; nvcc the line after each `error:`), or the candidate's traceback, whose
last lines hold the exception.
"""

from __future__ import annotations

from ksearch_ray.models import EvalResult, Status, WorkloadResult

CONTEXT_BEFORE = 3
CONTEXT_AFTER = 8
"""Lines kept around each compiler error line: the source line and caret follow it, the location precedes it."""


def decisive_text(result: EvalResult, chars: int = 2500) -> str:
    """The evidence of a failure ('' when it passed), at most `chars` characters."""
    if result.passed:
        return ""
    head = f"{result.status.value}: {result.message.strip()}".strip()
    workloads = [line for w in result.workloads if w.status is not Status.PASSED and (line := _workload_line(w))]
    if len(workloads) > 8:
        workloads = [*workloads[:8], f"... and {len(workloads) - 8} more workloads failed"]
    log = [line.rstrip() for line in result.log.strip("\n").splitlines()]
    if result.status is Status.COMPILE_ERROR:
        evidence = _around_errors(log)
    elif result.status in (Status.RUNTIME_ERROR, Status.CRASHED, Status.TIMEOUT):
        evidence = log[-40:]  # the exception is last, its frames just above it
    else:
        evidence = log[:20]
    parts = [head]
    if workloads:
        parts.append("Per workload:\n" + "\n".join(f"  {line}" for line in workloads))
    if any(line.strip() for line in evidence):
        parts.append("\n".join(evidence))
    text = "\n".join(parts)
    if len(text) <= chars:
        return text
    # Over the budget: keep the verdict and the per-workload lines, and the evidence's first part (where
    # a compiler names the first error) and last part (where a traceback ends).
    keep = max(chars - 60, 200)
    return f"{text[: keep * 2 // 3]}\n... ({len(text) - keep} characters not shown) ...\n{text[-(keep // 3):]}"


def _workload_line(w: WorkloadResult) -> str:
    facts = []
    if w.max_abs_error is not None:
        facts.append(f"max abs error {w.max_abs_error:.3g}")
    if w.max_rel_error is not None:
        facts.append(f"max rel error {w.max_rel_error:.3g}")
    if w.fraction_ok is not None:
        # A few bad elements in millions: say how few (99.99...% would round to 100%).
        facts.append(f"{w.fraction_ok:.1%} of elements within tolerance" if w.fraction_ok < 0.99
                     else f"{1 - w.fraction_ok:.2g} of the elements outside tolerance")
    message = " ".join(w.message.split())
    if not message and not facts:
        return ""
    return f"{w.workload}: {w.status.value}" + (f": {message}" if message else "") + (f" ({'; '.join(facts)})" if facts else "")


def _around_errors(log: list[str]) -> list[str]:
    """Each error line with the lines around it (its location before, the source and caret after),
    overlapping windows merged; the whole log when no line names an error."""
    hits = [i for i, line in enumerate(log) if "error" in line.lower()]
    if not hits:
        return log[:40]
    keep: list[int] = []
    for i in hits:
        keep.extend(range(max(i - CONTEXT_BEFORE, 0), min(i + CONTEXT_AFTER + 1, len(log))))
    out: list[str] = []
    last = -1
    for i in sorted(set(keep)):
        if last >= 0 and i > last + 1:
            out.append("...")
        out.append(log[i])
        last = i
    return out[:80]
