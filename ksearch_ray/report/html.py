"""`ksearch report`: one self-contained HTML file that tells the story of a run.

Inline CSS, inline SVG charts and a few lines of inline JavaScript (sorting, filtering); a
Content-Security-Policy forbids every fetch, so the page shows the same on a laptop with no
network as where it was made. Titles, notes, errors and code come from a model's output:
every piece of text is escaped, and no data is ever placed inside the script.
"""

from __future__ import annotations

import math
import time
from html import escape
from pathlib import Path
from typing import Any

import ksearch_ray
from ksearch_ray.config import flat_settings
from ksearch_ray.events import NO_CODE
from ksearch_ray.measure import format_noise, with_noise
from ksearch_ray.models import Status
from ksearch_ray.report import svg
from ksearch_ray.report.run_tables import Origin, Run
from ksearch_ray.worldmodel.render import format_speedup
from ksearch_ray.worldmodel.tree import (
    ROOT_ID,
    ActionNode,
    NodeStatus,
    Tree,
    measured_over_parent,
    solution_speedup,
)

CSP = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:"


def write_report(run: Run, out: Path) -> Path:
    out.write_text(render(run), encoding="utf-8")
    return out


def render(run: Run, *, now: float | None = None) -> str:
    now = time.time() if now is None else now
    sections = [
        _section("outcome", "Outcome", _outcome(run, now)),
        _section("progress", "Best so far", _progress(run)),
        _section("world-model", "World model", _world_model(run)),
        _section("evaluations", "Evaluations", _evaluations(run)),
        _section("workloads", "Best against the baseline, per workload", _workloads(run)),
        _section("profiles", "Profiles of the bests (Nsight Compute)", _profiles(run)),
        _section("llm", "LLM ledger", _ledger(run)),
        _section("code", "Best kernel", _code(run)),
        _section("settings", "Settings", _settings(run)),
    ]
    cfg = run.config
    subtitle = " · ".join(h(x) for x in (
        f"task {cfg.get('task', '?')}", f"method {run.method}", run.policy, run.hardware, _date(run.manifest.get("created")),
    ) if x)
    last_seq = run.events[-1].seq if run.events else 0
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{CSP}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>ksearch report: {h(run.run_id)}</title>
<style>{STYLE}</style></head>
<body>
<header><h1>{h(run.run_id)}</h1><p class="sub">{subtitle}</p>
<nav>{" ".join(f'<a href="#{key}">{title}</a>' for key, title in NAV)}</nav></header>
<main>
{"".join(sections)}
</main>
<footer>Written by ksearch-ray {h(ksearch_ray.__version__)} on {h(_date(now))} from {len(run.events)} events
(up to event {last_seq}) of <code>{h(str(run.root.resolve()))}</code>. Self-contained: it needs no network.</footer>
<script>{SCRIPT}</script>
</body></html>
"""


NAV = [("outcome", "Outcome"), ("progress", "Best so far"), ("world-model", "World model"), ("evaluations", "Evaluations"),
       ("workloads", "Per workload"), ("profiles", "Profiles"), ("llm", "LLM ledger"), ("code", "Best kernel"), ("settings", "Settings")]


# --------------------------------------------------------------------------------------- sections


def _outcome(run: Run, now: float) -> str:
    cfg = run.config
    if run.finished is not None:
        state = f'<span class="pill ok">finished: {h(run.finished)}</span>'
    elif run.stopped is not None:
        state = (f'<span class="pill bad">stopped: {h(run.stopped)}</span> the last session ended early; '
                 f"<code>ksearch resume {h(str(run.root.resolve()))}</code> continues it")
    else:
        age = f"; its last event is {_duration(now - run.last_event_t)} older than this report" if run.last_event_t else ""
        state = (f'<span class="pill warn">not finished</span> running, or killed before it could say '
                 f"(<code>ksearch resume</code> continues it){h(age)}")
    rows = [("state", state), ("best", _best_text(run))]
    noise = run.noise()
    rows.append(("noise", h(f"{format_noise(noise)}: how far repeated measurements of one unchanged kernel disagree"
                            + (f" on {run.best.gpu}" if run.best and run.best.gpu else "")
                            + "; a smaller difference between two speedups is not evidence of anything")))
    for gpu, confirm in sorted(run.confirms.items()):
        where = f" on {gpu}" if gpu else ""
        cut = f" (stopped early: {confirm.cut_short})" if confirm.cut_short else ""
        rows.append((f"re-timed{h(where)}", h(f"{len(confirm.repeats)}x, interleaved with the baseline: "
                                               f"{confirm.verdict}{cut}")))
    counts = run.status_counts()
    count_text = " ".join(
        f'<span class="pill {_status_class(s)}">{h(s)} {n}</span>' for s, n in counts.items()
    ) or "none yet"
    calls = run.llm_call_rows
    if calls:
        unpriced = "" if any(c["cost_known"] for c in calls) else " (the model has no known price: cost shows $0)"
        llm_text = f"{len(calls)} calls, {run.llm_tokens:,} tokens, ${run.llm_cost_usd:.2f}{unpriced}"
    else:
        llm_text = "no LLM calls" + (" (offline policy)" if not run.model else " yet")
    outages = [o for o in run.view.outages if o.state != "began"]
    if outages:
        waited = sum(o.waited_s for o in outages)
        rows.append(("LLM outages", h(f"{len(outages)}, {_duration(waited)} waited in all, "
                                      f"{sum(o.failed_calls for o in outages)} failed calls; no round was spent on them")))
    rows += [
        ("rounds", f"{run.rounds_used} of {h(run.rounds_budget or '?')} (code generations)"),
        ("candidate outcomes", count_text),
        ("LLM", h(llm_text)),
        ("running time", h(_duration(run.wall_s)) + (f", over {run.resumes + 1} sessions" if run.resumes else "")),
    ]
    if (cfg.get("evaluation") or {}).get("device") == "cpu":
        rows.append(("timings", "CPU path: host wall-clock times in Triton's interpreter, not GPU latencies; "
                                "they rank variants on this machine only"))
    body = "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows)
    return f'<table class="facts">{body}</table>'


def _best_text(run: Run) -> str:
    best, seed, noise = run.best, run.seed, run.noise()
    seed_text = f"; the seed it started from: {h(with_noise(seed.speedup, noise))}" if seed else ""
    if best is None:
        return "no passing candidate yet" + seed_text
    speed = f"<b>{h(with_noise(best.speedup, noise))}</b> over the baseline"
    if seed and best.solution_id == seed.solution_id:
        return f"the seed, {speed}: nothing faster has been found" + (f" ({h(best.why)})" if best.why.startswith("back") else "")
    where = f" on {best.gpu}" if best.gpu else ""
    return f"{speed}{h(where)} (node {h(best.node)}, round {h(best.round)}){seed_text}"


def _progress(run: Run) -> str:
    best = run.best_progress_rows
    cands = [r for r in run.evaluation_rows if r["origin"] == Origin.CANDIDATE]
    if not best and not cands:
        return _empty("Nothing has been measured yet.")
    points = [svg.Point(float(r["round"] or 0), r["speedup"], f"round {r['round']}: {format_speedup(r['speedup'])} ({r['node']})")
              for r in best]
    others = [
        svg.Point(float(r["round"]), r["speedup"] if r["status"] == Status.PASSED.value else None,
                  f"round {r['round']}: {r['status']}" + (f" {format_speedup(r['speedup'])}" if r["speedup"] else ""))
        for r in cands if r["round"] is not None
    ]
    charts = [_figure(svg.step_chart(points, others=others, x_label="round", y_label="speedup over baseline",
                                     x_end=float(run.rounds_used)), "against round (dots: passing candidates; crosses: failed)")]
    if best:
        wall = run.wall_s
        minutes = wall > 180
        unit = 60.0 if minutes else 1.0
        timed = [svg.Point(float(r["elapsed_s"]) / unit, r["speedup"], p.label) for r, p in zip(best, points, strict=True)]
        charts.append(_figure(svg.step_chart(timed, x_label="running time (" + ("min" if minutes else "s") + ")",
                                             y_label="speedup over baseline", x_end=wall / unit), "against running time"))
        spent = float(run.llm_cost_so_far)
        if spent > 0:
            dollars = [svg.Point(float(r["cost_usd"]), r["speedup"], p.label) for r, p in zip(best, points, strict=True)]
            charts.append(_figure(svg.step_chart(dollars, x_label="LLM spend (USD)", y_label="speedup over baseline", x_end=spent),
                                  "against dollars spent"))
        else:
            charts.append(f'<figure class="note">{_empty("No LLM spend recorded (offline policy, or a model without a known price): no chart against dollars.")}</figure>')
    else:
        charts.append(f'<figure class="note">{_empty("No candidate has passed yet: no best-so-far line.")}</figure>')
    return f'<div class="charts">{"".join(charts)}</div>'


def _world_model(run: Run) -> str:
    tree = run.tree
    if tree is None and run.keeps_world_model:
        return _empty("The world model has not been created yet.")
    if tree is None:
        return _empty(f"This run keeps no world model (method {run.method}).")
    counts: dict[str, int] = {}
    for node in tree.nodes.values():
        counts[node.status.value] = counts.get(node.status.value, 0) + 1
    legend = " ".join(f'<span class="pill {_node_class(NodeStatus(s))}">{h(s)} {n}</span>' for s, n in sorted(counts.items()))
    root = tree.root
    seed = (f"seed {h(format_speedup(solution_speedup(root)))} vs baseline, solution <code>{h(root.solution.solution_id)}</code>"
            if root.solution else "no seed: actions start from the baseline")
    notes = _notes(root.notes)
    items = "".join(_node(tree, child) for child in tree.children(ROOT_ID))
    return (f'<p>{len(tree.nodes)} actions, tree version {tree.version}. {legend}</p>'
            f'<ul class="tree"><li><div class="node"><b>root</b>: {h(root.title)} ({seed})</div>{notes}'
            f'<ul>{items}</ul></li></ul>' + ("" if tree.nodes else _empty("The planner has not proposed any action yet.")))


def _node(tree: Tree, node: ActionNode) -> str:
    facts = [f"difficulty {node.difficulty}", f"score {node.score:.2f}", f"expected {format_speedup(node.expected_speedup)}"]
    if node.solution is not None:
        facts.append(f"measured {format_speedup(measured_over_parent(tree, node))} over parent")
        facts.append(f"{format_speedup(solution_speedup(node))} vs baseline")
    if node.split_from:
        facts.append(f"alternative to {node.split_from}")
    if node.status is NodeStatus.LEASED and node.id in tree.leases:
        facts.append(f"leased to {tree.leases[node.id].holder}")
    detail = "".join(
        f"<p><b>{label}</b>: {h(text)}</p>" for label, text in (("description", node.description), ("rationale", node.rationale)) if text
    )
    if node.solution is not None:
        detail += f"<p><b>solution</b>: <code>{h(node.solution.solution_id)}</code></p>"
    body = (f"<details><summary>details</summary>{detail}</details>" if detail else "") + _notes(node.notes)
    children = tree.children(node.id)
    sub = f"<ul>{''.join(_node(tree, c) for c in children)}</ul>" if children else ""
    return (f'<li><div class="node"><span class="id">{h(node.id)}</span> '
            f'<span class="pill {_node_class(node.status)}">{h(node.status.value)}</span> <b>{h(node.title)}</b> '
            f'<span class="facts">{h(" · ".join(facts))}</span></div>{body}{sub}</li>')


def _notes(notes: list[Any]) -> str:
    if not notes:
        return ""
    return '<ul class="notes">' + "".join(f"<li><i>{h(n.kind.value)}</i> {h(n.text)}</li>" for n in notes) + "</ul>"


def _evaluations(run: Run) -> str:
    frame = run.evaluation_rows
    if not frame:
        return _empty("No evaluations yet.")
    titles = {n.id: n.title for n in run.tree.nodes.values()} if run.tree else {}
    statuses = list(dict.fromkeys(r["status"] for r in frame))
    buttons = "".join(f'<button type="button" class="filter pill {_status_class(s)}" data-status="{h(s)}" aria-pressed="true">{h(s)}</button>'
                      for s in statuses)
    several_gpus = len({r["gpu"] for r in frame if r["gpu"] is not None}) > 1
    header = ["event", "round", "of", "cycle", "node", "status", "speedup", "score", "eval s", "at", "solution",
              *(["GPU"] if several_gpus else []), "error (first lines)"]
    rows = []
    for r in frame:
        node = r["node"] or ""
        node_text = f"{node} {titles[node]}" if node in titles else node
        cells = [
            _cell(r["seq"], r["seq"]), _cell(r["round"] if r["round"] is not None else "", r["round"]), _cell(r["origin"]),
            _cell(r["cycle"] or ""), _cell(node_text, wrap=True), f'<td><span class="pill {_status_class(r["status"])}">{h(r["status"])}</span></td>',
            _cell(format_speedup(r["speedup"]) if r["speedup"] is not None else "", r["speedup"]),
            _cell(f"{r['score']:.4g}" if r["score"] is not None else "", r["score"]),
            _cell(f"{r['seconds']:.1f}" if r["seconds"] is not None else "", r["seconds"]),
            _cell(_duration(r["elapsed_s"]) if r["elapsed_s"] is not None else "", r["elapsed_s"]),
            f'<td><code>{h(r["solution_id"] or "")}</code></td>',
            *([_cell(r["gpu"] or "")] if several_gpus else []),
            f'<td><pre class="err">{h(r["error"])}</pre></td>' if r["error"] else "<td></td>",
        ]
        rows.append(f'<tr data-status="{h(r["status"])}">{"".join(cells)}</tr>')
    hint = (f"Click a column heading to sort. Score: the task's score (geomean latency in ms for latency tasks; lower is "
            f"better). Speedups are against the baseline measured on the same evaluator in the same session; measurement "
            f"{format_noise(run.noise())}. {NO_CODE}: the round produced no code to evaluate.")
    return (f'<p class="filters">Show: {buttons}</p><p class="hint">{h(hint)}</p>'
            f'<div class="scroll"><table class="sortable data"><thead><tr>{"".join(f"<th>{c}</th>" for c in header)}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table></div>')


def _workloads(run: Run) -> str:
    frame = run.workload_rows()
    base = run.best_baseline()
    if base is None:
        return _empty("The baseline has not been measured yet.")
    if run.best is None:
        return _empty("No best solution yet.")
    if all(r["best_ms"] is None for r in frame):
        return _empty("The best solution's per-workload timings are not in the log.")
    clock = ("GPU latency (CUDA events)" if base.device == "cuda"
             else "host wall-clock in Triton's interpreter (CPU path), not GPU latency")
    # Bars on a log scale whose full width is parity (1x) or the largest speedup shown, whichever is larger: a
    # speedup far below 1 (the CPU path) is a short bar, never a full one, and still more than a tick.
    ratios = [float(r["speedup"]) for r in frame if r["speedup"] is not None and r["speedup"] > 0]
    top = max([1.0, *ratios])
    floor = min([top, *ratios]) / 2

    def bar_width(ratio: float) -> float:
        return max(1.0, 100 * math.log(ratio / floor) / math.log(top / floor))

    rows = []
    for r in frame:
        ratio = r["speedup"]
        bar = f'<span class="bar" style="width:{bar_width(ratio):.0f}%"></span>' if ratio else ""
        rows.append(
            f"<tr>{_cell(r['workload'], wrap=True)}{_cell(_ms(r['baseline_ms']), r['baseline_ms'])}{_cell(_ms(r['best_ms']), r['best_ms'])}"
            f"{_cell(format_speedup(ratio) if ratio else '', ratio)}<td class=\"barcell\">{bar}</td>"
            + "".join(_cell(format_speedup(r[c]) if r[c] else "", r[c]) for c in ("kernel_speedup", "call_speedup"))
            + "</tr>"
        )
    return (f"<p>Mean latency per workload ({h(base.objective)} objective), {h(clock)}; baseline "
            f"<code>{h(base.solution_name)}</code>, measured on the same evaluator in the same session as the best. "
            f"Bars: speedup on a log scale, full width {h(format_speedup(top))}{' (parity)' if top == 1.0 else ''}. "
            f"Beside it, the speedup of each figure: kernel (CUDA-graph replay) and call (host work included).</p>"
            f'<table class="sortable data"><thead><tr><th>workload</th><th>baseline ms</th><th>best ms</th><th>speedup</th>'
            f"<th></th><th>kernel speedup</th><th>call speedup</th></tr></thead><tbody>{''.join(rows)}</tbody></table>")


def _profiles(run: Run) -> str:
    note = run.view.profiler
    if note is None:
        return _empty("Profiling was not asked for (--profile-bests).")
    if not note.evaluators:
        return _empty(f"Profiling was asked for, but no evaluator could profile: {note.problem}.")
    if not run.view.profiles:
        return _empty(f"No best has been profiled yet ({note.tool}).")
    parts = [f"<p>Each new best was profiled once with {h(note.tool)}, outside its timed measurement: one call on its "
             "slowest workload, every kernel replayed with cold caches. Throughputs are % of the GPU's peak; stalls are "
             "warp cycles per issued instruction. The profiler ran beside the candidate's code, so these figures were "
             "checked for range and are evidence, not measurements.</p>"]
    header = ["kernel", "ms", "share", "DRAM %", "DRAM GB/s", "SM %", "memory %", "occupancy %", "theoretical %",
              "registers", "block", "grid", "top stalls"]
    for profile in sorted(run.view.profiles.values(), key=lambda p: p.seq):
        r = profile.result
        title = f"solution {profile.solution_id} on {profile.gpu}"
        if not r.ok:
            parts.append(f"<h3>{h(title)}</h3>" + _empty(f"Not profiled ({r.status}, after {r.seconds:.0f} s): {r.message}."))
            continue
        rows = []
        for k in r.kernels:
            share = k.duration_ms / r.kernels_ms if r.kernels_ms else None
            rows.append("<tr>" + "".join((
                _cell(k.name, wrap=True), _cell(_ms(k.duration_ms), k.duration_ms),
                _cell(f"{share:.0%}" if share is not None else "", share), *(_cell(_ms(v), v) for v in (
                    k.dram_pct, k.dram_gb_s, k.sm_pct, k.memory_pct, k.occupancy_pct, k.theoretical_occupancy_pct)),
                _cell(k.registers if k.registers is not None else "", k.registers),
                _cell("x".join(map(str, k.block)) if k.block else ""), _cell("x".join(map(str, k.grid)) if k.grid else ""),
                _cell(", ".join(f"{st.reason} {st.cycles:.2g}" for st in k.stalls), wrap=True),
            )) + "</tr>")
        parts.append(f"<h3>{h(title)}</h3><p>{h(r.lines()[0])}; the profile took {r.seconds:.1f} s.</p>"
                     f'<div class="scroll"><table class="sortable data"><thead><tr>{"".join(f"<th>{c}</th>" for c in header)}'
                     f"</tr></thead><tbody>{''.join(rows)}</tbody></table></div>")
    return "".join(parts)


def _ledger(run: Run) -> str:
    ledger = run.ledger_rows()
    if not ledger:
        return _empty("No LLM calls" + (": the offline policy plays planner and coder." if not run.model else " yet."))
    columns = ["calls", "cached", "failed", "prompt_tokens", "completion_tokens", "cost_usd"]
    rows = []
    for role in dict.fromkeys(r["role"] for r in ledger):
        part = [r for r in ledger if r["role"] == role]
        for r in part:
            rows.append(_ledger_row(r["role"], r["kind"], r, r["mean_latency_s"]))
        rows.append(_ledger_row(role, "all", {c: sum(r[c] for r in part) for c in columns}, None, total=True))
    rows.append(_ledger_row("all", "all", {c: sum(r[c] for r in ledger) for c in columns}, None, total=True))
    failed = [r for r in run.llm_call_rows if r["failed"]]
    errors = ""
    if failed:
        items = "".join(f"<li>{h(r['role'])} {h(r['kind'])}: {h(r['error'])}</li>" for r in failed[-10:])
        errors = f"<p>Failed calls ({len(failed)}; the last ten):</p><ul class=\"notes\">{items}</ul>"
    head = "".join(f"<th>{c}</th>" for c in ("role", "call kind", "calls", "cached", "failed", "prompt tokens",
                                             "completion tokens", "cost USD", "mean latency s"))
    return f'<table class="data"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>{errors}'


def _ledger_row(role: str, kind: str, r: dict[str, Any], latency: float | None, *, total: bool = False) -> str:
    cells = [h(role), h(kind), *(f"{int(r[c]):,}" for c in ("calls", "cached", "failed", "prompt_tokens", "completion_tokens")),
             f"{float(r['cost_usd']):.4f}", f"{latency:.2f}" if latency is not None else ""]
    return f'<tr{" class=total" if total else ""}>{"".join(f"<td>{c}</td>" for c in cells)}</tr>'


def _code(run: Run) -> str:
    best = run.best
    if best is None:
        return _empty("No best solution yet.")
    solution = run.solution(best.solution_id)
    if solution is None:
        return _empty(f"Solution {best.solution_id} is not in the run directory.")
    plain = run.root / "best"
    where = (f"<p>Also written as plain files in <code>{h(str(plain.resolve()))}</code>.</p>" if plain.is_dir() else "")
    files = "".join(f"<h3>{h(name)}</h3><pre class=\"code\"><code>{h(text)}</code></pre>" for name, text in solution.sources.items())
    return (f"<p>{h(with_noise(best.speedup, run.noise()))} over the baseline. Solution <code>{h(solution.id)}</code> "
            f"({h(solution.language)}, entry <code>{h(solution.entry_file)}::{h(solution.entry_point)}</code>), "
            f"written by {h(solution.author)}.</p>"
            + (f"<p>{h(solution.description)}</p>" if solution.description else "") + where + files)


def _settings(run: Run) -> str:
    settings = flat_settings(run.config)
    seed = run.seed
    # What the defaults resolved to in this run, beside the settings as given.
    if settings.get("search.from_solution") is None:
        settings["search.from_solution"] = (f"(none given: started from {seed.result.solution_name})" if seed and seed.result
                                            else "(none: started from the specification)")
    if settings.get("evaluation.workloads") is None and run.workload_set:
        settings["evaluation.workloads"] = f"(the task's default: {run.workload_set})"
    rows = "".join(f"<tr><th>{h(k)}</th><td>{h(_value(v))}</td></tr>" for k, v in settings.items())
    versions = run.manifest.get("versions") or {}
    extra = [("task bundle", run.manifest.get("task_root")), ("versions", ", ".join(f"{k} {v}" for k, v in versions.items())),
             ("Ray resources", _value((run.manifest.get("ray") or {}).get("resources"))), ("run directory", str(run.root.resolve()))]
    rows += "".join(f"<tr><th>{h(k)}</th><td>{h(_value(v))}</td></tr>" for k, v in extra if v)
    return f'<table class="facts settings">{rows}</table>'


# ---------------------------------------------------------------------------------------- helpers


def h(value: object) -> str:
    return escape("" if value is None else str(value))


def _section(key: str, title: str, body: str) -> str:
    return f'<section id="{key}"><h2>{h(title)}</h2>{body}</section>\n'


def _empty(text: str) -> str:
    return f'<p class="empty">{h(text)}</p>'


def _figure(chart: str, caption: str) -> str:
    return f"<figure>{chart}<figcaption>{h(caption)}</figcaption></figure>" if chart else ""


def _cell(text: object, sort_key: object = None, *, wrap: bool = False) -> str:
    key = "" if sort_key is None else f' data-v="{h(sort_key)}"'
    return f"<td{key}{' class=wrap' if wrap else ''}>{h(text)}</td>"


def _value(value: object) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items())
    if isinstance(value, list):
        return ", ".join(str(v) for v in value) or "[]"
    return "—" if value is None else str(value)


def _status_class(status: str) -> str:
    if status == Status.PASSED.value:
        return "ok"
    if status in (Status.CRASHED.value, Status.TIMEOUT.value, Status.INTEGRITY_VIOLATION.value):
        return "bad"
    return "warn" if status == NO_CODE else "fail"


def _node_class(status: NodeStatus) -> str:
    return {NodeStatus.DONE: "ok", NodeStatus.TOO_HARD: "fail", NodeStatus.LEASED: "warn"}.get(status, "")


def _ms(value: float | None) -> str:
    return "" if value is None else f"{value:.4g}"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _date(t: object) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(float(t))) if isinstance(t, int | float) else ""


STYLE = """
:root { --ok:#1a7f37; --fail:#b35900; --bad:#cf222e; --warn:#7d4e00; --line:#d0d7de; --muted:#57606a; --accent:#0969da; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; margin: 0; color: #1f2328; background: #fff; }
header { padding: 16px 24px 8px; border-bottom: 1px solid var(--line); background: #f6f8fa; }
h1 { margin: 0; font-size: 22px; word-break: break-all; }
h2 { font-size: 18px; border-bottom: 1px solid var(--line); padding-bottom: 4px; margin-top: 28px; }
h3 { font-size: 14px; margin: 14px 0 4px; }
.sub { margin: 4px 0; color: var(--muted); }
nav a { margin-right: 12px; color: var(--accent); text-decoration: none; }
main { padding: 0 24px 24px; max-width: 1500px; }
footer { padding: 12px 24px; color: var(--muted); border-top: 1px solid var(--line); font-size: 12px; }
code, pre { font-family: ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace; font-size: 12px; }
pre.code { background: #f6f8fa; border: 1px solid var(--line); padding: 10px; overflow-x: auto; }
pre.err { margin: 0; white-space: pre-wrap; word-break: break-word; min-width: 36ch; max-width: 70ch; color: #57202a; }
table { border-collapse: collapse; } table.data { font-size: 13px; }
table.data td, table.data th { border-bottom: 1px solid var(--line); padding: 3px 8px; text-align: left; vertical-align: top; }
table.data th { background: #f6f8fa; position: sticky; top: 0; white-space: nowrap; }
table.data td { white-space: nowrap; } table.data td.wrap { white-space: normal; overflow-wrap: anywhere; min-width: 16ch; max-width: 30ch; }
table.sortable th { cursor: pointer; user-select: none; }
table.sortable th[data-dir=asc]::after { content: " \\25B2"; } table.sortable th[data-dir=desc]::after { content: " \\25BC"; }
table.facts th { text-align: left; padding: 2px 16px 2px 0; color: var(--muted); font-weight: 600; vertical-align: top; white-space: nowrap; }
table.facts td { padding: 2px 0; word-break: break-word; }
tr.total td { font-weight: 600; background: #f6f8fa; }
.pill { display: inline-block; padding: 0 7px; border-radius: 10px; border: 1px solid var(--line); font-size: 12px; background: #f6f8fa; }
.pill.ok { color: #fff; background: var(--ok); border-color: var(--ok); }
.pill.fail { color: #fff; background: var(--fail); border-color: var(--fail); }
.pill.bad { color: #fff; background: var(--bad); border-color: var(--bad); }
.pill.warn { color: var(--warn); background: #fff8c5; border-color: #d4a72c; }
button.filter { cursor: pointer; margin-right: 4px; }
button.filter[aria-pressed=false] { opacity: .35; }
.empty { color: var(--muted); font-style: italic; }
.hint { color: var(--muted); font-size: 12px; }
.scroll { max-height: 640px; overflow: auto; border: 1px solid var(--line); }
.charts { display: flex; flex-wrap: wrap; gap: 16px; }
figure { margin: 0; } figure.note { width: 320px; display: flex; align-items: center; }
figcaption { color: var(--muted); font-size: 12px; text-align: center; }
svg.chart text { font-size: 11px; fill: #57606a; } svg.chart .label { fill: #1f2328; font-size: 12px; }
svg.chart .plot { fill: #fff; stroke: var(--line); } svg.chart .grid { stroke: #eaeef2; } svg.chart .axis { stroke: #8c959f; }
svg.chart .reference { stroke: #8c959f; stroke-dasharray: 4 3; }
svg.chart .best { fill: none; stroke: var(--accent); stroke-width: 2; } svg.chart .bestpt { fill: var(--accent); }
svg.chart .other { fill: #8c959f; opacity: .7; } svg.chart .failed { stroke: var(--bad); stroke-width: 1.5; }
ul.tree, ul.tree ul { list-style: none; padding-left: 18px; border-left: 1px dotted var(--line); margin: 2px 0; }
ul.tree > li { margin-left: -18px; }
.node { padding: 1px 0; } .node .id { font-family: ui-monospace, monospace; color: var(--muted); }
.node .facts { color: var(--muted); font-size: 12px; }
details summary { cursor: pointer; color: var(--accent); font-size: 12px; }
details p { margin: 2px 0 2px 12px; }
ul.notes { margin: 2px 0 4px 0; padding-left: 18px; font-size: 12px; color: #3d444d; }
.barcell { width: 220px; } .bar { display: inline-block; height: 10px; background: var(--accent); }
"""

SCRIPT = """
'use strict';
function sortKey(cell) {
  const raw = cell.dataset.v !== undefined ? cell.dataset.v : cell.textContent.trim();
  const num = Number(raw);
  return raw !== '' && !Number.isNaN(num) ? [0, num] : [1, raw.toLowerCase()];
}
document.querySelectorAll('table.sortable').forEach(function (table) {
  table.querySelectorAll('thead th').forEach(function (th, col) {
    th.addEventListener('click', function () {
      const dir = th.dataset.dir === 'asc' ? 'desc' : 'asc';
      table.querySelectorAll('thead th').forEach(function (other) { delete other.dataset.dir; });
      th.dataset.dir = dir;
      const body = table.tBodies[0];
      const rows = Array.from(body.rows);
      rows.sort(function (a, b) {
        const x = sortKey(a.cells[col]), y = sortKey(b.cells[col]);
        const order = x[0] - y[0] || (x[1] < y[1] ? -1 : x[1] > y[1] ? 1 : 0);
        return dir === 'asc' ? order : -order;
      });
      rows.forEach(function (row) { body.appendChild(row); });
    });
  });
});
document.querySelectorAll('button.filter').forEach(function (button) {
  button.addEventListener('click', function () {
    const shown = button.getAttribute('aria-pressed') !== 'true';
    button.setAttribute('aria-pressed', String(shown));
    document.querySelectorAll('#evaluations tbody tr').forEach(function (row) {
      if (row.dataset.status === button.dataset.status) { row.hidden = !shown; }
    });
  });
});
"""
