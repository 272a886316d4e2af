"""Working and short-term memory: small pydantic models the runtime keeps in its graph state.

They live in the LangGraph thread state (checkpointed with the thread), not in the ledger:
working memory is the current task's scratchpad, short-term memory the recent turns of one
tenant's thread. Short-term memory is bounded: when it overflows, the oldest turns are
compressed by extraction into structured facts (tool calls, observed values, stated
preferences, outcomes), so what mattered survives and the prompt stays small.
"""
from __future__ import annotations

import json
import re
import time
from typing import Any, Literal

from pydantic import BaseModel, Field

_CALL = re.compile(r"^\s*([a-z_][a-z0-9_]*)\s*(\{.*\})\s*$", re.S)
_KV = re.compile(r"\b([a-z_][a-z0-9_]*)\s*[=:]\s*([A-Za-z0-9_.\-]+)")
_PREF = re.compile(r"\b(?:i (?:prefer|want|like|need)|please (?:always|never)|always|never)\b[^.!?]*",
                   re.I)


class WorkingMemory(BaseModel):
    """The current task's plan, its constraints restated explicitly, pinned tool results and
    intermediate state. Restating constraints every turn keeps rules in force visible to a
    small policy even after many turns."""

    task_id: str | None = None
    plan: list[str] = Field(default_factory=list)
    constraints: list[str] = Field(default_factory=list)
    pinned: dict[str, str] = Field(default_factory=dict)
    state: dict[str, Any] = Field(default_factory=dict)
    max_pinned_chars: int = 400

    def restate(self, constraints: list[str]) -> None:
        self.constraints = list(dict.fromkeys(c.strip() for c in constraints if c.strip()))

    def pin(self, name: str, result: str) -> None:
        self.pinned[name] = result[: self.max_pinned_chars]

    def render(self) -> str:
        parts = []
        if self.constraints:
            parts.append("constraints: " + "; ".join(self.constraints))
        if self.plan:
            parts.append("plan: " + " -> ".join(self.plan))
        parts += [f"{k}: {v}" for k, v in self.pinned.items()]
        return "\n".join(parts)


class Turn(BaseModel):
    role: Literal["user", "agent", "tool", "system"]
    text: str
    outcome: str | None = None
    at: float = Field(default_factory=time.time)


class Fact(BaseModel):
    """A structured fact extracted from turns that were compressed away."""

    subject: str
    relation: str
    value: str
    at: float = Field(default_factory=time.time)


class ShortTermMemory(BaseModel):
    """Recent turns and outcomes for one tenant's thread, bounded by `max_turns`."""

    tenant: str
    thread: str
    max_turns: int = 8
    max_facts: int = 32
    turns: list[Turn] = Field(default_factory=list)
    facts: list[Fact] = Field(default_factory=list)

    def observe(self, role: str, text: str, outcome: str | None = None) -> None:
        self.turns.append(Turn(role=role, text=text, outcome=outcome))  # type: ignore[arg-type]
        if len(self.turns) > self.max_turns:
            cut = len(self.turns) - self.max_turns // 2
            old, self.turns = self.turns[:cut], self.turns[cut:]
            self.add_facts(extract_facts(old))

    def add_facts(self, facts: list[Fact]) -> None:
        """Newer facts replace older ones about the same subject and relation."""
        def key(f: Fact) -> tuple[str, ...]:  # several preferences coexist; values get replaced
            return (f.subject, f.relation, f.value) if f.relation == "prefers" else (f.subject, f.relation)

        merged = {key(f): f for f in self.facts}
        for f in facts:
            merged.pop(key(f), None)
            merged[key(f)] = f
        self.facts = list(merged.values())[-self.max_facts:]

    def preferences(self) -> list[Fact]:
        """Facts worth proposing to long-term memory as `user_preference` candidates."""
        return [f for f in self.facts if f.relation == "prefers"]

    def render(self) -> str:
        lines = [f"fact: {f.subject} {f.relation} {f.value}" for f in self.facts]
        lines += [f"{t.role}: {t.text}" + (f" [{t.outcome}]" if t.outcome else "") for t in self.turns]
        return "\n".join(lines)


def extract_facts(turns: list[Turn]) -> list[Fact]:
    """Rule-based extraction (no model): tool calls, key=value observations, preferences, outcomes."""
    facts: list[Fact] = []
    for t in turns:
        if t.role == "agent" and (m := _CALL.match(t.text)):
            try:
                args = json.loads(m.group(2))
            except ValueError:
                args = m.group(2)
            facts.append(Fact(subject=f"tool:{m.group(1)}", relation="called_with",
                              value=json.dumps(args, sort_keys=True), at=t.at))
        elif t.role == "tool":
            for k, v in _KV.findall(t.text):
                facts.append(Fact(subject="observed", relation=k, value=v, at=t.at))
        elif t.role == "user":
            for p in _PREF.findall(t.text):
                facts.append(Fact(subject="user", relation="prefers", value=p.strip(), at=t.at))
        if t.outcome:
            facts.append(Fact(subject=f"turn:{t.role}", relation="outcome", value=t.outcome, at=t.at))
    return facts
