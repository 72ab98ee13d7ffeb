"""Who plans the world model and writes the code: the contract (`contract`) and its implementations.

`llm` (any model through litellm), `offline` (no model: a search of the tunables seed kernels
declare) and `standin` (an OpenAI-compatible stand-in server for tests and demos, which the `llm`
policy talks to like any other server).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ksearch_ray.config import LLMConfig
    from ksearch_ray.policies.contract import Policy
    from ksearch_ray.policies.llm.ratelimit import Limiter


def make_policy(llm: LLMConfig, cache_dir: Path | None = None, prompts_dir: Path | None = None,
                limiter: Limiter | None = None) -> Policy:
    """The LLM policy when a model is configured, else the offline policy. litellm is imported here,
    inside whatever process calls (a Ray actor builds its own: litellm's clients are not picklable)."""
    if llm.model is None:
        from ksearch_ray.policies.offline.offline_policy import OfflinePolicy

        return OfflinePolicy()
    from ksearch_ray.policies.llm.llm_policy import LLMPolicy

    return LLMPolicy(llm, cache_dir=cache_dir, prompts_dir=prompts_dir, limiter=limiter)


def reads_every_plan_solution(llm: LLMConfig) -> bool:
    """Whether the policy `make_policy` builds reads the code of every attached solution when it plans: the offline
    policy does (each node's configuration); the LLM planner reads only what its prompt shows
    (`contract.shown_plan_code`), so its requests stay small however large the tree grows."""
    return llm.model is None
