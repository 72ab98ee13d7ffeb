"""The K-Search method: W action cycles in parallel against one shared world model.

Keeps `width` cycles running on the best frontier actions. When the frontier runs low it asks
the planner to expand the node holding the best solution (the root only while nothing better
exists). A planner reply that cannot be used never ends the run: the driver adds an action of its
own, "improve the best solution further", under the best node, and says so; it does the same when
a cycle ends and the best node has no open action left (up to CONTINUATIONS times per node). The
run ends for lack of actions only when the planner, having seen evaluations, answers with an
explicitly empty plan while nothing runs, twice: it is asked once more, told that an empty plan
ends the search.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ksearch_ray.events import CycleEnd, CycleStart, Event
from ksearch_ray.methods.context import RunRecord, SearchContext, WorldModel
from ksearch_ray.methods.cycle import ActionCycle
from ksearch_ray.methods.evidence import workload_times
from ksearch_ray.policies.contract import WorkloadTime
from ksearch_ray.worldmodel.api import ApplyOps, Expire, Renew, SelectAndLease
from ksearch_ray.worldmodel.ops import InsertContinuationOp
from ksearch_ray.worldmodel.select import difficulty_limit, frontier
from ksearch_ray.worldmodel.tree import ROOT_ID, NodeStatus, best_solution

NO_MORE_ACTIONS = "the planner returned an empty plan after seeing {n} evaluations: it has no more actions to propose"
CONTINUATIONS = 3
"""System continuations one node may get before only the planner can extend it."""


class KSearch:
    name = "ksearch"

    def __init__(self) -> None:
        self._starting: set[str] = set()  # cycle ids handed out whose lease is not taken yet

    def observe(self, event: Event) -> None:
        """Nothing of its own to rebuild: the cycles live in the run's read model."""

    async def run(self, s: SearchContext) -> str:
        if not s.world.tree().nodes:
            s.run.set_phase("asking the planner for the first actions")
            request = s.llm.plan_request("initialize_tree", node_id=ROOT_ID, seed_times=self._seed_times(s))
            reply, _ = await s.llm.plan(request)
            if not self._frontier(s.world):
                await self._continue_from_best(s, reply.error or "the first plan held no action that could start")
        running: dict[asyncio.Task[None], str] = {}
        ks = s.run.config.search.ksearch
        for record in s.run.view.open_cycles:  # cycles a killed driver left half-done
            settled = bool(record.steps & {"attached", "marked", "released"})  # its lease ended with that step
            held = s.world.tree().leases.get(record.node_id)
            if not settled and (held is None or held.holder != record.cycle_id):
                s.run.record(CycleEnd(cycle=record.cycle_id, node=record.node_id, passed=False,
                                  attempts=len(record.attempts), abandoned="its lease was gone"))
                continue
            # The session that held it is gone: renew before it can expire under it (nothing lost: renewed).
            lost = [] if settled else await s.world.wm(Renew(ids=[record.node_id], holder=record.cycle_id, now=s.run.now(),
                                                       ttl=ks.lease_ttl_s))
            if lost:
                s.run.record(CycleEnd(cycle=record.cycle_id, node=record.node_id, passed=False,
                                  attempts=len(record.attempts), abandoned="its lease was gone"))
                continue
            running[asyncio.create_task(ActionCycle(s, record, lambda: self._lanes(s.run, running)).run())] = record.cycle_id
        s.run.set_phase("searching")
        planning: asyncio.Task[str | None] | None = None  # a request for more actions, while cycles run
        while True:
            await self._expire_leases(s)
            if s.run.budget_left() and not running:
                break
            free = s.run.config.search.width - len(running)
            if free > 0 and not s.run.budget_left():
                self._start(s, free, running)
                if not running:
                    # Nothing runs and nothing can start: the planner must say what to do next.
                    ended = await self._replenish(s, idle=True)
                    if ended:
                        return ended
                    if not self._start(s, free, running):
                        return "no action could start (every open action is leased or blocked)"
            if not running:
                break
            waiting: set[asyncio.Task[Any]] = {*running, *([planning] if planning else [])}
            done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task is planning:
                    planning = None
                    task.result()  # (an end it proposes counts only while nothing runs: asked again below then)
                    continue
                running.pop(task)
                task.result()  # a bug in a cycle stops the run loudly
            if not s.run.budget_left():
                await self._keep_best_open(s)
            if len(self._frontier(s.world)) < s.run.config.search.width - len(running) and not s.run.budget_left():
                if not running:
                    if planning is not None:
                        await planning
                        planning = None
                    ended = await self._replenish(s, idle=True)
                    if ended:
                        return ended
                elif planning is None:
                    # More actions are asked for beside the running cycles, never instead of them: a planner call
                    # takes as long as a coder's, and the loop must go on starting cycles meanwhile.
                    planning = asyncio.create_task(self._replenish(s, want=s.run.config.search.width - len(running)))
        if planning is not None:
            await planning
        return s.run.budget_left() or "done"

    def _lanes(self, run: RunRecord, running: dict[asyncio.Task[None], str]) -> int:
        """Attempts one cycle may have in flight: the width shared among the cycles running (1 when there are as
        many as the width: K-Search's sequential cycle), at most `max_parallel_attempts`."""
        ks = run.config.search.ksearch
        share = -(-run.config.search.width // max(1, len(running)))
        return max(1, min(share, ks.max_parallel_attempts or share))

    # --- starting cycles ---------------------------------------------------------------------------

    def _frontier(self, world: WorldModel) -> list[str]:
        return [n.id for n in frontier(world.tree())]

    def _start(self, s: SearchContext, free: int, running: dict[asyncio.Task[None], str]) -> int:
        """Start up to `free` cycles, one per frontier action (each leases its own, in turn)."""
        count = min(free, len(self._frontier(s.world)))
        for _ in range(count):
            cycle_id = f"c{len(s.run.view.cycles) + len(self._starting) + 1}"
            self._starting.add(cycle_id)
            running[asyncio.create_task(self._lease_and_run(s, cycle_id, running))] = cycle_id
        return count

    async def _lease_and_run(self, s: SearchContext, cycle_id: str, running: dict[asyncio.Task[None], str]) -> None:
        ks = s.run.config.search.ksearch
        try:
            ids = await s.world.wm(SelectAndLease(
                k=1, holder=cycle_id, now=s.run.now(), ttl=ks.lease_ttl_s,
                max_difficulty=ks.max_difficulty, relax_at=ks.relax_difficulty_at_speedup,
            ))
            if not ids:
                return
            s.run.record(CycleStart(cycle=cycle_id, node=ids[0]))
        finally:
            self._starting.discard(cycle_id)
        node = s.world.tree().nodes[ids[0]]
        limit = difficulty_limit(s.world.tree(), max_difficulty=ks.max_difficulty,
                                 relax_when_speedup_at_least=ks.relax_difficulty_at_speedup)
        if node.difficulty > limit:
            s.run.say(f"every open action is above the difficulty limit {limit}: taking {node.id} (difficulty {node.difficulty})")
        await ActionCycle(s, s.run.view.cycles[cycle_id], lambda: self._lanes(s.run, running)).run()

    async def _expire_leases(self, s: SearchContext) -> None:
        now = s.run.now()
        if any(lease.expires_at <= now for lease in s.world.tree().leases.values()):
            expired = await s.world.wm(Expire(now=now))
            s.run.say(f"leases expired (their cycles stopped reporting): {', '.join(expired)}")

    # --- more actions --------------------------------------------------------------------------------

    async def _replenish(self, s: SearchContext, *, idle: bool = False, want: int = 0) -> str | None:
        """Ask the planner to expand the best node; returns why the run ends, if it must. An empty plan
        while nothing runs (`idle`) would end the run: the planner is asked once more, told so. `want`: the
        cycle slots the frontier leaves idle: asked for, beyond K-Search's few a batch, up to `max_proposals`."""
        best = best_solution(s.world.tree())
        focus = best.id if best is not None else ROOT_ID
        ks = s.run.config.search.ksearch
        wanted = max(ks.max_new_actions, min(want - len(self._frontier(s.world)), ks.max_proposals))
        reply, _ = await s.llm.plan(s.llm.plan_request("propose_actions", node_id=focus, max_actions=wanted))
        if self._frontier(s.world):
            return None
        if not reply.error and not reply.ops and s.run.view.evaluations > 0 and idle and not s.run.budget_left():
            s.run.say("the planner proposed nothing while nothing runs: asking it once more before the search ends")
            reply, _ = await s.llm.plan(s.llm.plan_request("propose_actions", node_id=focus, empty_before=True))
            if self._frontier(s.world):
                return None
        if not reply.error and not reply.ops and s.run.view.evaluations > 0:
            return NO_MORE_ACTIONS.format(n=s.run.view.evaluations)
        await self._continue_from_best(s, reply.error or "the planner's actions could not be used")
        return None

    async def _keep_best_open(self, s: SearchContext) -> None:
        """The node holding the best solution always has an open continuation: when the planner left it
        none, the system adds "improve the best solution further" (at most CONTINUATIONS times per node,
        so a planner that has nothing more to say can still end the search)."""
        tree = s.world.tree()
        best = best_solution(tree)
        anchor = best.id if best is not None else ROOT_ID
        children = tree.children(anchor)
        if any(c.status in (NodeStatus.OPEN, NodeStatus.LEASED) for c in children):
            return
        if sum(c.author == "system" for c in children) >= CONTINUATIONS:
            return
        await s.world.wm(ApplyOps(ops=[InsertContinuationOp(
            op="insert_continuation", parent=anchor, reason="the best solution had no open action left to build on it")]))
        s.run.say(f"the best solution ({anchor}) had no open action: added one to improve it further")

    async def _continue_from_best(self, s: SearchContext, why: str) -> None:
        best = best_solution(s.world.tree())
        parent = best.id if best is not None else ROOT_ID
        await s.world.wm(ApplyOps(ops=[InsertContinuationOp(op="insert_continuation", parent=parent, reason=why[:300])]))
        s.run.say(f"no usable action from the planner ({why[:160]}); the coder will improve the best solution ({parent}) instead")

    def _seed_times(self, s: SearchContext) -> list[WorkloadTime]:
        seed = s.run.view.seed
        result = s.run.view.results.get(seed.solution_id) if seed and seed.solution_id else None
        return workload_times(result, None, s.evals.baseline_for(None))
