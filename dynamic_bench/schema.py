"""The shared data model (../shared/DESIGN.md): what every package passes around.

Token in, token out: a `Step` keeps the exact token ids that were sampled and the
behaviour logprobs recorded at sampling time; training uses these, never re-tokenized text.
"""
from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, Field

FeedbackKind = Literal["approve", "reject", "edit", "respond", "takeover"]
CORRECTION_KINDS: tuple[str, ...] = ("edit", "takeover")  # feedback that carries the action the user wanted instead
FeedbackSource = Literal["user", "simulator", "verifier"]


def new_id(prefix: str) -> str:
    """A readable unique id such as `traj-1f2e3d4c5b6a`."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


class Task(BaseModel):
    """One DriftBench episode's task. `rule_version` is hidden from the agent."""

    id: str
    domain: str
    instruction: str
    persona: str
    user_id: str
    rule_version: int
    split: Literal["train", "test"] = "train"
    params: dict[str, Any] = Field(default_factory=dict)
    gold_checks: dict[str, Any] = Field(default_factory=dict)


class Feedback(BaseModel):
    """A user's (or simulator's, or verifier's) answer to a proposed action."""

    trajectory_id: str
    step: int | None = None
    kind: FeedbackKind
    payload: dict[str, Any] = Field(default_factory=dict)
    source: FeedbackSource = "user"
    created_at: float = Field(default_factory=time.time)


class Step(BaseModel):
    """One agent turn: the sampled ids and their behaviour logprobs, then what happened."""

    index: int
    prompt_token_ids: list[int] = Field(default_factory=list)
    completion_token_ids: list[int] = Field(default_factory=list)
    behaviour_logprobs: list[float] = Field(default_factory=list)
    policy_version: str = "none"
    action_text: str = ""
    action: dict[str, Any] | None = None  # parsed tool call or reply; None when unparsable
    observation: str = ""
    latency_s: float = 0.0


class Trajectory(BaseModel):
    """A whole episode, as recorded by the runtime or a rollout worker."""

    id: str = Field(default_factory=lambda: new_id("traj"))
    task_id: str
    tenant: str = "default"
    scaffold: str = "direct"
    policy_version: str = "none"
    rule_version: int = 1
    steps: list[Step] = Field(default_factory=list)
    reward: float = 0.0
    reward_breakdown: dict[str, float] = Field(default_factory=dict)
    outcome: Literal["success", "failure", "aborted", "running"] = "running"
    feedback: list[Feedback] = Field(default_factory=list)
    started_at: float = Field(default_factory=time.time)
    ended_at: float | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
