"""PolicyActor: a planner or a coder. Async, bounded concurrency; the policy does the work."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import ray
from ksearch_ray.actors.limiter import RayLimiter

from ksearch_ray.config import LLMConfig
from ksearch_ray.policies import make_policy
from ksearch_ray.policies.contract import CodeReply, CodeRequest, PlanReply, PlanRequest


@ray.remote(num_cpus=0)
class PolicyActor:
    def __init__(self, role: str, llm_config_json: str, cache_dir: str | None, prompts_dir: str | None,
                 limiter: Any = None):
        """`limiter`: the endpoint's LimiterActor (`actors.limiter`), shared by every planner and coder."""
        self.role = role
        if cache_dir:  # the actor's own log lines (retries, provider errors) go to the run directory, not the terminal
            handler = logging.FileHandler(Path(cache_dir).parent / f"{role}.log")
            handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
            logging.getLogger("ksearch_ray").addHandler(handler)
        # litellm's client is built here, inside the actor: it is not picklable.
        self.policy = make_policy(LLMConfig.model_validate_json(llm_config_json),
                                  cache_dir=Path(cache_dir) if cache_dir else None,
                                  prompts_dir=Path(prompts_dir) if prompts_dir else None,
                                  limiter=RayLimiter(limiter) if limiter is not None else None)

    def name(self) -> str:
        return self.policy.name

    async def plan(self, request: PlanRequest) -> PlanReply:
        return await self.policy.plan(request)

    async def code(self, request: CodeRequest) -> CodeReply:
        return await self.policy.code(request)
