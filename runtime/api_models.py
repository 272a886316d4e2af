"""Request bodies of the HTTP API, validated strictly so bad input is a clear 422, never a 500.

Field names follow the LangGraph server API as `langgraph_sdk` sends them; fields the SDK may
send that Evolve does not act on are accepted and ignored (`extra="ignore"`) so newer clients
keep working, while every field Evolve does use is type-checked.
"""
from __future__ import annotations

import re
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

_FILTER_KEY = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
MAX_MESSAGES = 64
MAX_TEXT = 20_000
ROLES = {"user": "human", "human": "human", "system": "system", "assistant": "ai", "ai": "ai"}
# configurable keys a client may set; the server sets thread_id, tenant, run_id, assistant_id
CLIENT_CONFIG_KEYS = {"world", "task", "task_seed", "rule_version", "split", "persona", "max_steps",
                      "scaffold", "seed", "temperature", "max_turns", "approval"}


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


def _uuid(v: str, what: str) -> str:
    try:
        return str(uuid.UUID(v))
    except (ValueError, AttributeError, TypeError):
        raise ValueError(f"{what} must be a UUID") from None


class ThreadCreate(_Body):
    thread_id: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    if_exists: Literal["raise", "do_nothing"] = "raise"

    @field_validator("thread_id")
    @classmethod
    def _tid(cls, v: str | None) -> str | None:
        return None if v is None else _uuid(v, "thread_id")


class ThreadPatch(_Body):
    metadata: dict[str, Any] = Field(default_factory=dict)


class ThreadSearch(_Body):
    metadata: dict[str, Any] | None = None
    status: Literal["idle", "busy", "interrupted", "error"] | None = None
    limit: int = Field(10, ge=1, le=1000)
    offset: int = Field(0, ge=0, le=1_000_000)


class HistoryRequest(_Body):
    limit: int = Field(10, ge=1, le=1000)
    before: dict[str, Any] | str | None = None
    metadata: dict[str, str | int | float | bool | None] | None = None

    @field_validator("metadata")
    @classmethod
    def _keys(cls, v: dict | None) -> dict | None:
        for k in v or {}:
            if not _FILTER_KEY.match(k):
                raise ValueError(f"metadata filter key {k[:40]!r} must match {_FILTER_KEY.pattern}")
        return v


class AssistantSearch(_Body):
    metadata: dict[str, Any] | None = None
    graph_id: str | None = None
    name: str | None = None
    limit: int = Field(10, ge=1, le=1000)
    offset: int = Field(0, ge=0, le=1_000_000)


class Message(_Body):
    role: str | None = None
    type: str | None = None
    content: str = Field(max_length=MAX_TEXT)

    @model_validator(mode="after")
    def _role(self) -> "Message":
        role = self.role or self.type
        if role not in ROLES:
            raise ValueError(f"message role must be one of {sorted(ROLES)}, got {role!r}")
        return self


class RunInput(BaseModel):
    model_config = ConfigDict(extra="forbid")  # the rest of the graph state is the server's
    messages: list[Message] = Field(default_factory=list, max_length=MAX_MESSAGES)


class RunCommand(BaseModel):
    model_config = ConfigDict(extra="forbid")
    resume: Any = None
    update: Any = None
    goto: Any = None

    @model_validator(mode="after")
    def _only_resume(self) -> "RunCommand":
        if self.update is not None or self.goto:
            raise ValueError("only command.resume is supported (update and goto would bypass approvals)")
        return self


class RunConfig(_Body):
    configurable: dict[str, Any] = Field(default_factory=dict)
    recursion_limit: int | None = Field(None, ge=1, le=1000)
    tags: list[str] | None = None


StreamModeName = Literal["values", "updates", "custom", "debug", "tasks", "checkpoints", "messages",
                         "messages-tuple"]


class RunCreate(_Body):
    assistant_id: str = Field(min_length=1, max_length=200)
    input: RunInput | None = None
    command: RunCommand | None = None
    config: RunConfig | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    stream_mode: StreamModeName | list[StreamModeName] = "values"
    multitask_strategy: Literal["reject", "interrupt", "rollback", "enqueue"] = "reject"
    if_not_exists: Literal["reject", "create"] = "reject"
    on_disconnect: Literal["cancel", "continue"] = "continue"
    interrupt_before: Literal["*"] | list[str] | None = None
    interrupt_after: Literal["*"] | list[str] | None = None

    @model_validator(mode="after")
    def _check(self) -> "RunCreate":
        if self.input is not None and self.command is not None:
            raise ValueError("send either input or command, not both")
        if self.interrupt_before or self.interrupt_after:
            raise ValueError("interrupt_before/interrupt_after are not supported: writes pause for approval")
        bad = set((self.config.configurable if self.config else {})) - CLIENT_CONFIG_KEYS
        if bad:
            raise ValueError(f"config.configurable keys not allowed: {sorted(bad)}; "
                             f"allowed: {sorted(CLIENT_CONFIG_KEYS)}")
        return self

    def modes(self) -> list[str]:
        return [self.stream_mode] if isinstance(self.stream_mode, str) else list(dict.fromkeys(self.stream_mode))

    def graph_input(self) -> dict[str, Any] | None:
        if self.input is None:
            return None
        return {"messages": [{"role": ROLES[m.role or m.type], "content": m.content}  # type: ignore[index]
                             for m in self.input.messages]}


class FeedbackIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Literal["approve", "reject", "edit", "respond", "takeover"]
    step: int | None = Field(None, ge=0)
    payload: dict[str, Any] = Field(default_factory=dict)


class MemorySearch(BaseModel):
    model_config = ConfigDict(extra="forbid")
    query: str = Field(min_length=1, max_length=2000)
    k: int = Field(5, ge=1, le=100)
    kinds: list[str] | None = None


class MemoryRollback(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: int | None = Field(None, ge=0)
    at: float | None = None
    tenant: str | None = None
    reason: str = ""

    @model_validator(mode="after")
    def _one(self) -> "MemoryRollback":
        if (self.version is None) == (self.at is None):
            raise ValueError("give exactly one of version or at")
        return self


class MemoryRetract(BaseModel):
    model_config = ConfigDict(extra="forbid")
    trajectory_id: str | None = None
    cycle: str | None = None
    reason: str = ""

    @model_validator(mode="after")
    def _one(self) -> "MemoryRetract":
        if (self.trajectory_id is None) == (self.cycle is None):
            raise ValueError("give exactly one of trajectory_id or cycle")
        return self


class MemoryForget(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tenant: str = Field(min_length=1, max_length=64)


class PolicyRollback(BaseModel):
    model_config = ConfigDict(extra="forbid")
    to: str | None = None
    reason: str = ""


class PolicyPromote(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str = ""
