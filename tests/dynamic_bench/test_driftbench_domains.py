"""Domains: rules as code agree with the policy text and the gold solution; tasks and splits; personas."""
import json
import random
from collections import Counter

import pytest

from dynamic_bench import (DOMAINS, PERSONAS, OracleAgent, StaleAgent, generate_tasks, get_domain, make,
                           random_rule_tasks, run_episode)
from dynamic_bench.actions import format_action


@pytest.mark.parametrize("name", sorted(DOMAINS))
def test_at_least_three_rule_versions_with_distinct_texts(name):
    d = get_domain(name)
    assert len(d.versions) >= 3
    texts = [d.policy_text(v) for v in d.versions]
    assert len(set(texts)) == len(texts)


def test_policy_text_is_rendered_from_the_rule_values():
    d = get_domain("retail")
    rules = {**d.versions[1], "refund_window": 17, "escalate_over": 230, "gold_coupon": 35}
    text = d.policy_text(rules)
    assert "within 17 days" in text and "over 230" in text and "coupon of 35" in text
    t = get_domain("telecom").policy_text({**get_domain("telecom").versions[2], "credit_amount": 42})
    assert "exactly 42" in t


@pytest.mark.parametrize("name", sorted(DOMAINS))
def test_gold_writes_break_no_rule_and_decisions_depend_on_facts_and_rules(name):
    d = get_domain(name)
    tasks = generate_tasks(name, 300, 1)
    for v, rules in d.versions.items():
        outcomes = Counter()
        for t in tasks:
            calls, outcome = d.solve(t.params, rules)
            outcomes[outcome] += 1
            state = d.initial_state(t.params)
            for c in calls:
                assert d.violations(state, t.params, c, rules) == [], (v, format_action(c))
                d.execute(state, t.params, d.tools(rules)[c.name], c, rules)
        assert len(outcomes) == 4, (v, outcomes)  # every outcome occurs: facts matter
    changed = sum(d.solve(t.params, d.versions[1]) != d.solve(t.params, d.versions[2]) for t in tasks)
    assert changed / len(tasks) > 0.25  # rules matter


@pytest.mark.parametrize("name", sorted(DOMAINS))
def test_oracle_solves_dense_random_rule_values(name):
    env = make(f"driftbench/{name}-v1")
    for i, t in enumerate(random_rule_tasks(name, 60, 0)):
        assert t.rule_version == 0 and t.params["rules"] == t.params["shown_rules"]
        assert run_episode(env, OracleAgent(seed=i), t, seed=i)["success"]


def test_random_rules_cover_values_densely():
    d = get_domain("retail")
    rng = random.Random(0)
    windows = {d.random_rules(rng)["refund_window"] for _ in range(2000)}
    assert windows == set(range(7, 61))


@pytest.mark.parametrize("name", sorted(DOMAINS))
def test_splits_are_disjoint_by_facts_and_seeded(name):
    from dynamic_bench.tasks import split_of

    train, test = generate_tasks(name, 100, 0, "train"), generate_tasks(name, 100, 0, "test")
    assert {t.split for t in train} == {"train"} and {t.split for t in test} == {"test"}
    assert all(split_of(t.params) == "train" for t in train) and all(split_of(t.params) == "test" for t in test)
    assert generate_tasks(name, 5, 0) == generate_tasks(name, 5, 0) != generate_tasks(name, 5, 1)
    assert {t.persona for t in train} == set(PERSONAS)


def leaves(db: dict, keep, path: str = "") -> dict[str, object]:
    """The database's leaf values that `keep` accepts, by dotted path."""
    out = {}
    for k, v in db.items():
        if isinstance(v, dict):
            out |= leaves(v, keep, f"{path}{k}.")
        elif keep(v):
            out[path + k] = v
    return out


def numbers(db: dict) -> dict[str, int]:
    """The database's whole numbers, by dotted path."""
    return leaves(db, lambda v: isinstance(v, int) and not isinstance(v, bool))


def rule_sets(params: dict) -> list[dict]:
    """The rules in force for a task, the rules it is shown, and those in force before."""
    return [params["rules"], params["shown_rules"], *(r for _, r in params["prior_rules"])]


@pytest.mark.parametrize("name", sorted(DOMAINS))
def test_neighbour_tasks_move_each_fact_a_little_in_the_same_split_under_the_same_rules(name):
    from dynamic_bench.tasks import neighbour_tasks, split_of

    def tiers(db: dict) -> dict[str, str]:
        return leaves(db, lambda v: v in d.tiers)

    d = get_domain(name)
    moved, tier_kept, tier_swapped = Counter(), 0, 0
    for split in ("train", "test"):
        for task in generate_tasks(name, 20, 3, split, rule_version=2):
            near = neighbour_tasks(task, random.Random(task.id), 6)
            if not any(numbers(task.params["db"]).values()):  # no number to move (a zero stays zero) ...
                assert len(near) <= len(d.tiers) - 1  # ... so only the tier differs
                assert all(numbers(t.params["db"]) == numbers(task.params["db"]) and
                           tiers(t.params["db"]) != tiers(task.params["db"]) for t in near)
                continue
            assert 0 < len(near) <= 6 and len({t.id for t in near} | {task.id}) == len(near) + 1
            facts_of = [(numbers(t.params["db"]), tiers(t.params["db"])) for t in near]
            assert len({json.dumps(x, sort_keys=True) for x in facts_of}) == len(near)  # distinct facts ...
            assert (numbers(task.params["db"]), tiers(task.params["db"])) not in facts_of  # ... none the original's
            dbs = [n for n, _ in facts_of]
            for _, t in facts_of:  # the tier: kept, or swapped for another of the domain's tiers
                assert t.keys() == tiers(task.params["db"]).keys() and len(t) == 1
                tier_kept += t == tiers(task.params["db"])
                tier_swapped += t != tiers(task.params["db"])
            for t, facts in zip(near, dbs):
                assert t.split == split_of(t.params) == split and t.instruction == task.instruction
                assert {k: v for k, v in t.params.items() if k != "db"} == \
                       {k: v for k, v in task.params.items() if k != "db"}  # same request and rules
                writes, outcome = d.solve(t.params, t.params["rules"])
                assert t.gold_checks == {"outcome": outcome, "writes": [format_action(c) for c in writes]}
                for k, v in numbers(task.params["db"]).items():
                    assert abs(facts[k] - v) <= max(1, round(0.25 * abs(v))) and (facts[k] > 0) == (v > 0)
                    moved[k] += facts[k] != v
            assert neighbour_tasks(task, random.Random(task.id), 6) == near  # seeded
    assert all(moved.values())  # every fact is moved somewhere
    assert min(tier_kept, tier_swapped) > (tier_kept + tier_swapped) // 4  # about half each
    # around tasks whose answer the shift changed, some neighbours get another answer, and some one
    # that did not change (what a policy taught the new rule must still do)
    changed = [t for t in generate_tasks(name, 400, 0, rule_version=2)
               if not d.same_answer(t.params, d.versions[1], d.versions[2])]
    near = [neighbour_tasks(t, random.Random(0), 6) for t in changed]
    other_answer = sum(any(n.gold_checks["outcome"] != t.gold_checks["outcome"] for n in ns)
                       for t, ns in zip(changed, near))
    unchanged = sum(any(d.same_answer(n.params, d.versions[1], d.versions[2]) for n in ns) for ns in near)
    assert min(other_answer, unchanged) > len(changed) // 10


@pytest.mark.parametrize("name", sorted(DOMAINS))
def test_boundary_tasks_set_one_fact_on_a_threshold_or_one_past_it(name):
    from dynamic_bench.tasks import boundary_tasks, split_of

    def edge(params: dict, key: str, t: int) -> bool:
        """Whether the fact at dotted `key` set to `t` and to `t + 1` gets different answers under
        the rules in force, shown or in force before."""
        def solved(value: int) -> list:
            db = json.loads(json.dumps(params["db"]))
            *parents, leaf = key.split(".")
            node = db
            for part in parents:
                node = node[part]
            node[leaf] = value
            return [d.solve({**params, "db": db}, r) for r in rule_sets(params)]
        return solved(t) != solved(t + 1)

    d = get_domain(name)
    made, straddles = 0, 0
    for split in ("train", "test"):
        for task in generate_tasks(name, 30, 5, split, rule_version=2):
            p = task.params
            thresholds = {v for r in rule_sets(p) for v in r.values()
                          if isinstance(v, int) and not isinstance(v, bool) and v > 0}
            near = boundary_tasks(task, random.Random(task.id), 4)
            assert len(near) <= 4 and len({t.id for t in near} | {task.id}) == len(near) + 1
            assert boundary_tasks(task, random.Random(task.id), 4) == near  # seeded
            made += len(near)
            for t in near:
                assert t.split == split_of(t.params) == split
                assert {k: v for k, v in t.params.items() if k != "db"} == {k: v for k, v in p.items() if k != "db"}
                writes, outcome = d.solve(t.params, t.params["rules"])
                assert t.gold_checks == {"outcome": outcome, "writes": [format_action(c) for c in writes]}
                before, after = numbers(p["db"]), numbers(t.params["db"])
                moved = {k for k in before if after[k] != before[k]}
                assert len(moved) == 1  # one fact, onto a threshold near it or one past it
                (k,) = moved
                assert after[k] in thresholds | {x + 1 for x in thresholds}
                assert abs(after[k] - before[k]) <= max(1, round(0.25 * before[k])) + 1
                # a real edge: the fact on the threshold and one past it get different answers
                assert any(edge(p, k, x) for x in {after[k], after[k] - 1} & thresholds)
            facts = [json.dumps(t.params["db"], sort_keys=True) for t in near]
            assert len(set(facts)) == len(facts)
            # a threshold and one past it are the two sides of a rule: somewhere the answer differs
            by_fact = {json.dumps(numbers(t.params["db"]), sort_keys=True): t.gold_checks["outcome"] for t in near}
            straddles += len(set(by_fact.values())) > 1
    assert made > 10 and straddles > 0


@pytest.mark.parametrize("name", sorted(DOMAINS))
def test_changed_tasks_set_one_fact_inside_a_band_where_the_rules_changed_the_answer(name):
    from dynamic_bench.tasks import changed_tasks, old_rules_fail, split_of

    d = get_domain(name)
    assert all(changed_tasks(t, random.Random(0), 4) == [] for t in generate_tasks(name, 10, 5, rule_version=1))
    moved_paths, inside, made = set(), 0, 0
    for split in ("train", "test"):
        for task in generate_tasks(name, 30, 5, split, rule_version=2):
            p = task.params
            near = changed_tasks(task, random.Random(task.id), 4)
            assert changed_tasks(task, random.Random(task.id), 4) == near  # seeded
            # none where no fact can change the answer (an order not delivered is denied under any rules)
            assert len(near) <= 4 and len({json.dumps(t.params["db"], sort_keys=True) for t in near}) == len(near)
            made += len(near)
            thresholds = {v for r in rule_sets(p) for v in r.values() if isinstance(v, int) and not isinstance(v, bool)}
            for t in near:
                assert t.split == split_of(t.params) == split and t.id != task.id
                assert {k: v for k, v in t.params.items() if k != "db"} == {k: v for k, v in p.items() if k != "db"}
                writes, outcome = d.solve(t.params, t.params["rules"])
                assert t.gold_checks == {"outcome": outcome, "writes": [format_action(c) for c in writes]}
                before, after = numbers(p["db"]), numbers(t.params["db"])
                (k,) = {k for k in before if after[k] != before[k]}  # one fact
                moved_paths.add(k)
                assert old_rules_fail(t)  # acting on the rules before the shift gets it wrong
                inside += after[k] not in thresholds | {x + 1 for x in thresholds}  # not on an edge
    assert made > 100 and len(moved_paths) > 1 and inside > 20  # facts take turns; values fill the band, not its edges


def test_stale_agent_uses_first_version_tools_under_tool_drift():
    env = make("driftbench/telecom-v1")
    task = next(t for t in generate_tasks("telecom", 50, 0, rule_version=4) if t.params["kind"] == "suspend"
                and t.params["db"]["account"]["balance_due"] <= 100)
    res = run_episode(env, StaleAgent(seed=0), task, seed=0)
    assert not res["success"] and res["n_stale"] == 1 and "tool_drift" in res["violations"]
    assert any("deprecated; use set_line_status" in o for o in res["observations"])


def test_personas_decide_by_correctness_and_seed():
    right = {"tool": "refund", "correct": True, "action_text": "refund {}", "correct_write": "refund {}"}
    wrong = {"tool": "refund", "correct": False, "action_text": "exchange {}", "correct_write": "refund {}"}
    for p in PERSONAS.values():
        decisions = [p.decide(right, random.Random(i)) for i in range(200)]
        assert all(d.kind != "reject" for d in decisions)  # a right action is never refused
        assert all(d.action_text in (None, "refund {}") for d in decisions)
    careful = [PERSONAS["careful"].decide(wrong, random.Random(i)).kind for i in range(400)]
    assert 0.5 < careful.count("reject") / 400 < 0.7 and "approve" not in careful
    trusting = [PERSONAS["trusting"].decide(wrong, random.Random(i)).kind for i in range(400)]
    assert trusting.count("approve") > 250
    assert [PERSONAS["editor"].decide(wrong, random.Random(7)) for _ in range(1)] == [
        PERSONAS["editor"].decide(wrong, random.Random(7))]
    fixed = PERSONAS["editor"].decide({**wrong, "correct_write": None}, random.Random(1))
    assert fixed.kind in ("approve", "reject") and fixed.action_text is None


def test_dense_tasks_with_a_stale_shown_policy_come_with_their_hint():
    from dynamic_bench import rule_change_notes

    env = make("driftbench/retail-v1")
    tasks = random_rule_tasks("retail", 40, 1, shown_version=1)
    stale_hits = 0
    for i, t in enumerate(tasks):
        p = t.params
        assert p["shown_version"] == 1 and p["shown_rules"] == get_domain("retail").versions[1]
        notes = rule_change_notes("retail", p["shown_rules"], p["rules"])
        if p["rules"]["refund_window"] != 30:
            assert f"refund window is now {p['rules']['refund_window']} days" in notes
        assert run_episode(env, OracleAgent(seed=i), t, seed=i)["success"]
        stale = run_episode(env, StaleAgent(seed=i), t, seed=i)
        stale_hits += stale["n_stale"] > 0
    assert stale_hits > 0  # following the shown (old) policy is labelled stale
