"""Simulated users: DriftBench's personas plus the two traits a service conversation needs.

The answer to a proposed write (approve / reject / edit / take over, per tool × correctness)
is DriftBench's `Persona` unchanged, so the benchmark and the simulator cannot drift apart.
On top: `patience`, the turns a user waits before giving up on an episode, and `volunteer`,
the chance that a rejection or edit comes with the reason (the rule now in force, in words),
which is the information memory can learn from online.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dynamic_bench.personas import DECISIONS, Decision, Persona, get_persona


@dataclass(frozen=True)
class SimPersona:
    base: Persona
    patience: int = 10
    volunteer: float = 0.5

    @property
    def name(self) -> str:
        return self.base.name

    def decide(self, judgement: dict[str, Any], rng: random.Random) -> Decision:
        return self.base.decide(judgement, rng)

    def volunteers(self, rng: random.Random) -> bool:
        return rng.random() < self.volunteer

    def to_dict(self) -> dict:
        return {"name": self.base.name, "patience": self.patience, "volunteer": self.volunteer,
                "propensities": [{"tool": t, "correct": c, **p} for (t, c), p in sorted(self.base.propensities.items())]}

    @classmethod
    def from_dict(cls, d: dict) -> "SimPersona":
        try:
            props = {(r["tool"], bool(r["correct"])): {k: float(r.get(k, 0.0)) for k in DECISIONS}
                     for r in d["propensities"]}
            return cls(Persona(str(d.get("name", "fitted")), props), int(d.get("patience", 10)),
                       float(d.get("volunteer", 0.5)))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"not a persona file: {e}") from e

    @classmethod
    def load(cls, path: str | Path) -> "SimPersona":
        return cls.from_dict(json.loads(Path(path).read_text()))


def default_persona(name: str, patience: int = 10, volunteer: float = 0.5) -> SimPersona:
    """A DriftBench persona by name, with the simulator's traits."""
    return SimPersona(get_persona(name), patience, volunteer)
