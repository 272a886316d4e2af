"""Drift streams: a seeded sequence of episodes whose rules shift at scheduled points.

A schedule is a list of phases; each phase after the first is a shift:
`{"at": 0.5, "version": 2, "announced": false, "gradual": 0.2, "scope": 0.5, "kind": "silent"}`.
`at` and `gradual` are fractions of the stream (< 1) or episode counts; `version` is a named
version or a dict of rule values (`{"base": 1, "refund_window": 9}`); `scope` is the
fraction of users who move (the others keep their rules); `gradual` ramps the chance that an
episode runs under the new rules from 0 to 1 over that window; `announced` decides whether the
shown policy follows the new rules. A silent shift leaves the shown policy where it was.
Custom schedules are the same dict in a JSON or YAML file: `make_stream("my.yaml", ...)`.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dynamic_bench.domains import Domain, Rules, get_domain
from dynamic_bench.schema import Task
from dynamic_bench.tasks import make_task


def _presets(d: Domain) -> dict[str, list[dict[str, Any]]]:
    tool_to = d.tool_drift[1]
    return {
        "static": [{"version": 1}],
        "announced": [{"version": 1}, {"at": 0.5, "version": 2, "announced": True, "kind": "announced"}],
        "silent": [{"version": 1}, {"at": 0.5, "version": 2, "announced": False, "kind": "silent"}],
        "gradual": [{"version": 1}, {"at": 0.4, "version": 2, "announced": True, "gradual": 0.2, "kind": "gradual"}],
        "scoped": [{"version": 1}, {"at": 0.5, "version": 2, "announced": True, "scope": 0.5, "kind": "scoped"}],
        "reverted": [{"version": 1}, {"at": 1 / 3, "version": 2, "announced": False, "kind": "silent"},
                     {"at": 2 / 3, "version": 1, "announced": False, "kind": "reverted"}],
        "tool-drift": [{"version": 1}, {"at": 0.5, "version": tool_to, "announced": False, "kind": "tool-drift"}],
        "mixed": [{"version": 1}, {"at": 0.25, "version": 2, "announced": True, "kind": "announced"},
                  {"at": 0.5, "version": 3, "announced": False, "gradual": 0.1, "kind": "gradual"},
                  {"at": 0.75, "version": tool_to, "announced": False, "kind": "tool-drift"}],
    }


PRESETS = tuple(_presets(get_domain("retail")))


@dataclass
class Episode:
    index: int
    task: Task
    phase: int
    version: int  # rule version in force for this episode's user
    shown_version: int
    seed: int  # the env's reset seed (persona decisions)
    shift: int | None = None  # index into Stream.shifts when this episode starts a phase
    in_scope: bool = True  # whether this user moved at the latest shift


@dataclass
class Stream:
    name: str
    domain: str
    seed: int
    episodes: list[Episode]
    shifts: list[dict[str, Any]]
    phases: list[dict[str, Any]] = field(default_factory=list)  # start, end, version, kind

    def __len__(self) -> int:
        return len(self.episodes)

    def __iter__(self):
        return iter(self.episodes)


def load_schedule(path: str | Path) -> dict[str, Any]:
    """A custom schedule from JSON or YAML: `{"name": ..., "phases": [...]}` or just the list."""
    path = Path(path)
    text = path.read_text()
    try:
        if path.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except Exception as e:  # noqa: BLE001 - any parse failure is the file's fault
        raise ValueError(f"schedule {path}: cannot parse: {e}") from e
    if isinstance(data, list):
        data = {"phases": data}
    if not isinstance(data, dict) or not isinstance(data.get("phases"), list) or not data["phases"]:
        raise ValueError(f"schedule {path}: expected a non-empty list of phases")
    data.setdefault("name", path.stem)
    return data


def _count(x: float | int, n: int) -> int:
    return int(round(x * n)) if isinstance(x, float) and x < 1 else int(x)


def _resolve(d: Domain, version: Any, number: int) -> tuple[int, Rules]:
    if isinstance(version, int):
        return version, d.rules_for(version)
    if isinstance(version, dict):
        base = d.rules_for(int(version.get("base", 1)))
        extra = {k: v for k, v in version.items() if k != "base"}
        unknown = sorted(set(extra) - set(base))
        if unknown:
            raise ValueError(f"unknown rule parameter(s) {unknown} for {d.name}; known: {sorted(base)}")
        return number, {**base, **extra}
    raise ValueError(f"a phase's version must be an int or a dict of rule values, got {version!r}")


def _phases(d: Domain, spec: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    phases = []
    for i, ph in enumerate(spec):
        if not isinstance(ph, dict) or "version" not in ph:
            raise ValueError(f"phase {i}: expected a dict with a 'version'")
        num, rules = _resolve(d, ph["version"], 100 + i)
        start = 0 if i == 0 else _count(ph.get("at", 0), n)
        if phases and start <= phases[-1]["start"]:
            raise ValueError(f"phase {i}: starts at episode {start}, not after the previous phase "
                             f"(a stream of {n} episodes may be too short for this schedule)")
        if i and start >= n:
            raise ValueError(f"phase {i}: starts at episode {start}, beyond the stream's {n} episodes")
        scope = float(ph.get("scope", 1.0))
        if not 0.0 <= scope <= 1.0:
            raise ValueError(f"phase {i}: scope must be within [0, 1]")
        phases.append({"start": start, "version": num, "rules": rules, "announced": bool(ph.get("announced", True)),
                       "gradual": _count(ph.get("gradual", 0), n), "scope": scope,
                       "kind": ph.get("kind", "start" if i == 0 else "shift")})
    for a, b in zip(phases, phases[1:] + [{"start": n}]):
        a["end"] = b["start"]
    return phases


def make_stream(preset: str, domain: str | Domain, n_episodes: int, seed: int, split: str | None = None,
                n_users: int | None = None) -> Stream:
    """A seeded stream. `preset` is a name in PRESETS or a path to a JSON/YAML schedule."""
    d = get_domain(domain)
    presets = _presets(d)
    if preset in presets:
        name, spec = preset, presets[preset]
    elif Path(preset).is_file():
        sched = load_schedule(preset)
        name, spec = sched["name"], sched["phases"]
    else:
        raise KeyError(f"unknown stream {preset!r}: not a preset ({', '.join(presets)}) nor a schedule file")
    phases = _phases(d, spec, n_episodes)
    rng = random.Random(f"stream/{d.name}/{name}/{seed}")
    users = [d.sample_user(rng) for _ in range(n_users or max(4, min(50, n_episodes // 4)))]
    # per-user phase-level state: (version, rules) in force, shown (version, rules), history
    cur = [(phases[0]["version"], phases[0]["rules"])] * len(users)
    shown = list(cur)
    history: list[list[tuple[int, Rules]]] = [[c] for c in cur]
    moved = [True] * len(users)
    episodes, shifts = [], []
    for k, ph in enumerate(phases):
        if k:
            order = rng.sample(range(len(users)), len(users))
            scoped = set(order[:round(ph["scope"] * len(users))])
            prev, prev_shown = list(cur), list(shown)
            for u in range(len(users)):
                moved[u] = u in scoped
                if moved[u]:
                    cur[u] = (ph["version"], ph["rules"])
                    if ph["announced"]:
                        shown[u] = cur[u]
            shifts.append({"index": ph["start"], "kind": ph["kind"], "from_version": phases[k - 1]["version"],
                           "to_version": ph["version"], "announced": ph["announced"], "scope": ph["scope"],
                           "gradual": ph["gradual"]})
        else:
            prev, prev_shown = list(cur), list(shown)
        for i in range(ph["start"], ph["end"]):
            u = rng.randrange(len(users))
            version, rules = cur[u]
            show = shown[u]
            if ph["gradual"] and moved[u] and i - ph["start"] < ph["gradual"]:
                if rng.random() >= (i - ph["start"] + 1) / (ph["gradual"] + 1):
                    version, rules = prev[u]
                    show = prev_shown[u]
            prior = [h for h in history[u] if h[1] != rules]
            task = make_task(d, rng, user=users[u], rule_version=rules, split=split, prior=prior, shown=show,
                             extra={"stream": name, "phase": k})
            task = task.model_copy(update={"rule_version": version})
            episodes.append(Episode(i, task, k, version, show[0], rng.getrandbits(31),
                                    shift=k - 1 if (k and i == ph["start"]) else None, in_scope=moved[u]))
            if (version, rules) not in history[u]:
                history[u].append((version, rules))
        for u in range(len(users)):  # a user not drawn this phase still lived under its rules
            if moved[u] and cur[u] not in history[u]:
                history[u].append(cur[u])
    for p in phases:
        p.pop("rules")
    return Stream(name, d.name, seed, episodes, shifts, phases)


def rule_change_notes(domain: str | Domain, old_v: int | Rules, new_v: int | Rules) -> list[str]:
    """Short natural statements of what changed between two rule versions."""
    d = get_domain(domain)
    return d.describe_change(d.rules_for(old_v), d.rules_for(new_v))
