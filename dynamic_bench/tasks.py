"""Seeded task generation with disjoint train/test splits.

A task's params hold everything the env needs, hidden from the agent: the small database,
the request, `rules` in force for this user, `prior_rules` (the versions in force for this
user before, used to label stale violations), and `shown_rules`/`shown_version` (the policy
the agent is shown: the same as `rules` unless a shift was silent). The split is decided by
a hash of the task's facts with ids masked out, so a test task never repeats a train task's
facts under other ids.
"""
from __future__ import annotations

import json
import random
import re
import zlib
from typing import Any

from dynamic_bench.actions import format_action
from dynamic_bench.domains import Domain, Rules, get_domain
from dynamic_bench.personas import PERSONAS
from dynamic_bench.schema import Task

TEST_FRACTION = 5  # one task in five (by fact hash) is a test task
CUSTOM_VERSION = 0  # Task.rule_version for rule values that are not a named version
_IDS = re.compile(r"[A-Z]-\d+")


def split_of(params: dict) -> str:
    facts = _IDS.sub("#", json.dumps([params["kind"], params["db"]], sort_keys=True))
    return "test" if zlib.crc32(facts.encode()) % TEST_FRACTION == 0 else "train"


def resolve(domain: Domain, version: int | Rules) -> tuple[int, Rules]:
    """(version number, rule dict) for a named version or a dict of rule values."""
    if isinstance(version, dict):
        return CUSTOM_VERSION, version
    return version, domain.rules_for(version)


def make_task(domain: str | Domain, rng: random.Random, *, user: dict | None = None,
              rule_version: int | Rules = 1, split: str | None = "train", persona: str | None = None,
              prior: list[tuple[int, Rules]] | None = None, shown: tuple[int, Rules] | None = None,
              extra: dict[str, Any] | None = None) -> Task:
    """One task. `split=None` accepts either split (streams draw from the train split)."""
    d = get_domain(domain)
    version, rules = resolve(d, rule_version)
    user = user or d.sample_user(rng)
    for _ in range(1000):
        params = d.sample_params(rng, user)
        if split is None or split_of(params) == split:
            break
    else:
        raise RuntimeError(f"could not draw a {split} task for {d.name}")
    if prior is None:  # standalone task: every named version before this one came first
        prior = [(v, d.versions[v]) for v in sorted(d.versions) if version and v < version]
    shown = shown or (version, rules)
    params.update(rules=rules, prior_rules=[[v, r] for v, r in prior if r != rules],
                  shown_version=shown[0], shown_rules=shown[1], **(extra or {}))
    return Task(id=f"{d.name}-{split_of(params)}-{rng.getrandbits(48):012x}", domain=d.name,
                instruction=d.instruction(params), persona=persona or rng.choice(sorted(PERSONAS)),
                user_id=user["user_id"], rule_version=version, split=split_of(params), params=params,
                gold_checks=gold_checks(d, params, rules))


def gold_checks(d: Domain, params: dict, rules: Rules) -> dict:
    """What the verifier checks a task against: the outcome and writes `rules` prescribe."""
    writes, outcome = d.solve(params, rules)
    return {"outcome": outcome, "writes": [format_action(c) for c in writes]}


def complete_task(task: Task) -> Task:
    """Fill the params a hand-made Task may lack (rules from its version, shown = in force)."""
    p = task.params
    if "rules" in p and "shown_rules" in p and "prior_rules" in p:
        return task
    d = get_domain(task.domain)
    rules = p.get("rules") or d.rules_for(task.rule_version)
    prior = [[v, d.versions[v]] for v in sorted(d.versions) if v < task.rule_version]
    p = {**p, "rules": rules, "prior_rules": p.get("prior_rules", prior),
         "shown_rules": p.get("shown_rules", rules), "shown_version": p.get("shown_version", task.rule_version)}
    return task.model_copy(update={"params": p})


def generate_tasks(domain: str | Domain, n: int, seed: int, split: str = "train",
                   rule_version: int | Rules = 1, persona: str | None = None) -> list[Task]:
    """`n` independent tasks under one rule version (an int, or a dict of rule values)."""
    rng = random.Random(f"tasks/{get_domain(domain).name}/{seed}/{split}")
    return [make_task(domain, rng, rule_version=rule_version, split=split, persona=persona) for _ in range(n)]


def random_rule_tasks(domain: str | Domain, n: int, seed: int, split: str = "train",
                      shown_version: int | None = None) -> list[Task]:
    """Tasks each under freshly drawn dense rule values (cold-start data that covers the value space).

    With `shown_version`, the agent is shown that version's policy while the drawn values are in
    force (a silent shift); `rule_change_notes(domain, task.params["shown_rules"],
    task.params["rules"])` is then the memory hint that would let it act right."""
    d = get_domain(domain)
    rng = random.Random(f"dense/{d.name}/{seed}/{split}/{shown_version}")
    out = []
    for _ in range(n):
        rules = d.random_rules(rng)
        if shown_version is None:
            out.append(make_task(d, rng, rule_version=rules, split=split))
        else:
            old = d.rules_for(shown_version)
            out.append(make_task(d, rng, rule_version=rules, split=split, prior=[(shown_version, old)],
                                 shown=(shown_version, old)))
    return out


def old_rules_fail(task: Task, older: list[Rules] | None = None) -> bool:
    """Whether acting on older rules gets this task wrong: the right writes or outcome under the
    rules in force differ from those under `older` (default: the shown policy and every rule set
    this user had before). These are the episodes a shift really tests; on the others a policy
    that never adapted still succeeds, so success over all episodes mixes adaptation with luck."""
    task = complete_task(task)
    d, p = get_domain(task.domain), task.params

    def answer(rules: Rules) -> tuple[list[str], str]:
        writes, outcome = d.solve(p, rules)
        return [format_action(c) for c in writes], outcome

    now = answer(p["rules"])
    if older is None:
        older = [p["shown_rules"]] + [r for _, r in p["prior_rules"]]
    return any(r != p["rules"] and answer(r) != now for r in older)


def neighbour_tasks(task: Task, rng: random.Random, n: int, spread: float = 0.25) -> list[Task]:
    """Up to `n` distinct tasks like `task`, each with every whole-number fact of its database moved
    by up to `spread` of its value (at least 1; a zero stays zero, a positive value stays positive)
    and, with probability 1/2, its customer's tier (a value among `Domain.tiers`) swapped for
    another, in the same split, under the same rules and request, their gold answers recomputed.

    Why: the tasks around a task whose answer a shift changed straddle the threshold that moved. A
    policy taught the new answer from one side only stretches it past where the new rule stops
    (evolve.distill); its neighbours show both sides. The tier is a side too: a window that moved
    for one tier did not move for another, and a candidate shown only the first denied the other's
    refunds (stop 26: gold refunds on days 20-28)."""
    d, task = get_domain(task.domain), complete_task(task)
    seen, out = {json.dumps(task.params["db"], sort_keys=True)}, []
    for _ in range(20 * n):
        if len(out) == n:
            break
        params = {**task.params, "db": _nudged(task.params["db"], rng, spread, d.tiers)}
        key = json.dumps(params["db"], sort_keys=True)
        if key in seen or split_of(params) != task.split:
            continue
        seen.add(key)
        out.append(_with_facts(task, d, params, rng))
    return out


def boundary_tasks(task: Task, rng: random.Random, n: int, spread: float = 0.25) -> list[Task]:
    """Up to `n` distinct tasks like `task` (same split, rules and request, gold answers recomputed),
    each with one whole-number fact of its database set onto an edge near it, or one past it: a
    whole-number value `t` of the rules in force, shown, or in force before, within `spread` of the
    fact, where the fact at `t` and at `t + 1` get different answers under one of those rule sets
    (a threshold this request is judged by). Drawn without replacement, in `rng`'s order.

    Why: `neighbour_tasks` moves facts at random, so a fact rarely lands on a threshold, and the
    demo candidates taught with them lost old-rule tasks right at the new rules' edges (stop 32:
    refunds at exactly 20 days, which v2's inclusive window still refunds; escalations above the
    threshold that moved 200 -> 150). Only real edges: without that test (stop 33) an exchange's
    amount was set on the escalation threshold too, and the seed-1 demo candidate stopped
    exchanging large orders (old-rule forgetting 12.5 points, against 3.0 without boundary tasks)."""
    d, task = get_domain(task.domain), complete_task(task)
    p = task.params
    rule_sets = [p["rules"], p["shown_rules"], *(r for _, r in p["prior_rules"])]
    thresholds = {v for rules in rule_sets for _, v in _int_facts(rules)}
    facts = dict(_int_facts(p["db"]))

    def answers(path: tuple, value: int) -> list:
        params = {**p, "db": _set_fact(p["db"], path, value)}
        return [d.solve(params, rules) for rules in rule_sets]

    candidates = sorted({(path, value) for path, fact in facts.items() for t in thresholds
                         if abs(t - fact) <= max(1, round(spread * fact)) and answers(path, t) != answers(path, t + 1)
                         for value in (t, t + 1) if value != fact}, key=repr)
    rng.shuffle(candidates)
    out: list[Task] = []
    for path, value in candidates:  # each (fact, value) is another database
        if len(out) == n:
            break
        params = {**p, "db": _set_fact(p["db"], path, value)}
        if split_of(params) == task.split:
            out.append(_with_facts(task, d, params, rng))
    return out


def changed_tasks(task: Task, rng: random.Random, n: int) -> list[Task]:
    """Up to `n` distinct tasks like `task` (same split, rules and request, gold answers recomputed),
    each with one whole-number fact of its database set to a value where the rules in force answer
    otherwise than the shown rules or a rule set in force before: the band a shifted threshold swept
    (a refund amount between the old and the new escalation threshold). Facts take turns, in `rng`'s
    order, each value drawn from its band; an empty list where no rule changed.

    Why: `boundary_tasks` sets facts on the edges and `neighbour_tasks` moves them a little, so the
    middle of a band is seen only by chance. Build E's seed-1 demo: the promoted policy refunded
    in-window refunds of 153 and 185, between the escalation thresholds 150 (new) and 200 (old),
    with "refunds over 150 must now be escalated" in its prompt (stop 45)."""
    d, task = get_domain(task.domain), complete_task(task)
    p = task.params
    older = [r for r in [p["shown_rules"], *(r for _, r in p["prior_rules"])] if r != p["rules"]]
    if not older or n <= 0:
        return []
    top = max(v for rules in [p["rules"], *older] for _, v in _int_facts(rules)) + 1

    def changed(path: tuple, value: int) -> bool:
        params = {**p, "db": _set_fact(p["db"], path, value)}
        now = d.solve(params, p["rules"])
        return any(d.solve(params, r) != now for r in older)

    bands = {path: [v for v in range(1, top + 1) if v != fact and changed(path, v)]
             for path, fact in sorted(_int_facts(p["db"]), key=repr)}
    bands = {path: values for path, values in bands.items() if values}
    out: list[Task] = []
    for _ in range(20 * n):  # a drawn value may fall in the other split or repeat one drawn before
        if len(out) == n or not bands:
            break
        for path in rng.sample(sorted(bands, key=repr), len(bands)):
            if len(out) == n:
                break
            params = {**p, "db": _set_fact(p["db"], path, rng.choice(bands[path]))}
            if split_of(params) == task.split and all(params["db"] != t.params["db"] for t in out):
                out.append(_with_facts(task, d, params, rng))
    return out


def _with_facts(task: Task, d: Domain, params: dict, rng: random.Random) -> Task:
    """`task` with `params` (other facts), a fresh id and the gold answer those facts get."""
    return task.model_copy(update={"id": f"{d.name}-{task.split}-{rng.getrandbits(48):012x}", "params": params,
                                   "gold_checks": gold_checks(d, params, params["rules"])})


def _int_facts(value: Any, path: tuple = ()) -> list[tuple[tuple, int]]:
    """(path, value) of every positive whole number in a database (or a rule set)."""
    if isinstance(value, dict):
        return [x for k, v in value.items() for x in _int_facts(v, (*path, k))]
    if isinstance(value, list):
        return [x for i, v in enumerate(value) for x in _int_facts(v, (*path, i))]
    return [(path, value)] if isinstance(value, int) and not isinstance(value, bool) and value > 0 else []


def _set_fact(value: Any, path: tuple, new: int) -> Any:
    """A copy of `value` with the fact at `path` replaced by `new`."""
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        return {k: _set_fact(v, rest, new) if k == head else v for k, v in value.items()}
    return [_set_fact(v, rest, new) if i == head else v for i, v in enumerate(value)]


def _nudged(value: Any, rng: random.Random, spread: float, tiers: tuple[str, ...]) -> Any:
    if isinstance(value, dict):
        return {k: _nudged(v, rng, spread, tiers) for k, v in value.items()}
    if isinstance(value, list):
        return [_nudged(v, rng, spread, tiers) for v in value]
    if isinstance(value, str) and value in tiers:
        return rng.choice([t for t in tiers if t != value]) if rng.random() < 0.5 else value
    if isinstance(value, bool) or not isinstance(value, int) or value == 0:
        return value
    step = max(1, round(spread * abs(value)))
    moved = value + rng.randint(-step, step)
    return max(1, moved) if value > 0 else min(-1, moved)
