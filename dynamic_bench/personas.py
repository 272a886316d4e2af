"""Simulated users: how a persona answers a proposed write action.

A persona's propensities are probabilities over `approve reject edit takeover`, looked up
by (tool name, whether the action is right under the rules in force), falling back to
("*", correct). Edits and takeovers replace the action with the right one (the user knows
the rules in force), which is what gives feedback its training value. No persona rejects a
right action, so an agent that follows the rules in force can always succeed.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from dynamic_bench.schema import CORRECTION_KINDS

DECISIONS = ("approve", "reject", "edit", "takeover")
Propensities = dict[tuple[str, bool], dict[str, float]]


@dataclass(frozen=True)
class Decision:
    kind: str  # one of DECISIONS
    action_text: str | None = None  # the action actually done (edit / takeover), else None


@dataclass(frozen=True)
class Persona:
    name: str
    propensities: Propensities = field(default_factory=dict)

    def probs(self, tool: str, correct: bool) -> dict[str, float]:
        return self.propensities.get((tool, correct)) or self.propensities[("*", correct)]

    def decide(self, judgement: dict[str, Any], rng: random.Random) -> Decision:
        """Seeded answer to `judgement` (the dict `env.judge_action` returns)."""
        probs = self.probs(judgement.get("tool") or "*", bool(judgement["correct"]))
        kinds = [k for k in DECISIONS if probs.get(k, 0.0) > 0]
        kind = rng.choices(kinds, weights=[probs[k] for k in kinds])[0]
        fix = judgement.get("correct_write")
        if kind in CORRECTION_KINDS:
            if judgement["correct"]:  # nothing to fix: an edit is an approval, a takeover does the same
                return Decision("approve") if kind == "edit" else Decision(kind, judgement["action_text"])
            if fix is None:  # nothing right to do instead: the user just says no
                return Decision("reject")
            return Decision(kind, fix)
        return Decision(kind)


def _p(approve: float = 0, reject: float = 0, edit: float = 0, takeover: float = 0) -> dict[str, float]:
    return {"approve": approve, "reject": reject, "edit": edit, "takeover": takeover}


PERSONAS: dict[str, Persona] = {
    "trusting": Persona("trusting", {("*", True): _p(approve=1.0), ("*", False): _p(approve=0.8, reject=0.2)}),
    "careful": Persona("careful", {("*", True): _p(approve=1.0), ("*", False): _p(reject=0.6, edit=0.4)}),
    "editor": Persona("editor", {("*", True): _p(approve=0.9, edit=0.1), ("*", False): _p(approve=0.1, edit=0.9)}),
    "hands_on": Persona("hands_on", {("*", True): _p(approve=0.7, takeover=0.3),
                                     ("*", False): _p(reject=0.4, takeover=0.6)}),
}


def get_persona(name: str) -> Persona:
    if name not in PERSONAS:
        raise KeyError(f"unknown persona {name!r}; personas: {sorted(PERSONAS)}")
    return PERSONAS[name]
