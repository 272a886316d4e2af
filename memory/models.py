"""Memory data model: what the ledger stores and what `MemoryService` returns.

A `MemoryItem` is the full snapshot of one long-term item; every ledger event carries the
snapshot *after* the event, so any past state is one lookup away (rollback, history).
"""
from __future__ import annotations

import time
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, Field

from dynamic_bench.schema import Trajectory, new_id

Kind = Literal["task_experience", "user_preference", "tool_knowledge", "strategy"]
Status = Literal["candidate", "validated", "superseded", "retracted", "retired"]
Tier = Literal["working", "short_term", "long_term"]

KINDS: tuple[str, ...] = ("task_experience", "user_preference", "tool_knowledge", "strategy")
STATUSES: tuple[str, ...] = ("candidate", "validated", "superseded", "retracted", "retired")
# Statuses whose items exist in the projections: superseded items stay for time-travel queries
# (`search(at=...)` inside their validity interval); retracted/retired ones are removed.
LIVE_STATUSES: tuple[str, ...] = ("candidate", "validated", "superseded")


class MemoryError_(Exception):
    """Base class for memory errors (named with a trailing underscore: `MemoryError` is a builtin)."""


class NotFound(MemoryError_, KeyError):
    """An unknown item, trajectory or version (or one that belongs to another tenant)."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else "not found"


class InvalidInput(MemoryError_, ValueError):
    """A malformed request: nothing was written."""


class Provenance(BaseModel):
    """Where a memory (or graph edge) came from: trajectory, step and the evidence text."""

    trajectory_id: str | None = None
    step: int | None = None
    evidence: str = ""
    source: str = "agent"  # agent | user | evolve | store | import
    cycle: str | None = None
    at: float = Field(default_factory=time.time)


class MemoryItem(BaseModel):
    """One long-term memory item (DESIGN.md). `version` counts the ledger events applied to it."""

    id: str = Field(default_factory=lambda: new_id("mem"))
    tenant: str
    tier: Tier = "long_term"
    kind: Kind = "task_experience"
    text: str
    payload: dict[str, Any] = Field(default_factory=dict)
    status: Status = "candidate"
    provenance: list[Provenance] = Field(default_factory=list)
    helpful: int = 0
    harmful: int = 0
    recent: list[int] = Field(default_factory=list)  # last outcomes, 1 helpful / 0 harmful
    valid_from: float = Field(default_factory=time.time)
    valid_to: float | None = None
    version: int = 0
    created_by_cycle: str | None = None
    created_at: float = Field(default_factory=time.time)
    updated_at: float = Field(default_factory=time.time)
    superseded_by: str | None = None
    supersedes: list[str] = Field(default_factory=list)
    entities: list[str] = Field(default_factory=list)
    relations: list[tuple[str, str, str]] = Field(default_factory=list)
    namespace: list[str] = Field(default_factory=list)  # LangGraph store namespace (store items)
    key: str | None = None  # LangGraph store key (store items)
    status_reason: str = ""

    def valid_at(self, t: float) -> bool:
        return self.valid_from <= t and (self.valid_to is None or t < self.valid_to)


class Hit(BaseModel):
    """A search result: the item, its combined score, the per-channel scores and provenance."""

    item: MemoryItem
    score: float
    scores: dict[str, float] = Field(default_factory=dict)  # vector, keyword, graph
    provenance: list[Provenance] = Field(default_factory=list)

    @property
    def id(self) -> str:
        return self.item.id

    @property
    def text(self) -> str:
        return self.item.text


class HistoryEntry(BaseModel):
    """One ledger event as seen by `history`/`explain`."""

    seq: int
    ts: float
    type: str
    tenant: str
    item_id: str | None = None
    trajectory_id: str | None = None
    cycle: str | None = None
    data: dict[str, Any] = Field(default_factory=dict)
    status: str | None = None  # item status after the event


class Explanation(BaseModel):
    """`explain(item)`: the provenance chain, the item's full history and its graph edges."""

    item: MemoryItem
    provenance: list[Provenance]
    history: list[HistoryEntry]
    edges: list[dict[str, Any]] = Field(default_factory=list)
    merged_from: list[str] = Field(default_factory=list)
    superseded_by: str | None = None
    supersedes: list[str] = Field(default_factory=list)


class TrajectoryPage(NamedTuple):
    """`trajectories(...)`: the trajectories (with feedback) after a cursor and the next cursor."""

    trajectories: list[Trajectory]
    cursor: int
