"""Consolidation retires exactly the items the policy handles without memory, and says why."""
from __future__ import annotations

import json

import pytest

from evolve.consolidation import KINDS, consolidate
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
