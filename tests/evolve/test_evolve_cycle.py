"""The nightly cycle end to end on a real trajectory log (tiny policy, small stream).

Every stage runs for real: mining into the memory ledger, experience files, LoRA training with
`train_rl`, the paired gate on DriftBench, promotion through the runtime's policy registry,
consolidation. Crashes are real SIGKILLs of a cycle process.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest

from evolve.cycle import FAULT_ENV, STAGES, CycleConfig, CycleState, dry_run, run_cycle

pytestmark = pytest.mark.slow


def cfg_for(data_dir, policy, **kw) -> CycleConfig:
    base = dict(data_dir=str(data_dir), base_model=str(policy), preset="tiny", rl_steps=6, gate_tasks=16,
                groups_per_step=4, max_turns=6, seed=0)
    return CycleConfig(**{**base, **kw})


def live_items(data_dir):
    from memory import MemoryService

    mem = MemoryService(data_dir / "memory")
    try:
        return [it for t in mem.ledger.tenants() for it in mem.items(t)], \
               [it for t in mem.ledger.tenants() for it in mem.items(t, statuses=("retired",))]
    finally:
        mem.close()


def registry(data_dir):
    from runtime.policy_registry import PolicyRegistry

    return PolicyRegistry(data_dir)


def test_traffic_reached_the_ledger(traffic):
    from memory import MemoryService

    mem = MemoryService(traffic["data"] / "memory")
    try:
        trajs = mem.trajectories().trajectories
    finally:
        mem.close()
    assert len(trajs) == len(traffic["result"]["episodes"])
    assert sum(len(t.feedback) for t in trajs) > 0
    assert all(t.steps and t.steps[0].prompt_token_ids for t in trajs)


def test_dry_run_shows_the_plan_and_writes_nothing(data_dir, tiny_policy):
    plan = dry_run(cfg_for(data_dir, tiny_policy, dry_run=True))
    assert plan["trajectories_since_last_cycle"] > 0 and plan["would_mine_items"] > 0
    assert plan["serving"] == "base" and plan["lock"] == "free"
    assert not (data_dir / "cycles").exists()
    assert not (data_dir / "policies" / "registry.json").exists()


def test_cycle_promotes_a_better_adapter(data_dir, tiny_policy):
    state = run_cycle(cfg_for(data_dir, tiny_policy), log=lambda m: None)
    assert state.status == "done"
    gate = state.stages["gate"]["output"]
    assert state.outcome == "promoted", gate["reasons"]
    cur = gate["gate"]["slices"]["current"]
    assert cur["candidate"] > cur["current"] and cur["p_better"] < 0.05
    reg = registry(data_dir)
    assert reg.current_version() == gate["candidate"]
    folder = data_dir / "cycles" / state.cycle_id
    for f in ("report.md", "report.json", "report.png", "state.json"):
        assert (folder / f).stat().st_size > 0
    # the next cycle has nothing new to mine: it trains nothing and changes nothing
    again = run_cycle(cfg_for(data_dir, tiny_policy), log=lambda m: None)
    assert again.outcome == "nothing-to-learn" and again.stages["mine"]["output"]["trajectories"] == 0
    assert reg.current_version() == gate["candidate"]
    # and a promotion can be rolled back
    reg.roll_back(reason="test")
    assert reg.current_version() == "base"


def test_bad_candidate_is_rejected_and_nothing_changes(data_dir, tiny_policy):
    state = run_cycle(cfg_for(data_dir, tiny_policy, corrupt_rewards=True), log=lambda m: None)
    gate = state.stages["gate"]["output"]
    assert state.outcome == "rejected", gate["reasons"]
    reg = registry(data_dir)
    assert reg.current_version() == "base"
    assert reg.get(gate["candidate"]).status == "rejected"
    assert state.stages["consolidate"]["output"]["retired"] == 0
    assert live_items(data_dir)[1] == []


RUN = """
import json, sys
from evolve.cycle import CycleConfig, run_cycle
run_cycle(CycleConfig(**json.loads(sys.argv[1])))
"""


def test_cycle_killed_at_every_stage_finishes_once(data_dir, tiny_policy):
    cfg = cfg_for(data_dir, tiny_policy)
    args = json.dumps({k: v for k, v in cfg.__dict__.items()})
    killed = []
    for stage in STAGES:
        p = subprocess.run([sys.executable, "-c", RUN, args], env={**os.environ, FAULT_ENV: stage},
                           capture_output=True, text=True, timeout=600)
        assert p.returncode == -9, p.stderr[-2000:]  # SIGKILL, mid-stage
        state = CycleState.load(next((data_dir / "cycles").glob("cycle-*")) / "state.json")
        assert state.stages[stage]["status"] == "running"
        killed.append(stage)
    p = subprocess.run([sys.executable, "-c", RUN, args], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    cycles = list((data_dir / "cycles").glob("cycle-*"))
    assert len(cycles) == 1
    state = CycleState.load(cycles[0] / "state.json")
    assert state.status == "done" and killed == list(STAGES)
    assert all(state.stages[s]["attempts"] == 2 for s in STAGES)
    assert state.outcome == "promoted", state.stages["gate"]["output"]["reasons"]
    reg = registry(data_dir).describe()
    assert reg["promotions"] == [state.stages["gate"]["output"]["candidate"]]
    rec = next(v for v in reg["versions"] if v["version"] == reg["current"])
    assert [h["status"] for h in rec["history"]].count("promoted") == 1
    live, retired = live_items(data_dir)
    keys = Counter((it.tenant, it.kind, it.text) for it in live + retired)
    assert keys and max(keys.values()) == 1, [k for k, n in keys.items() if n > 1]
    for it in live + retired:
        prov = [(p.trajectory_id, p.step, p.evidence) for p in it.provenance]
        assert len(prov) == len(set(prov))
    assert len(retired) == state.stages["consolidate"]["output"]["retired"]
