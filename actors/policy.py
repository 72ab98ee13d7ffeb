"""PolicyActor: a planner or a coder. Async, bounded concurrency; the policy does the work."""

from __future__ import annotations

from pathlib import Path

import ray

from ksearch_ray.search.policy import CodeReply, CodeRequest, PlanReply, PlanRequest, Policy


@ray.remote(num_cpus=0)
class PolicyActor:
    def __init__(self, role: str, llm_config_json: str | None, cache_dir: str | None, prompts_dir: str | None):
        self.role = role
        self.policy: Policy
        if llm_config_json is None:
            from ksearch_ray.offline.policy import OfflinePolicy

            self.policy = OfflinePolicy()
        else:
            # litellm's Router/client is built here, inside the actor: it is not picklable.
            from ksearch_ray.llm.client import LLMConfig
            from ksearch_ray.llm.policy import LLMPolicy

            self.policy = LLMPolicy(
                LLMConfig.model_validate_json(llm_config_json),
                cache_dir=Path(cache_dir) if cache_dir else None,
                prompts_dir=Path(prompts_dir) if prompts_dir else None,
            )

    def name(self) -> str:
        return self.policy.name

    async def plan(self, request: PlanRequest) -> PlanReply:
        return await self.policy.plan(request)

    async def code(self, request: CodeRequest) -> CodeReply:
        return await self.policy.code(request)
