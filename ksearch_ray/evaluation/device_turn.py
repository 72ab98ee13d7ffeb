"""One evaluation's turn on its evaluator's device, where evaluations overlap (`evaluation.overlap`).

A turn begins once the worker is ready, before any of the candidate's code runs, and ends once what must
have the device to itself is done: an evaluation's timed calls, a profile's profiled process. The lock is
the evaluator's (re-entrant: a re-timing holds it throughout, its evaluations take it again); None: no
overlap, and a turn is always there for the taking.
"""

from __future__ import annotations

import threading

__all__ = ["DeviceTurn"]


class DeviceTurn:
    """One evaluation's turn on its evaluator's device, where evaluations overlap (a lock; None: they do not)."""

    def __init__(self, lock: threading.RLock | None):
        self.lock = lock
        self.held = False

    def take(self, blocking: bool = True) -> bool:
        if self.lock is None or self.held:
            return True
        self.held = self.lock.acquire(blocking=blocking)
        return self.held

    def give_back(self) -> None:
        if self.held and self.lock is not None:
            self.held = False
            self.lock.release()
