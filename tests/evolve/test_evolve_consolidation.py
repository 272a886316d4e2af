"""Consolidation retires exactly the items the policy handles without memory, and says why."""
from __future__ import annotations

import json

import pytest

from evolve.consolidation import KINDS, ablate, candidates, consolidate, retire_reason
from evolve.cycle import CycleConfig
from evolve.mining import mine_items

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def test_consolidation_retires_only_items_the_policy_handles(competent, data_dir, tiny_policy, tmp_path):
    from memory import MemoryService

    mem = MemoryService(data_dir / "memory")
    try:
        trajs = mem.trajectories().trajectories
        mem.add_many(mine_items(trajs, "cycle-test"))
        before = {it.id: it for it in mem.items("acme")}
        cfg = CycleConfig(data_dir=str(data_dir), base_model=str(tiny_policy), preset="tiny", max_turns=6,
                          consolidate_tasks=2)
        # The cold-start policy plays the part of the promoted one: it handles what it already knew.
        out = consolidate(cfg, mem, None, "base", tmp_path, {"acme"})
        plan = json.loads((tmp_path / "consolidation.json").read_text())
        retired = [d for d in plan["decisions"] if d["retire"]]
        kept = [d for d in plan["decisions"] if not d["retire"]]
        assert retired and kept, out
        assert out["retired"] == len(retired) and out["kept"] == len(kept)
        for d in retired:  # handled: every one of its tasks succeeded without memory
            assert d["successes_without_memory"] == len(d["tasks"])
            it = mem.get(d["item_id"], "acme")
            assert it.status == "retired" and "handled without memory by policy base" in it.status_reason
        for d in kept:  # not handled: still retrievable
            assert d["successes_without_memory"] < len(d["tasks"])
            assert mem.get(d["item_id"], "acme").status in ("candidate", "validated")
        # items outside the policy's competence (user preferences) are never considered
        considered = {d["item_id"] for d in plan["decisions"]}
        for iid, it in before.items():
            if it.kind not in KINDS:
                assert iid not in considered and mem.get(iid, "acme").status == it.status
        # a rerun (a resumed cycle) retires nothing twice
        again = consolidate(cfg, mem, None, "base", tmp_path, {"acme"})
        assert again["retired_now"] == 0 and again["retired"] == len(retired)
        assert 0.0 <= out["success_without_memory"] <= 1.0 and 0.0 <= out["success_with_memory"] <= 1.0
    finally:
        mem.close()


def test_each_item_is_judged_on_its_tasks_and_tasks_around_them(tmp_path):
    from dynamic_bench import generate_tasks
    from dynamic_bench.schema import Trajectory
    from memory import MemoryService
    from memory.models import Provenance

    mem = MemoryService(tmp_path / "memory")
    try:
        tasks = generate_tasks("retail", 3, seed=4, split="train")
        trajs = [Trajectory(task_id=t.id, tenant="acme", outcome="success", reward=1.0,
                            metadata={"world": {"world": "driftbench/retail-v1", "task_json": t.model_dump_json()}})
                 for t in tasks]
        for t in trajs:
            mem.record_trajectory(t)
        mem.add("acme", "refunds over 150 must be escalated", kind="task_experience",
                provenance=[Provenance(trajectory_id=trajs[0].id), Provenance(trajectory_id=trajs[1].id)])
        mem.add("acme", "look the order up before any write", kind="strategy",
                provenance=[Provenance(trajectory_id=trajs[2].id)])
        plain = candidates(mem, {"acme"}, 2)
        near = candidates(mem, {"acme"}, 2, neighbours=3, seed=7)
        assert sorted(len(c["tasks"]) for c in plain) == [1, 2]
        assert [c["item"].id for c in near] == [c["item"].id for c in plain]
        for p, c in zip(plain, near):
            own, extra = c["tasks"][:len(p["tasks"])], c["tasks"][len(p["tasks"]):]
            assert p["neighbours"] == 0 and [t.id for t in own] == [t.id for t in p["tasks"]]
            assert c["neighbours"] == len(extra) == 3 * len(own)
            for t in extra:  # the same case: request, rules and split of one of the item's tasks, other facts
                twin = [o for o in own if o.instruction == t.instruction and o.split == t.split
                        and o.params["rules"] == t.params["rules"]]
                assert twin and all(o.params["db"] != t.params["db"] for o in twin)
        again = candidates(mem, {"acme"}, 2, neighbours=3, seed=7)
        assert [[t.params for t in c["tasks"]] for c in again] == [[t.params for t in c["tasks"]] for c in near]
        other = candidates(mem, {"acme"}, 2, neighbours=3, seed=8)
        assert [[t.params for t in c["tasks"]] for c in other] != [[t.params for t in c["tasks"]] for c in near]
        assert candidates(mem, {"other-tenant"}, 2, neighbours=3) == []
    finally:
        mem.close()


def test_ablation_retires_notes_the_policy_does_better_or_as_well_without_and_keeps_needed_ones():
    """`ablate` on hand-made recall lists and outcomes: a policy that is misled by note A (it fails
    the tasks A is shown for), needs B (task 4 only succeeds with B shown), is indifferent to C,
    needs one of the two equal notes E and F, and fails the tasks of G with or without it."""
    from memory.models import MemoryItem

    items = {n: MemoryItem(tenant="t", text=f"note {n}", created_at=i) for i, n in enumerate("ABCDEFG")}
    ids = {it.id: n for n, it in items.items()}
    hits = [list(map(items.get, ks)) for ks in ("AC", "AC", "AC", "C", "BA", "EF", "EF", "G", "G")]

    def play(out: set[str]) -> list[int]:
        shown = [{ids[i.id] for i in xs} for xs in [[i for i in hs if i.id not in out][:2] for hs in hits]]
        ok = [("A" not in s) for s in shown[:4]] + ["B" in s for s in shown[4:5]]
        return [int(x) for x in ok] + [int(bool({"E", "F"} & s)) for s in shown[5:7]] + [0, 0]

    decisions, before, after = ablate(hits, 2, list(items.values()), play, set(), 0.8)
    verdict = {ids[d["item_id"]]: d["retire"] for d in decisions}
    # D is recalled for no task: not judged; A misleads, C is inert and handled, E is redundant with F
    assert verdict == {"A": True, "B": False, "C": True, "E": True, "F": False, "G": False}
    assert sum(before) == 4 and sum(after) == 7  # A gone: tasks 0-2 succeed too; B and F kept
    a = next(d for d in decisions if ids[d["item_id"]] == "A")
    assert (a["successes_with_item"], a["successes_without_item"], a["recalled_for"]) == (4, 7, 4)
    g = next(d for d in decisions if ids[d["item_id"]] == "G")
    assert g["successes_without_item"] == g["successes_with_item"] and g["success_without_item_where_recalled"] == 0
    # items already gone are neither judged nor shown
    decisions, before, _ = ablate(hits, 2, list(items.values()), play, {items["A"].id}, 0.8)
    assert "A" not in {ids[d["item_id"]] for d in decisions} and sum(before) == 7


def test_ablation_retires_notes_together_when_each_alone_is_missed_but_none_are_needed():
    """A policy that succeeds with each task's notes all shown or none, and fails with some of them:
    one at a time keeps every note; all together are retired, with the outcomes without them. And
    where one at a time ends better than none at all, its decisions stand."""
    from memory.models import MemoryItem

    items = {n: MemoryItem(tenant="t", text=f"note {n}", created_at=i) for i, n in enumerate("PQRS")}
    hits = [list(map(items.get, ks)) for ks in ("PQ", "PQ", "QR", "QR", "")]
    calls: list[set[str]] = []

    def play(out: set[str]) -> list[int]:
        calls.append(set(out))
        shown = [[i for i in hs if i.id not in out][:2] for hs in hits]
        return [int(len(s) in (0, len(hs))) for s, hs in zip(shown, hits)]

    decisions, before, after = ablate(hits, 2, list(items.values()), play, set(), 0.8)
    assert {d["text"] for d in decisions} == {"note P", "note Q", "note R"}  # S is recalled for no task
    assert all(d["retire"] and d["together"] == 3 for d in decisions)
    assert before == after == [1] * 5 and len(calls) == 5  # with memory, without the three, without each
    q = next(d for d in decisions if d["text"] == "note Q")
    assert (q["recalled_for"], q["successes_with_item"], q["successes_without_item"]) == (4, 5, 5)
    assert "and the 2 others retired with it" in retire_reason({**q, "fresh_tasks": 5}, "v-1")
    # a note one task cannot do without: not all together; one at a time keeps every note here
    hits[4] = [items["S"]]

    def play_needing_s(out: set[str]) -> list[int]:
        return play(out)[:4] + [int(items["S"].id not in out)]

    decisions, before, after = ablate(hits, 2, list(items.values()), play_needing_s, set(), 0.8)
    assert not any(d["retire"] for d in decisions) and before == after
    assert all("together" not in d for d in decisions)
    # ten tasks shown P and Q: 8 successes with both, 9 with Q only, 7 with P only, 8 with neither
    hits = [[items["P"], items["Q"]]] * 10

    def play_best_with_q(out: set[str]) -> list[int]:
        n = {(True, True): 8, (False, True): 9, (True, False): 7, (False, False): 8}[
            (items["P"].id not in out, items["Q"].id not in out)]
        return [1] * n + [0] * (10 - n)

    decisions, before, after = ablate(hits, 2, list(items.values()), play_best_with_q, set(), 0.8)
    assert {d["text"]: d["retire"] for d in decisions} == {"note P": True, "note Q": False}
    assert (sum(before), sum(after)) == (8, 9) and all("together" not in d for d in decisions)


def test_consolidation_on_fresh_tasks_keeps_notes_a_failing_policy_cannot_do_without(data_dir, tiny_policy, tmp_path):
    """The second test end to end (real recall, real rollouts): the tiny policy fails the fresh
    tasks with and without memory, so it retires nothing there; every live item recalled for a
    fresh task gets a decision saying so, and a rerun reads the saved plan."""
    from dynamic_bench import generate_tasks
    from memory import MemoryService

    mem = MemoryService(data_dir / "memory")
    try:
        cfg = CycleConfig(data_dir=str(data_dir), base_model=str(tiny_policy), preset="tiny", max_turns=4,
                          consolidate_tasks=1, consolidate_neighbours=0)
        fresh = {"acme": generate_tasks("retail", 6, seed=3, split="train", rule_version=2)}
        out = consolidate(cfg, mem, None, "base", tmp_path, {"acme"}, fresh=fresh)
        plan = json.loads((tmp_path / "consolidation.json").read_text())
        second = [d for d in plan["decisions"] if d.get("test") == "not needed"]
        assert second, plan  # the stated rule is recalled for refund requests
        for d in second:
            assert d["tenant"] == "acme" and d["fresh_tasks"] == 6 and d["recalled_for"] >= 1
            if d["success_without_item_where_recalled"] < cfg.consolidate_min_success:
                assert not d["retire"] and mem.get(d["item_id"], "acme").status in ("candidate", "validated")
        assert out["fresh_tasks"] == 6 and out["retired_not_needed"] == sum(d["retire"] for d in second)
        assert out["fresh_success_with_memory_consolidated"] >= out["fresh_success_with_memory"]  # no loss allowed
        again = consolidate(cfg, mem, None, "base", tmp_path, {"acme"}, fresh=fresh)
        assert again["retired_now"] == 0 and again["retired"] == out["retired"]
    finally:
        mem.close()
