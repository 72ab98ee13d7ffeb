"""What a search shows while it runs: a live view on a terminal, plain lines anywhere else.

Both read the driver's state and never change it. Waiting is always visible: the live view
redraws every half second with the LLM calls and evaluations in flight and their age, and
plain lines (job logs, pipes) repeat what is being waited for when it takes long.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TYPE_CHECKING, Protocol, TextIO

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from ksearch_ray.measure import with_noise

if TYPE_CHECKING:
    from ksearch_ray.run.engine import Search

HEARTBEAT_S = 30.0
"""Plain-line mode repeats what it waits for once a wait is this old, and then this often."""


class Reporter(Protocol):
    def phase(self, text: str) -> None:
        """What is happening before the search exists (starting Ray, checking the model)."""

    def line(self, text: str) -> None:
        """One notable event."""

    def attach(self, search: Search) -> None:
        """From now on, show this search."""

    def close(self) -> None: ...


def waiting(search: Search) -> list[tuple[str, float]]:
    """(what, seconds) for every LLM call and evaluation in flight, oldest first."""
    now = time.monotonic()
    items = [(f"{role} {kind}", now - t0) for role, kind, t0 in search.llm.in_flight.values()]
    items += [(f"evaluator {i}: {name}", now - t0) for i, (name, t0) in sorted(search.evals.pool.in_flight.items())]
    following = getattr(search.evals.pool, "in_flight_next", {})  # a second evaluation beside it (evaluation.overlap)
    items += [(f"evaluator {i}, next: {name}", now - t0) for i, (name, t0) in sorted(following.items())]
    return sorted(items, key=lambda item: -item[1])


def outage_line(search: Search) -> str | None:
    """While the LLM provider is failing: for how long, and how long the run will wait."""
    if search.llm.outage_since is None:
        return None
    lasted = time.monotonic() - search.llm.outage_since
    return (f"the LLM provider has been failing for {lasted:.0f} s (the run waits up to {search.config.llm.outage_s:g} s; "
            "no round is spent on failed calls)")


def render(search: Search) -> Group:
    view, cfg = search.view, search.config
    minutes = max(search.budget.wall_s() / 60.0, 1e-9)
    best = view.best
    head = Table.grid(padding=(0, 2))
    head.add_row(Text(f"{cfg.task}", style="bold"), Text(search.llm.policy_name, style="cyan"), Text(search.evals.hardware, style="dim"))
    session_min = (time.monotonic() - search.started) / 60
    candidates = view.evaluations - search.evaluations_before
    rate = f" ({candidates / session_min:.1f}/min)" if candidates and session_min > 0 else ""
    stats = Table.grid(padding=(0, 3))
    stats.add_row(
        f"rounds {view.rounds_used}/{cfg.budget.rounds}",
        f"evaluations {view.evaluations}{rate}",
        f"best {with_noise(best.speedup, search.evals.noise())} ({best.node}, round {best.round})" if best else "best —",
        f"LLM ${view.llm_cost_usd:.2f}, {view.llm_tokens} tokens, {view.llm_call_count} calls" if cfg.llm.model else "no LLM",
        f"{minutes:.1f} min",
    )
    parts: list[Table | Text] = [head, Text(f"run directory {search.store.root}", style="dim"), stats,
                                 Text(f"now: {search.phase}", style="dim")]
    if (outage := outage_line(search)) is not None:
        parts.append(Text(outage, style="yellow"))
    if search.working_on:
        cycles = Table("cycle", "working on", box=None, show_header=True, header_style="dim")
        for cycle_id, title in sorted(search.working_on.items()):
            cycles.add_row(Text(cycle_id), Text(title))
        parts.append(cycles)
    waits = waiting(search)
    if waits:
        table = Table("waiting for", "since", box=None, show_header=True, header_style="dim")
        for what, age in waits:
            table.add_row(Text(what), f"{age:.0f} s ago")
        parts.append(table)
    return Group(*parts)


class LiveView:
    """A rich live display, redrawn twice a second (so ages tick) until closed."""

    def __init__(self, console: Console | None = None):
        self.console = console or Console(stderr=True)
        self.search: Search | None = None
        self.status = "starting"
        self.live = Live(console=self.console, get_renderable=self._renderable, refresh_per_second=2, transient=False)
        self.live.start()

    def _renderable(self) -> Group | Text:
        if self.search is None:
            return Text(f"{self.status} ...", style="dim")
        return render(self.search)

    def phase(self, text: str) -> None:
        self.status = text

    def line(self, text: str) -> None:
        self.live.console.print(text, highlight=False, markup=False)

    def attach(self, search: Search) -> None:
        self.search = search

    def close(self) -> None:
        self.live.stop()


class PlainLines:
    """One line per event on stderr, and a heartbeat line while something takes long."""

    def __init__(self, stream: TextIO | None = None, heartbeat_s: float = HEARTBEAT_S):
        self.stream = stream or sys.stderr
        self.search: Search | None = None
        self.heartbeat_s = heartbeat_s
        self._stop = threading.Event()
        self._last_print = time.monotonic()
        self._thread = threading.Thread(target=self._beat, name="ksearch-heartbeat", daemon=True)
        self._thread.start()

    def _print(self, text: str) -> None:
        self._last_print = time.monotonic()
        print(f"[{time.strftime('%H:%M:%S')}] {text}", file=self.stream, flush=True)

    def phase(self, text: str) -> None:
        self._print(text)

    def line(self, text: str) -> None:
        self._print(text)

    def attach(self, search: Search) -> None:
        self.search = search

    def _beat(self) -> None:
        while not self._stop.wait(1.0):
            search = self.search
            if search is None or time.monotonic() - self._last_print < self.heartbeat_s:
                continue
            waits = [(what, age) for what, age in waiting(search) if age >= self.heartbeat_s]
            if (outage := outage_line(search)) is not None:
                self._print(outage)
            if waits:
                self._print("waiting for " + "; ".join(f"{what} ({age:.0f} s)" for what, age in waits[:4])
                            + (f" and {len(waits) - 4} more" if len(waits) > 4 else ""))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)


def make_reporter(progress: bool) -> Reporter:
    """A live view on a terminal (unless --no-progress), plain lines in pipes and job logs."""
    if progress and sys.stderr.isatty():
        return LiveView()
    return PlainLines()

