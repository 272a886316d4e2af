"""The nightly cycle end to end on a real trajectory log (tiny policy, small stream).

Every stage runs for real: mining into the memory ledger, experience files, LoRA training with
`train_rl`, the paired gate on DriftBench, promotion through the runtime's policy registry,
consolidation. Crashes are real SIGKILLs of a cycle process, one in the middle of each stage.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter

import pytest

from evolve.cycle import FAULT_ENV, STAGES, CycleConfig, CycleState, dry_run, run_cycle

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def cfg_for(data_dir, policy, **kw) -> CycleConfig:
    base = dict(data_dir=str(data_dir), base_model=str(policy), preset="tiny", rl_steps=1, gate_tasks=4,
                groups_per_step=2, max_turns=4, consolidate_tasks=2, consolidate_fresh_tasks=4, distill_tasks=8, train_heldout_tasks=4,
                memory_rl_tasks=4, select_tasks=4, seed=0)
    return CycleConfig(**{**base, **kw})


def memory_view(data_dir) -> tuple[Counter, list]:
    """(tenant, kind, text, status) of every item; and the items themselves."""
    from memory import MemoryService

    mem = MemoryService(data_dir / "memory")
    try:
        items = [it for t in mem.ledger.tenants() for it in
                 mem.items(t, statuses=("candidate", "validated", "superseded", "retired"))]
    finally:
        mem.close()
    return Counter((it.tenant, it.kind, it.text, it.status) for it in items), items


def registry(data_dir):
    from runtime.policy_registry import PolicyRegistry

    return PolicyRegistry(data_dir)


@pytest.fixture(scope="module")
def clean_cycle(traffic, tiny_policy, tmp_path_factory):
    """One uninterrupted cycle on a copy of the logged traffic."""
    d = tmp_path_factory.mktemp("clean") / "service"
    shutil.copytree(traffic["data"], d)
    state = run_cycle(cfg_for(d, tiny_policy), log=lambda m: None)
    return d, state


def test_traffic_reached_the_ledger(traffic):
    from memory import MemoryService

    mem = MemoryService(traffic["data"] / "memory")
    try:
        trajs = mem.trajectories().trajectories
    finally:
        mem.close()
    assert len(trajs) == len(traffic["result"]["episodes"]) > 0
    assert all(t.tenant == "acme" and t.steps and t.steps[0].prompt_token_ids for t in trajs)


def test_dry_run_shows_the_plan_and_writes_nothing(data_dir, tiny_policy):
    plan = dry_run(cfg_for(data_dir, tiny_policy, dry_run=True))
    assert plan["trajectories_since_last_cycle"] > 0 and plan["lock"] == "free" and plan["serving"] == "base"
    assert not (data_dir / "cycles").exists()
    assert not (data_dir / "policies" / "registry.json").exists()


def test_cycle_runs_every_stage_and_reports(clean_cycle, tiny_policy):
    d, state = clean_cycle
    assert state.status == "done" and all(state.stages[s]["status"] == "done" for s in STAGES)
    assert state.stages["mine"]["output"]["trajectories"] > 0
    exp = state.stages["experience"]["output"]
    assert exp["distill_tasks"] == 8 and exp["distilled_rows"] + exp["anchor_rows"] == len(
        (d / "cycles" / state.cycle_id / "experience" / "distilled.jsonl").read_text().splitlines())
    tasks = [json.loads(x) for x in (d / "cycles" / state.cycle_id / "experience" / "tasks.jsonl").read_text().splitlines()]
    shown = [r for r in tasks if r.get("memory")]  # failed with memory recalled: RL plays them with it shown
    assert 0 < len(shown) == exp["memory_rl_tasks"] == state.stages["train"]["output"]["memory_rl_tasks"]
    assert not any(r["replay"] for r in shown)
    assert state.outcome in ("promoted", "rejected")
    folder = d / "cycles" / state.cycle_id
    for f in ("report.md", "report.json", "report.png", "state.json", "gate_eval.json"):
        assert (folder / f).stat().st_size > 0
    rep = json.loads((folder / "report.json").read_text())
    # with_memory: the tenant's stated rule (conftest.state_a_rule) is recalled, as the service serves
    assert set(rep["gate"]["slices"]) == {"current", "old_rules", "held_out", "with_memory"}
    n = {k: s["n"] for k, s in rep["gate"]["slices"].items()}
    assert n["current"] == n["held_out"] == n["with_memory"] == 4
    promoted = registry(d).current_version() != "base"
    assert promoted == (state.outcome == "promoted")


def test_training_scores_held_out_tasks_apart_from_the_gate(clean_cycle, tiny_policy):
    """The cycle's RL run scores held-out current- and old-rule tasks (its diagnosis needs them),
    drawn apart from the gate's tasks so the gate stays an unseen test."""
    from evolve.stages import gate_slices

    d, state = clean_cycle
    train = state.stages["train"]["output"]
    for name in ("current", "old_rules"):
        assert 0.0 <= train[f"heldout_{name}_first"] <= 1.0 and 0.0 <= train[f"heldout_{name}_last"] <= 1.0
    rows = [json.loads(x) for x in (d / "cycles" / state.cycle_id / "train" / "metrics.jsonl").read_text().splitlines()]
    assert "heldout_current" in rows[-1] and "heldout_old_rules" in rows[-1]
    for name in ("current", "old_rules"):  # "first" is the policy before any update
        assert train[f"heldout_{name}_first"] == rows[0][f"heldout_{name}_start"]
    assert train["diagnosis"] and all(line.startswith("- ") for line in train["diagnosis"])
    assert "## Training diagnosis" in (d / "cycles" / state.cycle_id / "report.md").read_text()
    contexts = json.loads((d / "cycles" / state.cycle_id / "experience" / "contexts.json").read_text())
    cfg = cfg_for(d, tiny_policy)
    gate = gate_slices(cfg, contexts)["current"]
    ev = json.loads((d / "cycles" / state.cycle_id / "gate_eval.json").read_text())
    assert ev["task_ids"]["current"] == [t.id for t in gate]  # the gate's evaluation names its tasks
    held = gate_slices(cfg, contexts, cfg.train_heldout_tasks, purpose="train-heldout")["current"]
    assert len(held) == cfg.train_heldout_tasks
    assert {t.id for t in held}.isdisjoint({t.id for t in gate})


def test_the_candidate_is_the_trained_adapter_at_the_scale_selection_chose(clean_cycle, tiny_policy):
    """Selection plays the adapter at each scale on tasks apart from the gate's; the registered
    candidate is the adapter at the chosen scale (lora_B scaled, lora_A as trained)."""
    import torch
    from safetensors.torch import load_file

    from evolve.stages import gate_slices

    d, state = clean_cycle
    train = state.stages["train"]["output"]
    sel = train["selection"]
    assert set(sel["scales"]) == {"1.0", "0.75", "0.5"} and train["selected_scale"] == sel["scale"]
    assert all(set(deltas) == set(sel["tasks"]) for deltas in sel["scales"].values())
    assert set(sel["passing"]) <= {1.0, 0.75, 0.5}
    folder = d / "cycles" / state.cycle_id
    contexts = json.loads((folder / "experience" / "contexts.json").read_text())
    chosen = gate_slices(cfg_for(d, tiny_policy), contexts, 4, purpose="select")["current"]
    assert {t.id for t in chosen}.isdisjoint(json.loads((folder / "gate_eval.json").read_text())["task_ids"]["current"])
    trained = load_file(str(folder / "train" / "adapter" / "adapter_model.safetensors"))
    served = load_file(str(registry(d).get(train["candidate"]).adapter_path) + "/adapter_model.safetensors")
    assert set(served) == set(trained)
    for k, t in trained.items():
        assert torch.allclose(served[k], t * sel["scale"] if "lora_B" in k else t)
    assert "## Candidate selection" in (folder / "report.md").read_text()


def test_the_memory_slice_shows_each_tenant_its_own_memory(data_dir, tiny_policy):
    """The gate's with-memory slice: test tasks under each tenant's latest rules, each shown what
    the runtime recalls from that tenant's memory and nothing of another tenant's."""
    from evolve.mining import rule_contexts
    from evolve.stages import memory_slice
    from memory import MemoryService
    from tests.evolve.conftest import RULE_NOTE

    mem = MemoryService(data_dir / "memory")
    try:
        trajs = mem.trajectories().trajectories
        other = [t.model_copy(update={"tenant": "other-co"}) for t in trajs[:4]]  # its latest context: v1
        other_note = "Gold members of other-co never pay return shipping on exchanges."
        mem.add("other-co", other_note, kind="task_experience")
        cfg = cfg_for(data_dir, tiny_policy)
        tasks, notes = memory_slice(cfg, mem, trajs + other, 8)
        again = memory_slice(cfg, mem, trajs + other, 8)
    finally:
        mem.close()
    assert len(tasks) == len(notes) == 8 and all(t.split == "test" for t in tasks)
    assert ([t.id for t in again[0]], again[1]) == ([t.id for t in tasks], notes)  # seeded
    for tenant, src, first in ((trajs[0].tenant, trajs, 0), ("other-co", other, 4)):
        latest = rule_contexts(src)[-1]
        mine = tasks[first:first + 4]  # tenants in sorted order: acme, then other-co
        assert all(t.params["rules"] == latest["rules"] and t.params["shown_rules"] == latest["shown_rules"]
                   for t in mine)
    assert all(RULE_NOTE in n and other_note not in n for n in notes[:4])
    assert all(other_note in n and RULE_NOTE not in n for n in notes[4:])


def test_next_cycle_with_nothing_new_changes_nothing(clean_cycle, tiny_policy, tmp_path):
    d = tmp_path / "service"
    shutil.copytree(clean_cycle[0], d)
    before = registry(d).describe()
    again = run_cycle(cfg_for(d, tiny_policy), log=lambda m: None)
    assert again.outcome == "nothing-to-learn" and again.stages["mine"]["output"]["trajectories"] == 0
    assert registry(d).describe()["versions"] == before["versions"]


RUN = """
import json, sys
from evolve.cycle import CycleConfig, run_cycle
run_cycle(CycleConfig(**json.loads(sys.argv[1])), log=lambda m: None)
"""


def test_cycle_killed_in_every_stage_finishes_like_an_uninterrupted_one(clean_cycle, data_dir, tiny_policy):
    args = json.dumps(cfg_for(data_dir, tiny_policy).__dict__)
    for stage in STAGES:
        p = subprocess.run([sys.executable, "-c", RUN, args], env={**os.environ, FAULT_ENV: stage},
                           capture_output=True, text=True, timeout=900)
        assert p.returncode == -9, p.stderr[-2000:]  # SIGKILL in the middle of `stage`
        state = CycleState.load(next((data_dir / "cycles").glob("cycle-*")) / "state.json")
        assert state.stages[stage]["status"] == "running"
    p = subprocess.run([sys.executable, "-c", RUN, args], capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-2000:]
    cycles = list((data_dir / "cycles").glob("cycle-*"))
    assert len(cycles) == 1
    state = CycleState.load(cycles[0] / "state.json")
    assert state.status == "done" and all(state.stages[s]["attempts"] == 2 for s in STAGES)
    clean_dir, clean = clean_cycle
    assert state.outcome == clean.outcome  # same seeds, same log: the crashes changed nothing
    reg, ref = registry(data_dir).describe(), registry(clean_dir).describe()
    assert [v["status"] for v in reg["versions"]] == [v["status"] for v in ref["versions"]]
    cand = state.stages["gate"]["output"]["candidate"]
    rec = next(v for v in reg["versions"] if v["version"] == cand)
    statuses = [h["status"] for h in rec["history"]]
    if state.outcome == "promoted":
        assert reg["promotions"] == [cand] and statuses.count("promoted") == 1
    else:
        assert reg["promotions"] == [] and statuses.count("rejected") == 1
    view, items = memory_view(data_dir)
    ref_view, _ = memory_view(clean_dir)
    assert view == ref_view and all(n == 1 for n in view.values())  # no duplicate memory
    for it in items:
        prov = [(p.trajectory_id, p.step, p.evidence) for p in it.provenance]
        assert len(prov) == len(set(prov))


def test_bad_candidate_is_rejected_and_nothing_changes(data_dir, tiny_policy):
    before_view, _ = memory_view(data_dir)
    state = run_cycle(cfg_for(data_dir, tiny_policy, corrupt_rewards=True), log=lambda m: None)
    gate = state.stages["gate"]["output"]
    assert state.stages["experience"]["output"]["corrupted"]
    assert state.outcome == "rejected", gate["reasons"]
    reg = registry(data_dir)
    assert reg.current_version() == "base" and reg.get(gate["candidate"]).status == "rejected"
    assert state.stages["consolidate"]["output"]["retired"] == 0
    view, _ = memory_view(data_dir)
    assert not any(k[3] == "retired" for k in view)
    assert {k for k in before_view} <= {k for k in view}  # nothing removed or retired


def test_cycle_promotes_a_better_adapter(competent, data_dir, tiny_policy):
    state = run_cycle(cfg_for(data_dir, tiny_policy, rl_steps=8, gate_tasks=16), log=lambda m: None)
    gate = state.stages["gate"]["output"]
    assert state.outcome == "promoted", gate["reasons"]
    cur = gate["gate"]["slices"]["current"]
    assert cur["candidate"] > cur["current"] and cur["p_better"] < 0.05
    reg = registry(data_dir)
    assert reg.current_version() == gate["candidate"]
    reg.roll_back(reason="test")
    assert reg.current_version() == "base"


def test_demo_cycle_settings_are_parsed_and_checked(tmp_path):
    """`evolve demo --cycle-set KEY=VALUE`: CycleConfig fields typed from JSON; a wrong key or type is a
    clear usage error before anything runs."""
    import re

    from typer.testing import CliRunner

    from evolve.cli import app
    from evolve.commands import cycle_overrides

    assert cycle_overrides(["distill_focus=true", "distill_anchor_ratio=4", "distill_neighbours=4",
                            "domain=telecom", 'tenants=["a"]']) == {
        "distill_focus": True, "distill_anchor_ratio": 4.0, "distill_neighbours": 4, "domain": "telecom",
        "tenants": ("a",)}
    for bad, why in (("nope=1", "KEY one of"), ("distill_focus", "KEY one of"), ("distill_focus=3", "takes a bool"),
                     ("rl_steps=1.5", "takes a int")):
        with pytest.raises(ValueError, match=why):
            cycle_overrides([bad])
    out = tmp_path / "demo"
    r = CliRunner().invoke(app, ["demo", "--out", str(out), "--cycle-set", "distill_focus=maybe"])
    text = " ".join(re.sub(r"[│╭╮╰╯─]", " ", r.output).split())  # typer draws the message in a box
    assert r.exit_code == 2 and "distill_focus takes a bool" in text and not out.exists()


def test_cycle_command_defaults_are_the_config_defaults():
    """`evolve cycle`'s options start where CycleConfig does, so the CLI and the library run one cycle."""
    import inspect

    from evolve.commands import cycle

    defaults = CycleConfig()
    options = {k: p.default.default for k, p in inspect.signature(cycle).parameters.items()}
    shared = {k: str(v) if k == "data_dir" else v for k, v in options.items() if hasattr(defaults, k)}
    assert {"distill_focus", "distill_neighbours", "distill_boundary", "distill_changed",
            "consolidate_neighbours", "consolidate_fresh_tasks",
            "gate_tasks", "rl_steps"} <= set(shared)
    assert shared == {k: getattr(defaults, k) for k in shared}
