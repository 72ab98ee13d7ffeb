"""The world model, mirrored: every change is one typed command (`worldmodel.api`), applied on the backend
(the authority: the WorldModelActor on Ray), applied again to a replica in this process and recorded. The
read model applies the same command with the same pure functions, so reading the tree never crosses a process
boundary and a resumed run rebuilds the exact tree by replay.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from ksearch_ray.events import Event, RunView, WmCall
from ksearch_ray.run.backends import WorldModelBackend
from ksearch_ray.run.errors import SearchError
from ksearch_ray.worldmodel.api import Command, R, logged
from ksearch_ray.worldmodel.state import WorldModelState
from ksearch_ray.worldmodel.tree import Tree


class WorldModelMirror:
    def __init__(self, view: RunView, record: Callable[[Event], Event]):
        self.view = view
        self.record = record
        self.backend: WorldModelBackend | None = None
        self.replica: WorldModelState | None = None
        self.wm_s = 0.0  # time spent on world-model calls (backend and replica)
        self._lock = asyncio.Lock()  # one call at a time: the backend, the replica and the log agree on order

    def start(self, backend: WorldModelBackend, replica: WorldModelState) -> None:
        self.replica = replica
        self.backend = backend

    async def wm(self, command: Command[R], *, tag: dict[str, Any] | None = None) -> R:
        async with self._lock:
            t0 = time.monotonic()
            assert self.backend is not None and self.replica is not None
            result = await self.backend.run(command)
            mirrored = self.replica.run(command)
            if mirrored != result:  # both applied the same pure function to the same tree
                raise SearchError(f"the world-model replica disagrees with its actor after {command.call}; "
                                  "the run log is the truth")
            self.wm_s += time.monotonic() - t0
            self.record(WmCall(command=logged(command), **(tag or {})))
            return result

    def tree(self) -> Tree:
        assert self.view.tree is not None
        return self.view.tree

    def release(self) -> None:
        if self.backend is not None:
            self.backend.release()
