"""The stand-in's habits: how it drifts from the formats as a model, and how it fails as a provider.

Rates are percentages of calls, drawn from the prompt's hash and the stand-in's seed (the same prompt
gets the same treatment). Times are seconds on the server's clock. Everything here is a setting of
`ksearch standin --habits FILE` (YAML or JSON with these keys).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class Habits(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # --- as a model: the replies ----------------------------------------------------------------------
    other_shape: int = Field(default=20, ge=0, le=100, description="Plans in another JSON shape (actions, parent_id).")
    prose_only: int = Field(default=8, ge=0, le=100, description="Plans in prose without JSON.")
    broken_json: int = Field(default=6, ge=0, le=100, description="Plans whose JSON block does not parse.")
    missing_fields: int = Field(default=15, ge=0, le=100, description="Inserts that leave out their estimates.")
    plan_shapes: list[Literal["plain", "prose_only", "broken_json", "other_shape"]] = Field(
        default_factory=list,
        description="A fixed sequence of shapes for successive free-text plans (first asks, not re-asks), cycled, "
        "in place of the percentages above: a demo or test that must meet each habit meets it.")
    coder_prose_only: int = Field(default=6, ge=0, le=100, description="Coder replies with no code.")
    code_drift: int = Field(default=15, ge=0, le=100,
                            description="Coder replies whose code comes untagged, in ~~~ fences or beside a usage snippet.")
    broken_code: int = Field(default=10, ge=0, le=100,
                             description="First drafts that are broken (a syntax error, a misspelt name, a wrong result): "
                             "debugged from the error text the next prompt shows.")
    breakage_actions: int = Field(default=2, ge=0, description="Bold actions per initial plan, whose first draft is broken.")
    breakages: list[str] = Field(default=["syntax", "name", "scale"],
                                 description="How drafts break: syntax, name, scale (a wrong result), all of which it "
                                 "debugs from the error text; crash and hang, which it cannot.")
    risky_changes: int = Field(default=10, ge=0, le=100,
                               description="Changes of its own choosing (no planned action) that are broken drafts.")
    distinct_code: bool = Field(default=False, description="Every reply's code opens with a comment of its own (a "
                                "draft number), so no two replies are the same file, as a model sampling at a "
                                "temperature seldom writes one twice: simulations of a width beyond a task's "
                                "tunable space (the toy task has about a hundred kernels) need it.")

    # --- as a provider: the calls ---------------------------------------------------------------------
    latency_s: tuple[float, float] = Field(default=(0.0, 0.0), description="Seconds a reply takes, uniform in [low, high].")
    stream_chunk_s: float = Field(default=0.0, ge=0, description="Pause between streamed chunks.")
    rate_limit_every: int = Field(default=9, ge=0, description="About one new prompt in N first gets a 429 (0: never).")
    retry_after_s: float = Field(default=0.0, ge=0, description="The Retry-After of a 429.")
    requests_per_min: int | None = Field(default=None, ge=1, description="Requests admitted per window (a sliding "
                                         "`limit_window_s`); past it a 429 whose Retry-After says when a slot frees.")
    tokens_per_min: int | None = Field(default=None, ge=1, description="Tokens admitted per window: the prompt's "
                                       "(4 characters a token) and the request's max_tokens, counted on arrival as "
                                       "providers count them; past it a 429 likewise.")
    limit_window_s: float = Field(default=60.0, gt=0, description="The window of those limits (a minute; shorter in "
                                  "time-scaled simulations).")
    outages: list[tuple[float, float]] = Field(default_factory=list,
                                               description="(start, end) seconds after the first chat request: every "
                                               "call gets a 503 in between.")
    refuse_temperature: bool = Field(default=False, description="A 400 for any request that sets temperature (as "
                                     "reasoning models do).")
    content_policy: int = Field(default=0, ge=0, le=100, description="Prompts refused with a content-policy 400.")
    context_tokens: int | None = Field(default=None, ge=1, description="Context window: longer prompts get a 400 "
                                       "(3 characters a token); /v1/models says it, as vLLM does.")
    reasoning: int = Field(default=0, ge=0, le=100, description="Replies with content null and the answer in "
                           "reasoning_content.")
    tool_calls: int = Field(default=0, ge=0, le=100, description="Replies given only as a tool call's arguments.")
    truncate: int = Field(default=0, ge=0, le=100, description="Replies cut at 60% with finish_reason length (the "
                          "rest comes when asked to continue).")
    quota_after: int | None = Field(default=None, ge=0, description="After this many chat calls, every call gets a 429 "
                                    "insufficient_quota.")
