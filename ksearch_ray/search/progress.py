"""The live progress view of a search (rich). It only reads the driver's state."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from ksearch_ray.worldmodel.render import format_speedup

if TYPE_CHECKING:
    from ksearch_ray.search.driver import Search


def render(search: Search) -> Group:
    st, cfg = search.state, search.config
    minutes = max(search.wall_s() / 60.0, 1e-9)
    best = st.best
    head = Table.grid(padding=(0, 2))
    head.add_row(Text(f"{cfg.task}", style="bold"), Text(search.policy_name, style="cyan"), Text(search.hardware, style="dim"))
    stats = Table.grid(padding=(0, 3))
    stats.add_row(
        f"rounds {st.rounds_used}/{cfg.rounds}",
        f"evaluations {st.evaluations} ({search.pool.done / max((time.monotonic() - search.started) / 60, 1e-9):.1f}/min)",
        f"best {format_speedup(best['speedup'])} ({best['node']}, round {best['round']})" if best else "best —",
        f"LLM ${st.llm_cost_usd:.2f}, {st.llm_tokens} tokens, {st.llm_calls} calls" if cfg.model else "no LLM",
        f"{minutes:.1f} min",
    )
    cycles = Table("cycle", "action", box=None, show_header=True, header_style="dim")
    for cycle_id, title in sorted(search.in_flight.items()):
        cycles.add_row(cycle_id, title)
    return Group(head, stats, cycles)


class ProgressView:
    def __init__(self, console: Console | None = None, min_interval_s: float = 0.5):
        self.live = Live(console=console or Console(stderr=True), auto_refresh=False, transient=False)
        self.min_interval_s = min_interval_s
        self._last = 0.0

    def __enter__(self) -> ProgressView:
        self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.live.__exit__(None, None, None)

    def update(self, search: Search) -> None:
        now = time.monotonic()
        if now - self._last >= self.min_interval_s or search.state.finished:
            self._last = now
            self.live.update(render(search), refresh=True)
