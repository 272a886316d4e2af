"""What a DriftBench domain is: a small database, typed tools, and rules as code.

A rule set is a flat dict of parameters (numbers and categories a memory note can state,
e.g. `refund_window: 14`) plus `tools`, the id of the tool set in force. Named versions are
fixed dicts; `random_rules` draws dense values so that training data covers every value a
shift could bring (PROTOTYPE-FINDINGS 3). Each `Rule` carries both its predicate (what it
forbids) and its policy sentence, so the text an agent reads is rendered from the code that
grades it.
"""
from __future__ import annotations

import random
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable

from dynamic_bench.actions import ToolCall, ToolSpec

Rules = dict[str, Any]
_FIELD = re.compile(r"\{(\w+)\}")
State = dict[str, Any]


@dataclass(frozen=True)
class Rule:
    """One rule: `forbids(state, params, call, rules)` is True when the rule forbids `call`."""

    name: str
    render: Callable[[Rules], str]
    forbids: Callable[[State, dict, ToolCall, Rules], bool]


@dataclass(frozen=True)
class ToolSet:
    """The tools of one tool-set id: specs by name, deprecated names -> replacement, error texts."""

    specs: dict[str, ToolSpec]
    deprecated: dict[str, str]
    errors: dict[str, str]  # error key -> template (str.format with fields)


class Domain(ABC):
    """A domain. Subclasses fill the class attributes and the abstract methods."""

    name: str = ""
    versions: dict[int, Rules] = {}
    tool_sets: dict[int, ToolSet] = {}
    rules: tuple[Rule, ...] = ()
    outcomes: tuple[str, ...] = ()  # words a final reply must use to state the outcome
    tool_drift: tuple[int, int] = (1, 1)  # (from, to) versions for the tool-drift preset
    tiers: tuple[str, ...] = ()
    # (rule parameters, the note stating their new value): what `describe_change` says
    change_notes: tuple[tuple[tuple[str, ...], Callable[[Rules], str]], ...] = ()

    # --- rules and tools -------------------------------------------------------------
    def rules_for(self, version: int | Rules) -> Rules:
        if isinstance(version, dict):
            return version
        if version not in self.versions:
            raise KeyError(f"{self.name} has no rule version {version}; versions: {sorted(self.versions)}")
        return self.versions[version]

    def changed_versions(self) -> list[int]:
        """Named versions after the first whose rules differ from it (what a shift can bring)."""
        return [v for v in sorted(self.versions) if v > 1 and self.versions[v] != self.versions[1]]

    def tools(self, rules: Rules) -> dict[str, ToolSpec]:
        return self.tool_sets[rules["tools"]].specs

    def tool_dicts(self, rules: Rules) -> list[dict[str, Any]]:
        """The tool specs in force as JSON-able dicts (cached per tool set: built once)."""
        cache = self.__dict__.setdefault("_tool_dicts", {})
        if rules["tools"] not in cache:
            cache[rules["tools"]] = [s.to_dict() for s in self.tools(rules).values()]
        return cache[rules["tools"]]

    def policy_text(self, rules: Rules | int, version: int | None = None) -> str:
        """The rules as shown to an agent, rendered from the same Rule objects that grade it."""
        cache = self.__dict__.setdefault("_texts", {})
        hit = cache.get((id(rules), version))
        if hit is not None and hit[0] is rules:  # the cache keeps `rules` alive, so its id is not reused
            return hit[1]
        text = self._render(rules, version)
        if len(cache) > 10_000:
            cache.clear()
        cache[(id(rules), version)] = (rules, text)
        return text

    def _render(self, rules: Rules | int, version: int | None = None) -> str:
        if isinstance(rules, int):
            rules, version = self.rules_for(rules), rules
        head = f"{self.name} policy" + (f" v{version}" if version is not None else "")
        tail = (f"- If no rule allows a change, deny. End with a reply that states the outcome: "
                f"{', '.join(self.outcomes[:-1])} or {self.outcomes[-1]}.")
        return "\n".join([head] + [f"- {r.render(rules)}" for r in self.rules] + [tail])

    def violations(self, state: State, params: dict, call: ToolCall, rules: Rules) -> list[str]:
        return [r.name for r in self.rules if r.forbids(state, params, call, rules)]

    def all_write_names(self) -> set[str]:
        return {s.name for ts in self.tool_sets.values() for s in ts.specs.values() if s.is_write}

    def error(self, rules: Rules, key: str, **fields: Any) -> str:
        return self.tool_sets[rules["tools"]].errors[key].format(**fields)

    def call(self, rules: Rules, op: str, **args: Any) -> ToolCall:
        """The call of operation `op` under `rules`' tool set (tool names and arguments drift)."""
        for spec in self.tools(rules).values():
            if spec.op == op:
                return ToolCall(spec.name, {a: args[a] for a, _ in spec.args})
        raise KeyError(f"{self.name}: no tool for op {op!r} in tool set {rules['tools']}")

    @abstractmethod
    def random_rules(self, rng: random.Random) -> Rules:
        """A rule set with values drawn densely from the ranges shifts may use."""

    # --- tasks and state -------------------------------------------------------------
    @abstractmethod
    def sample_params(self, rng: random.Random, user: dict) -> dict:
        """A task's hidden facts (its small database) and the request, for `user`."""

    @abstractmethod
    def sample_user(self, rng: random.Random) -> dict:
        """A user profile (`user_id`, tier or plan) reused across a stream's episodes."""

    @abstractmethod
    def instruction(self, params: dict) -> str:
        """The user's opening message."""

    @abstractmethod
    def initial_state(self, params: dict) -> State:
        """A fresh mutable state built from the task's database (cheap: no deep copy)."""

    @abstractmethod
    def execute(self, state: State, params: dict, spec: ToolSpec, call: ToolCall, rules: Rules) -> str:
        """Run a validated call; return the observation text (mutating `state` for writes)."""

    @abstractmethod
    def outcome_key(self, state: State) -> tuple:
        """What the verifier compares with the gold replay."""

    # --- the gold solution (rules as code, read from the facts) --------------------------
    @abstractmethod
    def solve(self, params: dict, rules: Rules) -> tuple[list[ToolCall], str]:
        """(write calls the rules prescribe, in order; outcome word the reply must state)."""

    def same_answer(self, params: dict, a: Rules, b: Rules) -> bool:
        """Whether rules `a` and `b` prescribe the same writes (by operation and arguments) and outcome
        for a task: where they do not, one prompt cannot be right for both after a silent shift."""
        (wa, oa), (wb, ob) = self.solve(params, a), self.solve(params, b)
        return oa == ob and [(self.tools(a)[c.name].op, sorted(c.args.items())) for c in wa] == \
            [(self.tools(b)[c.name].op, sorted(c.args.items())) for c in wb]

    @abstractmethod
    def reads(self, params: dict, rules: Rules) -> tuple[list[ToolCall], list[ToolCall]]:
        """(read calls needed to decide, reads that are harmless but not needed)."""

    @abstractmethod
    def reply_text(self, params: dict, outcome: str) -> str:
        """The oracle's reply."""

    def describe_change(self, old: Rules, new: Rules) -> list[str]:
        """Short natural statements of what changed (what a memory note would say)."""
        notes = [note(new) for keys, note in self.change_notes if any(old[k] != new[k] for k in keys)]
        if old["tools"] != new["tools"]:
            notes += tool_change_notes(self.tool_sets[old["tools"]], self.tool_sets[new["tools"]])
        return notes


def tool_change_notes(old: ToolSet, new: ToolSet) -> list[str]:
    """Renames, new required arguments, deprecations and changed errors between two tool sets."""
    notes = []
    by_op_old = {s.op: s for s in old.specs.values()}
    for s in new.specs.values():
        o = by_op_old.get(s.op)
        if o is None:
            notes.append(f"new tool {s.signature()}")
            continue
        if o.name != s.name:
            verb = "is deprecated, use" if o.name in new.deprecated else "was renamed to"
            notes.append(f"tool {o.name} {verb} {s.name}")
        added = [a for a, _ in s.args if a not in dict(o.args)]
        for a in added:
            notes.append(f"{s.name} now needs argument {a}" + (f" ({'|'.join(dict(s.enums)[a])})"
                                                                if a in dict(s.enums) else ""))
    for key, text in new.errors.items():
        if old.errors.get(key) != text and text:
            notes.append("an error now reads: " + _FIELD.sub(lambda m: m.group(1).upper(), text))
    return notes
