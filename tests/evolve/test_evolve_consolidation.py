"""Consolidation retires exactly the items the policy handles without memory, and says why."""
from __future__ import annotations

import json

import pytest

from evolve.consolidation import KINDS, candidates, consolidate
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
