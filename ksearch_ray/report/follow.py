"""`ksearch show --follow`: watch a run from its event log as it grows.

It reads the run directory only (tailing events.jsonl by polling), so it works from another
terminal, over SSH, or on the head node while a `ray job submit` run writes there. In a
terminal it redraws a live view; anywhere else it prints one plain line per evaluation, best
and end, like a log. It stops when the run ends (a `run_end` after the last `resume`) or its session stops early
(a `stopped` event: an error or Ctrl-C in the driver; `ksearch resume` continues it).
"""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console
from rich.live import Live

from ksearch_ray.events import Event, EventError, RunView, parse_event
from ksearch_ray.report.console import event_line, live_view, say
from ksearch_ray.report.run_tables import Run
from ksearch_ray.store import RunDirError, RunStore, read_manifest

POLL_S = 0.5
REDRAW_S = 1.0


class EventTail:
    """New complete lines of an append-only JSON-lines file, each time it is asked."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0
        self.partial = b""  # a line still being written: no newline yet
        self.lines_read = 0

    def read_new(self) -> list[Event]:
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return []
        if size < self.offset:
            # A resume drops a line cut short by a kill: the file shrinks back to its last whole line.
            self.offset -= len(self.partial)
            self.partial = b""
            if size < self.offset:
                raise RunDirError(f"{self.path} shrank below what was already read: it was replaced, not appended to")
        if size == self.offset:
            return []
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read(size - self.offset)
        self.offset += len(data)
        *lines, self.partial = (self.partial + data).split(b"\n")
        events = []
        for line in lines:
            self.lines_read += 1
            try:
                events.append(parse_event(line))
            except (EventError, ValueError) as exc:
                raise RunDirError(f"{self.path}: line {self.lines_read} is not an event of this version ({exc})") from None
        return events


def follow(run_dir: Path, console: Console, *, poll_s: float = POLL_S) -> None:
    """Until the run ends; Ctrl-C (KeyboardInterrupt) is the caller's to report."""
    root = Path(run_dir)
    manifest = read_manifest(root)
    RunStore(root).check_schema()
    tail = EventTail(root / "events.jsonl")
    store = RunStore(root)
    run = Run(root, manifest, RunView(solution_exists=store.has_solution)).extend(tail.read_new())
    if console.is_terminal:
        _follow_live(run, tail, console, poll_s)
    else:
        _follow_lines(run, tail, console, poll_s)


def _follow_live(run: Run, tail: EventTail, console: Console, poll_s: float) -> None:
    with Live(live_view(run), console=console, auto_refresh=False, transient=False) as live:
        drawn = time.monotonic()
        while not run.over:
            time.sleep(poll_s)
            new = tail.read_new()
            if new:
                run = run.extend(new)
            if new or time.monotonic() - drawn >= REDRAW_S:  # the age of the last event keeps ticking
                live.update(live_view(run), refresh=True)
                drawn = time.monotonic()


def _follow_lines(run: Run, tail: EventTail, console: Console, poll_s: float) -> None:
    for line in _header(run):
        say(console, line)
    _print_events(run, run.events, console)
    while not run.over:
        time.sleep(poll_s)
        new = tail.read_new()
        if new:
            run = run.extend(new)
            _print_events(run, new, console)


def _header(run: Run) -> list[str]:
    cfg = run.config
    return [f"following {run.root} · {run.run_id} · task {cfg.get('task')} · method {run.method} · {run.policy}"]


def _print_events(run: Run, events: list[Event], console: Console) -> None:
    elapsed = {row.seq: row.active_s for row in run.view.timeline}
    for ev in events:
        line = event_line(ev, elapsed.get(ev.seq, 0.0))
        if line is not None:
            say(console, line)
