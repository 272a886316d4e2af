"""The programmatic verifier: gold replay, required outputs, forbidden actions, stale labels.

An episode succeeds when (1) its final state equals the state the gold replay reaches (the
writes the rules in force prescribe, applied to the same initial state), (2) the final reply
states the outcome (the right outcome word, and no other), and (3) the agent proposed no
action the rules in force forbid. A proposed write is *stale* when it is wrong now but is
what an earlier rule version in force for this user prescribed.
"""
from __future__ import annotations

import re
from typing import Any

from dynamic_bench.actions import format_action
from dynamic_bench.domains import Domain

_WORD = re.compile(r"[a-z]+")


def reply_states(domain: Domain, text: str, outcome: str) -> bool:
    """The reply names `outcome` and no other outcome word."""
    words = set(_WORD.findall(text.lower()))
    return outcome in words and not (words & (set(domain.outcomes) - {outcome}))


def gold_replay(domain: Domain, params: dict, rules: dict) -> tuple[list[str], str, tuple]:
    """(canonical texts of the prescribed writes, outcome word, outcome key of the gold state)."""
    calls, outcome = domain.solve(params, rules)
    state = domain.initial_state(params)
    tools = domain.tools(rules)
    for c in calls:
        domain.execute(state, params, tools[c.name], c, rules)
    return [format_action(c) for c in calls], outcome, domain.outcome_key(state)


def verdict(domain: Domain, state: dict, gold_key: tuple, outcome: str, reply: str | None,
            proposals: list[dict[str, Any]], n_steps: int, n_invalid: int) -> dict[str, Any]:
    """The end-of-episode verdict: success, reward and its breakdown, violations, stale labels."""
    violations = [v for p in proposals for v in p["violations"]]
    stale = [p["action_text"] for p in proposals if p["stale"]]
    state_ok = domain.outcome_key(state) == gold_key
    reply_ok = reply is not None and reply_states(domain, reply, outcome)
    success = state_ok and reply_ok and not violations
    breakdown = {"state": float(state_ok), "reply": float(reply_ok), "rules": float(not violations),
                 "format": 1.0 - n_invalid / max(n_steps, 1)}
    return {"success": success, "reward": 1.0 if success else 0.0, "breakdown": breakdown,
            "violations": violations, "stale_violations": stale, "n_stale": len(stale),
            "gold_outcome": outcome, "n_steps": n_steps, "n_invalid": n_invalid}
