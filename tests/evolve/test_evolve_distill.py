"""Memory distillation (evolve.distill): fresh tasks under each tenant's latest rules, played by the
serving policy with and without the tenant's memory; what only memory solves becomes SFT rows."""
from __future__ import annotations

import pytest

from tests.evolve.test_evolve_cycle import cfg_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _window(data_dir):
    from memory import MemoryService

    mem = MemoryService(data_dir / "memory")
    return mem, mem.trajectories().trajectories


def test_tasks_are_fresh_train_tasks_under_each_tenants_latest_rules(data_dir, tiny_policy):
    from evolve.mining import rule_contexts
    from evolve.stages import gate_slices, tenant_tasks

    mem, trajs = _window(data_dir)
    mem.close()
    cfg = cfg_for(data_dir, tiny_policy)
    other = [t.model_copy(update={"tenant": "other-co"}) for t in trajs[:4]]  # its latest context: v1
    per = tenant_tasks(cfg, trajs + other, 12, purpose="distill", split="train")
    assert set(per) == {trajs[0].tenant, "other-co"} and all(len(ts) == 6 for ts in per.values())
    for tenant, src in ((trajs[0].tenant, trajs), ("other-co", other)):
        latest = rule_contexts(src)[-1]
        assert all(t.params["rules"] == latest["rules"] and t.params["shown_rules"] == latest["shown_rules"]
                   for t in per[tenant])
        assert all(t.split == "train" for t in per[tenant])  # the gate draws from test
    gate = gate_slices(cfg, rule_contexts(trajs))["current"]
    assert {t.id for t in per[trajs[0].tenant]}.isdisjoint({t.id for t in gate})
    assert [t.id for t in tenant_tasks(cfg, trajs + other, 12, "distill", "train")[trajs[0].tenant]] == [t.id for t in per[trajs[0].tenant]]


def test_rows_are_the_memory_free_steps_of_tasks_only_memory_solved(data_dir, tiny_policy):
    from evolve.distill import memory_distillation
    from runtime.scaffolds import without_memory
    from training.policy import load_tokenizer

    mem, trajs = _window(data_dir)
    cfg = cfg_for(data_dir, tiny_policy, memory_rl_tasks=3)
    try:
        rows, stats = memory_distillation(cfg, mem, trajs, (None, "base"), 8)
        again, stats_again = memory_distillation(cfg, mem, trajs, (None, "base"), 8)
        cfg.distill_neighbours, cfg.distill_boundary, cfg.distill_changed = 2, 1, 1
        _, near = memory_distillation(cfg, mem, trajs, (None, "base"), 8)
    finally:
        mem.close()
    # neighbours (boundary and changed tasks among them) are played after the tasks, counted apart, listed first
    assert near["neighbour_tasks"] <= 4 * stats["memory_made_the_difference"]
    assert len(near["outcomes"]) == 8 + near["neighbour_tasks"]
    assert [o.get("neighbour", False) for o in near["outcomes"]] == [True] * near["neighbour_tasks"] + [False] * 8
    assert near["outcomes"][near["neighbour_tasks"]:] == stats["outcomes"]
    keys = ("distill_tasks", "with_memory", "without_memory", "memory_made_the_difference")
    assert [near[k] for k in keys] == [stats[k] for k in keys]
    assert stats["distill_tasks"] == 8 and (rows, stats) == (again, stats_again)  # greedy and seeded
    outcomes = stats["outcomes"]
    assert len(outcomes) == 8 and stats["with_memory"] == sum(o["with_memory"] for o in outcomes)
    only_memory = {o["task_id"] for o in outcomes if o["with_memory"] and not o["without_memory"]}
    assert {r["task_id"] for r in rows} == only_memory
    assert stats["memory_made_the_difference"] == len(only_memory)
    # tasks failed although memory was recalled for them go to RL with their notes, at most `memory_rl_tasks`
    failed = {o["task_id"] for o in outcomes if not o["with_memory"]}
    # the rule the tenant stated (conftest.state_a_rule) is recalled for every request
    assert failed and len(stats["memory_rl"]) == min(3, len(failed))
    assert {r["task"]["id"] for r in stats["memory_rl"]} <= failed and all(r["memory"] for r in stats["memory_rl"])
    tok = load_tokenizer(tiny_policy)
    for r in rows:  # the memory section is emptied: there is nothing left to strip
        assert without_memory(tok, r["prompt_token_ids"]) is None and r["completion_token_ids"]


def test_only_tasks_memory_solved_alone_become_rows_without_their_memory(tiny_policy):
    """The selection on real rollouts with a memory note in the prompt, verdicts set per task: the
    tiny policy solves nothing, so the four combinations of (with, without) are given."""
    from dynamic_bench import generate_tasks
    from evolve.distill import distilled_rows, first_decision
    from runtime.scaffolds import without_memory
    from training.engines import make_engine
    from training.rollout import RolloutConfig, rollout

    tasks = generate_tasks("retail", 4, seed=11)
    e = make_engine(f"torch:{tiny_policy}", seed=0)
    try:
        rc = RolloutConfig(temperature=0.0, max_steps=2, seed=1)
        notes = [["Refunds now only within 20 days of delivery."]] * 4
        with_mem, bare = rollout(e, e.tokenizer, tasks, rc, memory=notes), rollout(e, e.tokenizer, tasks, rc)
        tok = e.tokenizer
    finally:
        e.close()
    verdict = [("success", "failure"), ("success", "success"), ("failure", "failure"), ("failure", "success")]
    with_mem = [t.model_copy(update={"outcome": v[0]}) for t, v in zip(with_mem, verdict)]
    bare = [t.model_copy(update={"outcome": v[1]}) for t, v in zip(bare, verdict)]
    assert len(with_mem[0].steps) == 2 and with_mem[0].steps[0].completion_token_ids
    # the memory-free run took the same first action and another second one
    same_first = bare[0].steps[0].model_copy(update={"action_text": with_mem[0].steps[0].action_text})
    other_second = bare[0].steps[1].model_copy(update={"action_text": with_mem[0].steps[1].action_text + " x"})
    bare[0] = bare[0].model_copy(update={"steps": [same_first, other_second]})
    # task 1 (solved without memory) read first; task 3's first action is not a read
    assert len(bare[1].steps) == 2
    read_first = bare[1].steps[0].model_copy(update={"action": {"name": "get_order", "args": {}}})
    bare[1] = bare[1].model_copy(update={"steps": [read_first, *bare[1].steps[1:]]})
    reads = [{"get_order", "get_customer"}] * 4
    for focus in (False, True):  # every step, or (focused, with `reads`) from the first changed action on
        rows, outcomes = distilled_rows(with_mem, bare, tok, reads=reads if focus else None)
        assert [(o["with_memory"], o["without_memory"]) for o in outcomes] == [(1, 0), (1, 1), (0, 0), (0, 1)]
        solved = with_mem[0].steps[focus:]
        assert [r["task_id"] for r in rows] == [tasks[0].id] * len(solved)
        for r, s in zip(rows, solved, strict=True):
            assert without_memory(tok, s.prompt_token_ids) is not None  # the note was in the prompt ...
            assert r["prompt_token_ids"] == without_memory(tok, s.prompt_token_ids)  # ... and is emptied
            assert r["completion_token_ids"] == s.completion_token_ids
        assert tok.decode(rows[0]["prompt_token_ids"]).count("Refunds now only") == 0
        assert not any(r.get("anchor") for r in rows)
        # anchors: tasks already solved without memory (1 and 3), their own memory-free steps (focused:
        # from the first that is not a read), so many tasks per distilled task
        for ratio, anchor_tasks in ((1.0, [1]), (2.0, [1, 3]), (5.0, [1, 3])):
            with_anchors, _ = distilled_rows(with_mem, bare, tok, anchor_ratio=ratio, reads=reads if focus else None)
            assert with_anchors[:len(rows)] == rows
            extra = with_anchors[len(rows):]
            assert all(r["anchor"] for r in extra)
            want = [(s.prompt_token_ids, s.completion_token_ids) for i in anchor_tasks
                    for s in bare[i].steps[(focus and i == 1):]]
            assert [(r["prompt_token_ids"], r["completion_token_ids"]) for r in extra] == want
        # memory anchors: tasks solved with the recalled note (0 and 1), their steps with the note still
        # shown (focused: from the first that is not a read), so many tasks per distilled task, after the anchors
        for ratio, kept in ((1.0, [0]), (2.0, [0, 1]), (5.0, [0, 1])):
            with_mem_anchors, _ = distilled_rows(with_mem, bare, tok, anchor_ratio=1.0, reads=reads if focus else None,
                                                 memory_anchor_ratio=ratio)
            extra = [r for r in with_mem_anchors if r.get("with_memory")]
            assert with_mem_anchors[:len(with_mem_anchors) - len(extra)] == distilled_rows(
                with_mem, bare, tok, anchor_ratio=1.0, reads=reads if focus else None)[0]
            want = [(s.prompt_token_ids, s.completion_token_ids) for i in kept
                    for s in with_mem[i].steps[first_decision(with_mem[i], reads[i]) if focus else 0:]]
            assert want and [(r["prompt_token_ids"], r["completion_token_ids"]) for r in extra] == want
            assert all(r["anchor"] and tok.decode(r["prompt_token_ids"]).count("Refunds now only") == 1 for r in extra)


def test_anchor_decisions_start_after_the_reads():
    """`first_decision` on hand-made runs, and `read_tools` from the domain's specs."""
    from dynamic_bench import generate_tasks
    from dynamic_bench.schema import Trajectory
    from evolve.distill import first_decision, read_tools

    def run(*names):
        steps = [{"index": i, "action": n and {"name": n, "args": {}}} for i, n in enumerate(names)]
        return Trajectory.model_validate({"task_id": "t", "steps": steps})

    reads = read_tools("retail", generate_tasks("retail", 1, seed=0)[0])
    assert {"get_order", "get_customer"} <= reads and not reads & {"refund", "escalate", "issue_coupon"}
    assert first_decision(run("get_order", "get_customer", "refund", "reply"), reads) == 2
    assert first_decision(run("get_order", "reply"), reads) == 1
    assert first_decision(run("get_order", None, "refund"), reads) == 1  # unparsable: the policy's own choice
    assert first_decision(run("get_order"), reads) == 1


def test_rows_start_at_the_first_action_memory_changed():
    """`first_divergence` on hand-made runs: the first differing action, else the shorter length."""
    from dynamic_bench.schema import Trajectory
    from evolve.distill import first_divergence

    def run(*actions):
        steps = [{"index": i, "action_text": a} for i, a in enumerate(actions)]
        return Trajectory.model_validate({"task_id": "t", "steps": steps})

    assert first_divergence(run("a", "b", "c"), run("a", "x", "c")) == 1
    assert first_divergence(run("x", "b"), run("a", "b")) == 0
    assert first_divergence(run("a", "b", "c"), run("a", "b")) == 2
    assert first_divergence(run("a"), run("a")) == 1


def test_neighbours_come_only_from_tasks_memory_solved_alone_with_their_tenant():
    """`neighbours_of_distilled` on hand-made verdicts: so many neighbours of each (with, without)
    = (success, failure) task, under that task's tenant, seeded."""
    from dynamic_bench import generate_tasks
    from dynamic_bench.schema import Trajectory
    from evolve.distill import neighbours_of_distilled

    tasks = [(f"co-{i}", t) for i, t in enumerate(generate_tasks("retail", 4, seed=7, rule_version=2))]
    verdict = [("success", "failure"), ("success", "success"), ("failure", "failure"), ("success", "failure")]
    runs = [[Trajectory(task_id=t.id, outcome=v[j]) for (_, t), v in zip(tasks, verdict)] for j in (0, 1)]
    near = neighbours_of_distilled(tasks, *runs, 3, seed=0)
    assert [tenant for tenant, _ in near] == ["co-0"] * 3 + ["co-3"] * 3
    facts = lambda t: t.params["db"]["orders"][t.params["order_id"]]  # noqa: E731
    for tenant, t in near:
        src = dict(tasks)[tenant]
        assert t.params["order_id"] == src.params["order_id"] and t.params["rules"] == src.params["rules"]
        assert abs(facts(t)["days"] - facts(src)["days"]) <= max(1, round(0.25 * facts(src)["days"]))
    assert neighbours_of_distilled(tasks, *runs, 3, seed=0) == near
    assert [t.id for _, t in neighbours_of_distilled(tasks, *runs, 3, seed=1)] != [t.id for _, t in near]
    assert neighbours_of_distilled(tasks, runs[0], runs[0], 3, seed=0) == []  # all solved without memory
