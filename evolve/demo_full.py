"""The full demo: service + simulated users + memory online + one evolve cycle, three arms.

    stream (silent shift at 25%)      ─ static arm: the cold-start policy, no memory (in process)
    episodes [0, c) over HTTP         ─ memory arm (shared by both memory arms up to the cycle)
    evolve cycle at c (mine → train → gate → promote → consolidate)
    episodes [c, N) over HTTP twice   ─ memory only (a copy of the data folder, no cycle)
                                      ─ memory + evolve (the promoted policy, consolidated memory)
    plus: the promoted policy with no memory on the same post-cycle tasks (in process)
    plus: every policy, with and without its memory, on fresh tasks under the latest rules (in process)
"""
from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from evolve.demo import DemoConfig, arm_metrics, recovery_text
from evolve.report import md_table, plot_arms, write_json

TOKENS = "demo-token-0001=demo"
SIZES = {  # episodes, cycle point, supervised warm-up epochs, RL steps, learning rate, logged rows per step,
    # exploration, gate tasks per slice, fresh tasks for memory distillation, training held-out tasks per
    # slice, tasks per slice choosing the adapter's scale, fresh tasks after the cycle, fresh tasks for
    # consolidation's "not needed" test. Small: warm-up 2 and 8 RL steps (12-13 min on 2 cores, of which that
    # test ~70 s; the warm-up ~140 s since its batches hold whole episodes, 488 s before):
    # seeds 0-2 promoted with 0-1.5 points of old-rule forgetting, and without memory -1.5 / +1.0 / -4.5 points
    # from the memory arm on 200 fresh tasks (-1.5 / +3.0 / -1.0 with turns shuffled one by one); with 2 boundary
    # tasks in distillation (CycleConfig.distill_boundary) seeds 0 and 2 +1.0 / -1.0 (seed 1 not rerun); with 2 tasks
    # inside the bands the shift swept too (distill_changed) seeds 0-2 +1.0 / +5.5 / -0.5. Measured
    # before that batching: warm-up 1 fell 1.0 / 7.0 / 10.0 points short; warm-up 2 and 30 steps was rejected on seed 0
    "tiny": dict(episodes=16, cycle_at=0.5, warmup=2, rl_steps=1, lr=2e-4, experience=16, explore=0.2,
                 gate_tasks=4, max_turns=4, groups=2, distill=8, heldout=4, select=4, after=4, consolidate=4),
    "small": dict(episodes=120, cycle_at=0.6, warmup=2, rl_steps=8, lr=5e-4, experience=64, explore=0.05,
                  gate_tasks=200, max_turns=8, groups=4, distill=256, heldout=24, select=100, after=200,
                  consolidate=100),
}


def schedule(out: Path, shift_at: float = 0.25) -> Path:
    """A silent shift to rule version 2 a quarter of the way in (DriftBench schedule file)."""
    p = out / "stream.json"
    p.write_text(json.dumps({"name": "demo-silent", "phases": [
        {"version": 1}, {"at": shift_at, "version": 2, "announced": False, "kind": "silent"}]}))
    return p


def offline_arm(policy: Path, adapter: str | None, version: str, episodes: list, cfg: DemoConfig,
                max_turns: int) -> list[float]:
    """A policy with no memory on the stream's episodes, in process (greedy, like the served arms)."""
    from evolve.cycle import CycleConfig
    from evolve.stages import evaluate

    ccfg = CycleConfig(base_model=str(policy), domain=cfg.domain, max_turns=max_turns)
    res = evaluate(ccfg, [(adapter, version)], {"arm": [e.task for e in episodes]}, seed=cfg.seed)[0]["arm"]
    return [float(x) for x in res]


def drive(url: str, cfg: DemoConfig, stream_file: Path, start: int, n: int, total: int, max_turns: int) -> list[dict]:
    from evolve.simulator.run import SimConfig, simulate

    res = simulate(SimConfig(url=url, users=2, episodes=n, start=start, stream_length=total, stream=str(stream_file),
                             domain=cfg.domain, api_key=TOKENS.split("=")[0], seed=cfg.seed, temperature=0.0,
                             max_turns=max_turns))
    return res["episodes"]


def run_full(cfg: DemoConfig) -> dict[str, Any]:
    import torch

    from dynamic_bench import make_stream, metrics
    from evolve.cycle import CycleConfig, run_cycle
    from evolve.service_proc import Service
    from training.coldstart import ensure_coldstart

    torch.set_num_threads(2)
    size = SIZES.get(cfg.preset, SIZES["small"])
    n = cfg.episodes or size["episodes"]
    c = int(n * size["cycle_at"])
    out = Path(cfg.out)
    shutil.rmtree(out / "service", ignore_errors=True)
    shutil.rmtree(out / "service-memory-only", ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    timings: dict[str, float] = {}
    sf = schedule(out)
    stream = make_stream(str(sf), cfg.domain, n, cfg.seed)
    window = metrics.default_window(n)
    shifts = [s["index"] for s in stream.shifts]

    # cold-start policy: built once, reused by every later demo run
    policy = Path(cfg.policy) if cfg.policy else Path(ensure_coldstart(out / "policy", cfg.preset, cfg.seed))
    timings["coldstart_s"] = time.time() - t0
    data = out / "service"
    data.mkdir(parents=True)
    engine = f"torch:{policy}"
    extra = ("--max-turns", str(size["max_turns"]), "--max-new-tokens", "48", "--temperature", "0")

    t = time.time()
    static = offline_arm(policy, None, "base", stream.episodes, cfg, size["max_turns"])
    timings["static_arm_s"] = time.time() - t

    t = time.time()
    with Service(data, engine, TOKENS, *extra) as svc:
        pre = drive(svc.url, cfg, sf, 0, c, n, size["max_turns"])
    timings["traffic_before_cycle_s"] = time.time() - t
    shutil.copytree(data, out / "service-memory-only")  # the memory-only world continues from here

    t = time.time()
    ccfg = CycleConfig(**{**dict(data_dir=str(data), domain=cfg.domain, preset=cfg.preset, seed=cfg.seed,
                                 sft_warmup_epochs=size["warmup"], rl_steps=size["rl_steps"], lr=size["lr"],
                                 experience_per_step=size["experience"], explore_eps=size["explore"],
                                 gate_tasks=size["gate_tasks"], groups_per_step=size["groups"],
                                 max_turns=size["max_turns"], distill_tasks=size["distill"],
                                 train_heldout_tasks=size["heldout"], select_tasks=size["select"],
                                 consolidate_fresh_tasks=size["consolidate"],
                                 base_model=str(policy)), **cfg.cycle})
    state = run_cycle(ccfg)
    timings["cycle_s"] = time.time() - t
    gate_out = state.stages["gate"]["output"]
    promoted = gate_out.get("outcome") == "promoted"

    t = time.time()
    with Service(data, engine, TOKENS, *extra) as svc:
        post_evolve = drive(svc.url, cfg, sf, c, n - c, n, size["max_turns"])
    with Service(out / "service-memory-only", engine, TOKENS, *extra) as svc:
        post_memory = drive(svc.url, cfg, sf, c, n - c, n, size["max_turns"])
    timings["traffic_after_cycle_s"] = time.time() - t

    from runtime.policy_registry import PolicyRegistry
    rec = PolicyRegistry(data).get(gate_out["candidate"]) if gate_out.get("candidate") else None
    promoted_no_mem = offline_arm(policy, rec.adapter_path, rec.version, stream.episodes[c:], cfg,
                                  size["max_turns"]) if rec else []

    t = time.time()
    after = after_cycle(ccfg, state.cycle_id, rec, data, out / "service-memory-only", size["after"])
    timings["after_cycle_eval_s"] = time.time() - t

    pre_s = [float(r["success"]) for r in pre]
    arms = {"static policy": static,
            "memory only": pre_s + [float(r["success"]) for r in post_memory],
            "memory + evolve": pre_s + [float(r["success"]) for r in post_evolve]}
    png = plot_arms(out / "curve.png", arms, shifts=shifts, promotions=[c] if promoted else [], window=window,
                    title=f"Evolve demo: {cfg.domain}, silent shift at {shifts[0]}, cycle at {c} "
                          f"({'promoted' if promoted else gate_out.get('outcome')})")
    table = {k: arm_metrics(v, stream, window) for k, v in arms.items()}
    cand_label = "promoted policy, no memory" if promoted else f"candidate ({gate_out.get('outcome')}), no memory"
    new_rules = {cand_label: _mean(promoted_no_mem),
                 "cold-start policy, no memory": _mean(static[c:]),
                 "memory only (cold-start + memory)": _mean(arms["memory only"][c:]),
                 ("memory + evolve (promoted + memory)" if promoted else
                  "memory + evolve (nothing promoted: cold-start + the cycle's memory)"): _mean(arms["memory + evolve"][c:])}
    gate_slices = (gate_out.get("gate") or {}).get("slices", {})
    old = gate_slices.get("old_rules")
    forgetting = round(-old["delta"] * 100, 2) + 0.0 if old else None  # the gate's paired delta; no -0.0
    cons = state.stages["consolidate"]["output"]
    exp, train_out = state.stages["experience"]["output"], state.stages["train"]["output"]
    report = {"mode": "full", "config": asdict(cfg), "episodes": n, "cycle_at": c, "shifts": shifts,
              "window": window, "promoted": promoted, "cycle_id": state.cycle_id, "cycle_config": asdict(ccfg),
              "gate": gate_out, "arms": table, "new_rules_after_cycle": new_rules, "after_cycle_fresh_tasks": after,
              "forgetting_old_rules_points": forgetting,
              "consolidation": cons, "curves": arms, "timings": timings, "wall_s": time.time() - t0,
              "cycle_report": str(data / "cycles" / state.cycle_id / "report.md")}
    write_json(out / "report.json", report)
    arm_rows = [[k, v["aulc"], v["success_rate"], v["success_changed"], recovery_text(v["recovery_episodes_changed"], stream),
                 recovery_text(v["recovery_episodes"], stream)] for k, v in table.items()]
    n_changed = table["static policy"]["n_changed"]
    md = [f"# Evolve demo ({cfg.preset}, {n} episodes, seed {cfg.seed})", "",
          f"Silent shift to rule v2 at episode {shifts[0]}; `evolve cycle` at episode {c}: "
          f"**{gate_out.get('outcome')}** ({gate_out.get('candidate')}). Wall time {report['wall_s']:.0f} s.", "",
          md_table(["arm", "AULC", "success", f"success on the {n_changed} changed tasks",
                    "recovery after the shift (changed tasks)", "recovery (all episodes)"], arm_rows), "",
          "Changed tasks: episodes that acting on the old rules gets wrong. Recovery counts episodes until "
          f"a window of {window} is back to 90% of the pre-shift plateau (never: not within the phase); "
          "over all episodes, a window that holds few changed tasks counts a policy that never adapted as "
          "recovered.", "",
          "## After the cycle: success on the new rules (episodes after the cycle)", "",
          md_table(["policy", "success"], [[k, v] for k, v in new_rules.items()]), "",
          f"The same policies on {after['tasks']} fresh test tasks under the latest rules (same tasks and seeds; "
          "each memory as it stands at the end of the stream):", "",
          md_table(["policy", "success"], [[k, v] for k, v in after["success"].items()]), "",
          f"Candidate without memory vs memory only, paired: {after['paired']['delta']:+.3f} "
          f"({after['paired']['wins']} wins / {after['paired']['losses']} losses, 95% CI "
          f"[{after['paired']['ci_low']:+.3f}, {after['paired']['ci_high']:+.3f}]).", "",
          f"Forgetting on the old-rule slice (gate, v1 tasks): "
          f"{'n/a' if forgetting is None else f'{forgetting:+.1f} points'}; "
          f"memory items retired by consolidation: {cons.get('retired', 0)} of {cons.get('items_considered', 0)}"
          f" (judged on {cons.get('tasks_evaluated', 0)} tasks played without memory"
          + (f"; {cons.get('retired_not_needed', 0)} of them not needed on {cons['fresh_tasks']} fresh tasks, where the "
             f"promoted policy succeeds {cons['fresh_success_with_memory']:.2f} with memory as it was, "
             f"{cons['fresh_success_with_memory_consolidated']:.2f} as consolidated, "
             f"{cons['fresh_success_without_memory']:.2f} without" if cons.get("fresh_tasks") else "") + ").", "",
          f"Memory distillation (before training): of {exp.get('distill_tasks', 0)} fresh tasks under the latest "
          f"rules, the serving policy solved {exp.get('with_memory', 0)} with memory and {exp.get('without_memory', 0)} "
          f"without; the {exp.get('memory_made_the_difference', 0)} only memory solved"
          + (f" and their {exp['neighbour_tasks']} neighbour tasks (facts moved a little; "
             f"{exp['neighbours_only_memory_solved']} only memory solved, {exp['neighbours_solved_without_memory']} "
             f"solved without)" if exp.get("neighbour_tasks") else "") +
          f" gave {exp.get('distilled_rows', 0)} training rows (and {exp.get('anchor_rows', 0)} anchor rows from tasks "
          f"solved without memory" + (f", {exp['memory_anchor_rows']} from tasks solved with memory, shown it"
                                      if exp.get("memory_anchor_rows") else "") +
          f"); {exp.get('memory_rl_tasks', 0)} tasks it failed with memory recalled were "
          f"played in RL with that memory shown.", "",
          f"Candidate: the trained adapter at scale {train_out.get('selected_scale', 1.0)} (chosen by the gate's rule on "
          f"{sum((train_out.get('selection') or {}).get('tasks', {}).values())} tasks apart from the gate's; "
          "evolve.selection).", "",
          "Gate: " + "; ".join(gate_out.get("reasons", [])), "", f"![curve]({png.name})", "",
          f"Cycle report: {report['cycle_report']}", ""]
    (out / "report.md").write_text("\n".join(md))
    report["summary_text"] = "\n".join(md[:14]) + f"\ncurve: {png}\nreport: {out / 'report.md'}"
    return report


def after_cycle(ccfg, cycle_id: str, candidate, data: Path, memory_only: Path, n: int) -> dict[str, Any]:
    """Success on `n` fresh test tasks under the latest rules as users meet them, all on the same
    tasks and env seeds: the candidate and the cold-start policy without memory, and each memory
    arm's serving policy with its memory as it stands at the end of the stream; the candidate
    without memory against the memory arm as a paired comparison (`evolve.gate.paired_compare`).
    Why: the stream's post-cycle episodes are few (48 in the small demo: about ±6 points), too
    few to tell the two apart."""
    from evolve.gate import paired_compare
    from evolve.stages import evaluate, gate_slices
    from memory import MemoryService
    from runtime.graph import recalled_notes
    from runtime.policy_registry import PolicyRegistry

    contexts = json.loads((data / "cycles" / cycle_id / "experience" / "contexts.json").read_text())
    tasks = gate_slices(ccfg, contexts, n, purpose="after-the-cycle")["current"]
    tenant = TOKENS.split("=")[1]
    serving = PolicyRegistry(data).current()
    seed = ccfg.seed * 17 + 9

    def with_memory(policy: tuple[str | None, str], folder: Path) -> list[int]:
        mem = MemoryService(folder / "memory")
        try:
            notes = recalled_notes(mem, [(tenant, t) for t in tasks])
        finally:
            mem.close()
        return evaluate(ccfg, [policy], {"s": tasks}, seed, memory={"s": notes})[0]["s"]

    cand = (candidate.adapter_path, candidate.version) if candidate else (None, "base")
    bare_cand, bare_base = (r["s"] for r in evaluate(ccfg, [cand, (None, "base")], {"s": tasks}, seed))
    mem_only = with_memory((None, "base"), memory_only)
    mem_evolve = with_memory((serving.adapter_path, serving.version) if serving else (None, "base"), data)
    outcomes = {"candidate, no memory": bare_cand, "cold-start policy, no memory": bare_base,
                "memory only (cold-start + memory)": mem_only, "memory + evolve (serving policy + memory)": mem_evolve}
    paired = paired_compare("candidate no memory vs memory only", bare_cand, mem_only, ccfg.gate_config())
    return {"tasks": len(tasks), "success": {k: _mean(v) for k, v in outcomes.items()}, "paired": asdict(paired),
            "outcomes": outcomes}


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None
