"""The offline policy: an honest tunable-search optimizer that plays planner and coder without an LLM.

It searches the space that seed kernels declare (`NAME = VALUE  # tunable: [choices]`, see
`tunables`) through the same world model and action cycles as the LLM policy:

* An action is one step in that space, written into its description as machine-readable lines
  that the coder parses back: `tunables: {"BLOCK_M": 128}` (JSON) and/or `seed: <name>` (start
  from that seed's source instead of the parent's solution). The title says it in words.
* A *config* is (seed name, tunable values). A solution's config is read from its sources; its
  seed is the seed whose source, with the same values written in, is identical to it (so the
  root's seed and every offline-written solution are recognized exactly), else the `seed:` line
  of its description, else the first seed declaring the same tunables and choices. A solution
  that matches no seed has no config: the policy does not expand it.
* A node's config is its attached solution's when that solution is known, else its *intended*
  config: the parent's config with the action's change applied.
* The learned model fits, for every change key (`BLOCK_M=128`, `seed=other`), a regularized mean
  of log(speedup over the nearest measured ancestor), the log-ratio shared equally among the
  changes of one observation, failures counting as a fixed penalty, and each measured step also
  counting, negated, for the step that would undo it. A candidate's predicted gain is the sum over
  its changes; an unobserved change gets the neutral prior (1.02x).
* Scores rank by predicted *absolute* speedup against the best known, so the frontier is a
  best-first search over configs: an unmeasured step from the best node scores 0.5.
* Written code sets every tunable in one canonical form (`rewrite_tunables` with the whole
  config), so one config always has one source text and one content hash. The solution's
  description repeats the config as `seed:` / `tunables:` lines, for people and as a fallback.

Stateless by design: every call rebuilds what it knows from the request (tree, solutions,
attempts, seeds), so a resumed run gets the same replies; nothing here is random.
"""

from __future__ import annotations

from ksearch_ray.policies.contract import CodeReply, CodeRequest, PlanReply, PlanRequest
from ksearch_ray.policies.offline.coding import _cycle_space, _debug, _evolve, _generate, _improve
from ksearch_ray.policies.offline.planning import _plan_ops

POLICY_NAME = "offline policy (tunable search, no LLM)"


class OfflinePolicy:
    """Planner and coder without an LLM; see the module docstring. Holds no state between calls."""

    name = POLICY_NAME

    async def plan(self, request: PlanRequest) -> PlanReply:
        ops, error = _plan_ops(request)
        return PlanReply(ops=ops, error=error)

    async def code(self, request: CodeRequest) -> CodeReply:
        space = _cycle_space(request)
        if request.kind in ("generate_from_spec", "generate_from_base"):
            return _generate(space, request)
        if request.kind == "debug":
            return _debug(space, request)
        if request.kind == "improve":
            return _improve(space, request)
        if request.kind == "evolve":
            return _evolve(space, request)
        raise ValueError(f"unknown code kind {request.kind!r}")
