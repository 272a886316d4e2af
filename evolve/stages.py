"""The cycle's stages (evolve/cycle.py runs them in order, persisting each one's output).

Every stage is safe to rerun after a crash: mining writes one all-or-nothing batch whose items
the memory's dedup-on-write merges with their earlier copies; experience files are rewritten
atomically; training resumes from its own checkpoint; the gate's evaluation is saved before the
decision, and promotion/rejection/retirement check the registry and item status first.
"""
from __future__ import annotations

import json
import random
import shutil
import time
from collections import Counter
from pathlib import Path

from evolve.cycle import CycleConfig, CycleContext, read_cursor
from evolve.report import read_jsonl, write_cycle_report, write_json, write_jsonl

REPLAY_VERSION = 1  # the first rule version: the old-rule slice and the replay tasks


# ---- shared handles ------------------------------------------------------------------------------
def memory(ctx: CycleContext):
    if "memory" not in ctx.cache:
        from memory import MemoryService

        ctx.cache["memory"] = MemoryService(ctx.data_dir / "memory")
    return ctx.cache["memory"]


def registry(ctx: CycleContext):
    from runtime.policy_registry import PolicyRegistry

    return PolicyRegistry(ctx.data_dir)


def serving_policy(reg) -> tuple[str | None, str]:
    """(adapter path, version) of the policy the registry serves now (no adapter: the base)."""
    cur = reg.current()
    return cur.adapter_path if cur else None, reg.current_version()


def base_policy(cfg: CycleConfig) -> Path:
    """The base policy the service serves: `cfg.base_model`, or the cold-start policy under the data folder."""
    if cfg.base_model:
        return Path(cfg.base_model)
    from training.coldstart import ensure_coldstart

    return Path(ensure_coldstart(Path(cfg.data_dir) / "policy", cfg.preset, cfg.seed))


def window(ctx: CycleContext) -> list:
    """The trajectories this cycle mines: after the cycle's start cursor, up to its saved end cursor."""
    mem = memory(ctx)
    ids = set(json.loads((ctx.dir / "window.json").read_text())["trajectory_ids"])
    page = mem.trajectories(after_cursor=ctx.state.after_cursor)
    return [t for t in page.trajectories if t.id in ids]


def _in_scope(cfg: CycleConfig, t) -> bool:
    return not cfg.tenants or t.tenant in cfg.tenants


# ---- 1. mine ---------------------------------------------------------------------------------------
def mine(ctx: CycleContext) -> dict:
    from evolve.mining import approved_tools, contradicted, mine_items, rule_contexts
    from evolve.simulator.ledger import task_of

    mem = memory(ctx)
    page = mem.trajectories(after_cursor=ctx.state.after_cursor)
    trajs = [t for t in page.trajectories if _in_scope(ctx.cfg, t)]
    write_json(ctx.dir / "window.json", {"trajectory_ids": [t.id for t in trajs], "cursor": page.cursor})
    contexts = rule_contexts(trajs)
    latest = contexts[-1] if contexts else None

    def current(t) -> bool:  # under the latest rules as users meet them (see mine_items)
        task = task_of(t)
        return latest is None or (task is not None and task.params.get("rules") == latest["rules"]
                                  and task.params.get("shown_rules") == latest["shown_rules"])

    specs = mine_items(trajs, ctx.state.cycle_id, current=current)
    items = mem.add_many(specs) if specs else []  # one transaction: all of it or none of it
    ctx.fault_point("mine")
    validated = retracted = 0
    approved = approved_tools(trajs) if ctx.cfg.retract_contradicted else set()
    for spec, it in zip(specs, items):
        p = spec["payload"]
        if contradicted(spec, approved):
            if it.status != "retracted":  # the same text may have been written online: that item goes
                mem.retract(it.id, f"{ctx.state.cycle_id}: {p['from']} was also approved for requests like "
                                   f"'{p['template']}' in this window; the facts decide", tenant=it.tenant)
                retracted += 1
            continue
        if p["support"] >= 2 and it.status == "candidate":
            mem.validate(it.id, f"supported by {p['support']} trajectories in {ctx.state.cycle_id}",
                         tenant=it.tenant)
            validated += 1
    return {"trajectories": len(trajs), "cursor": page.cursor, "items": len(items),
            "item_ids": sorted({it.id for it in items}), "validated": validated, "retracted": retracted,
            "by_kind": dict(Counter(s["kind"] for s in specs)),
            "feedback": sum(len(t.feedback) for t in trajs)}


# ---- 2. experience -------------------------------------------------------------------------------
def _corrupt(task, rng: random.Random):
    """A deliberately wrong reward: the task's rules in force replaced by random rule values."""
    from dynamic_bench import get_domain

    d = get_domain(task.domain)
    return task.model_copy(update={"params": {**task.params, "rules": d.random_rules(rng)}})


def still_right(task, latest: dict | None) -> bool:
    """Whether `task`'s logged behaviour is still right to learn from: its rules are the latest, its
    users were shown a different policy (they can be told apart), or the rules agree on it. A task of
    silently superseded rules where the answer changed would teach the old rule on the same prompt."""
    from dynamic_bench import get_domain

    if task is None or latest is None:
        return True
    p = task.params
    if "rules" not in p or p["rules"] == latest["rules"] or p.get("shown_rules") != latest["shown_rules"]:
        return True
    return get_domain(task.domain).same_answer(p, p["rules"], latest["rules"])


def experience(ctx: CycleContext) -> dict:
    from dynamic_bench import generate_tasks
    from evolve.mining import experience as build, rule_contexts, task_pool
    from evolve.simulator.ledger import task_of

    cfg = ctx.cfg
    trajs = window(ctx)
    out = ctx.dir / "experience"
    out.mkdir(exist_ok=True)
    contexts = rule_contexts(trajs)
    latest = contexts[-1] if contexts else None
    learnable = [t for t in trajs if still_right(task_of(t), latest)]
    exp = build(learnable)
    for name, rows in exp.items():
        write_jsonl(out / f"{name}.jsonl", rows)
    pool = task_pool(learnable, max_tasks=64, seed=cfg.seed)
    rng = random.Random(f"corrupt/{cfg.seed}")
    if cfg.corrupt_rewards:
        pool = [{**r, "task": _corrupt(r["task"], rng), "corrupted": True} for r in pool]
    n_replay = round(len(pool) * cfg.replay_share / max(1e-9, 1 - cfg.replay_share)) if pool else 0
    replay = generate_tasks(cfg.domain, 4 * n_replay, seed=cfg.seed + 17, split="train",
                            rule_version=REPLAY_VERSION) if n_replay else []
    replay = [t for t in replay if still_right(t, latest)][:n_replay]
    rows = [{"task": r["task"].model_dump(mode="json"), "learning_value": r["learning_value"], "replay": False}
            for r in pool] + [{"task": t.model_dump(mode="json"), "learning_value": None, "replay": True}
                              for t in replay]
    write_json(out / "contexts.json", contexts)
    distilled = {}
    if cfg.distill_tasks and learnable and not cfg.corrupt_rewards:
        from evolve.distill import memory_distillation

        drows, distilled = memory_distillation(cfg, memory(ctx), learnable, serving_policy(registry(ctx)),
                                               cfg.distill_tasks)
        write_jsonl(out / "distilled.jsonl", drows)
        write_json(out / "distill_outcomes.json", distilled.pop("outcomes"))
        memory_rl = distilled.pop("memory_rl")  # RL tasks played with memory shown
        rows += [{**r, "learning_value": None, "replay": False} for r in memory_rl]
        distilled["memory_rl_tasks"] = len(memory_rl)
    write_jsonl(out / "tasks.jsonl", rows)
    ctx.fault_point("experience")
    return {**distilled, "sft_examples": len(exp["sft"]), "corrections": len(exp["corrections"]),
            "preference_pairs": len(exp["pairs"]), "rl_tasks": len(pool), "replay_tasks": len(replay),
            "rule_contexts": len(contexts), "superseded_trajectories": len(trajs) - len(learnable),
            "corrupted": bool(cfg.corrupt_rewards)}


def train(ctx: CycleContext) -> dict:
    from dynamic_bench.schema import Task
    from evolve.selection import select_scale
    from evolve.training_rows import logged_experience, rehearsal_examples, rehearsal_rows
    from training.rl.diagnostics import held_out_series
    from training.rl.trainer import RLConfig, TaskPool, read_metrics, train_rl

    cfg = ctx.cfg
    rows = read_jsonl(ctx.dir / "experience" / "tasks.jsonl")
    learn = [r for r in rows if not r["replay"]]
    if not learn:
        return {"skipped": "no tasks to learn from", "candidate": None}
    contexts = json.loads((ctx.dir / "experience" / "contexts.json").read_text())
    pool = TaskPool()
    for r in rows:
        t = Task.model_validate(r["task"])
        key = f"{t.id}/memory" if r.get("memory") else t.id  # a task may also be in the pool bare
        pool.tasks[key] = t
        if r["replay"]:
            pool.replay.add(key)
        if r.get("memory"):  # played with these notes shown (evolve.distill.unsolved_with_memory)
            pool.memory[key] = r["memory"]
    base = base_policy(cfg)
    if not cfg.corrupt_rewards:  # a corrupted-reward candidate learns from its rewards alone
        pool.sft_rows, pool.sft_focus, pool.pref_pairs = logged_experience(
            ctx.dir / "experience", base, cfg.distill_memory, cfg.distill_focus, cfg.corrections_with_memory)
        if cfg.rehearsal_examples or cfg.rehearsal_old_rule_examples:
            pool.rehearsal = rehearsal_rows(base, rehearsal_examples(
                cfg.domain, cfg.rehearsal_examples, cfg.rehearsal_old_rule_examples, cfg.seed,
                contexts[-1]["rules"] if contexts else None))
    if cfg.train_heldout_tasks:  # scored during training, so the diagnosis can tell learning from memorising
        heldout = gate_slices(cfg, contexts, cfg.train_heldout_tasks, purpose="train-heldout")
        pool.heldout = {k: heldout[k] for k in ("current", "old_rules") if heldout.get(k)}
    rl = RLConfig(model=str(base), out_dir=str(ctx.dir / "train"), env_id=f"driftbench/{cfg.domain}-v1",
                  steps=cfg.rl_steps, groups_per_step=cfg.groups_per_step, seed=cfg.seed,
                  sft_coef=cfg.sft_coef, pref_coef=cfg.pref_coef, explore_eps=cfg.explore_eps,
                  experience_per_step=cfg.experience_per_step, replay_share=cfg.replay_share,
                  rehearsal_per_step=cfg.rehearsal_per_step, sft_warmup_epochs=cfg.sft_warmup_epochs,
                  sft_warmup_lr=cfg.sft_warmup_lr,
                  n_workers=1, eta=0, lr=cfg.lr, ppo_epochs=cfg.ppo_epochs, kl_coef=cfg.kl_coef,
                  eval_every=max(1, cfg.rl_steps // 3), max_turns=cfg.max_turns, progress=True, resume=True)
    t0 = time.time()
    adapter = train_rl(rl, pool=pool)
    reg = registry(ctx)
    adapter, selection = select_scale(
        cfg, lambda: judged_slices(cfg, contexts, memory(ctx), window(ctx), cfg.select_tasks, purpose="select"),
        adapter, serving_policy(reg), ctx.dir / "select")
    ctx.fault_point("train")
    version = f"v-{ctx.state.cycle_id}" + ("-corrupt" if cfg.corrupt_rewards else "")
    dest = ctx.data_dir / "policies" / "adapters" / version
    if not (dest / "adapter_config.json").exists():
        tmp = dest.with_name(dest.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(adapter, tmp)
        shutil.rmtree(dest, ignore_errors=True)
        tmp.rename(dest)
    reg.register(version, dest, parent=reg.current_version(), base_model=str(base), cycle=ctx.state.cycle_id)
    m = read_metrics(ctx.dir / "train")
    heldout = {}  # before training and at its end, per held-out slice: did training generalise?
    for name in ("current", "old_rules"):
        if xs := held_out_series(m, f"heldout_{name}"):
            heldout[f"heldout_{name}_first"], heldout[f"heldout_{name}_last"] = xs[0], xs[-1]
    diagnosis, warmup = ctx.dir / "train" / "diagnosis.txt", ctx.dir / "train" / "warmup.json"
    return {"candidate": version, "adapter": str(dest), "train_s": time.time() - t0, "steps": len(m),
            "final_reward_mean": m[-1].get("reward_mean") if m else None, **heldout,
            "logged_sft_rows": len(pool.sft_rows), "distilled_focus_rows": len(pool.sft_focus),
            "logged_pref_pairs": len(pool.pref_pairs),
            "rl_tasks": len(pool.tasks) - len(pool.replay), "replay_tasks": len(pool.replay),
            "memory_rl_tasks": len(pool.memory), "rehearsal_rows": len(pool.rehearsal),
            "selected_scale": selection.get("scale", 1.0), "selection": selection,
            **{f"sft_warmup_{k}": v for k, v in (json.loads(warmup.read_text()) if warmup.exists() else {}).items()},
            "diagnosis": diagnosis.read_text().splitlines() if diagnosis.exists() else []}


# ---- 4. gate -------------------------------------------------------------------------------------
def gate_slices(cfg: CycleConfig, contexts: list[dict], n: int = 0, purpose: str = "gate",
                split: str = "test") -> dict[str, list]:
    """Test-split tasks per slice (`n` each, default `cfg.gate_tasks`): the latest rules as users
    meet them, older rules (else the first version: forgetting), and the latest rules announced
    (held out). `purpose` seeds the draw, so training's held-out tasks are not the gate's; memory
    distillation draws from the train `split`.

    An older context shown the *same* policy text as the latest one (a silent shift) gets only tasks
    whose right actions are the same under both rules: on the others no policy can be right for
    both without memory (the prompts are identical), so they measure the shift, not forgetting."""
    from dynamic_bench import get_domain
    from dynamic_bench.tasks import make_task

    d = get_domain(cfg.domain)
    rng = random.Random(f"{purpose}/{cfg.seed}")
    n = n or cfg.gate_tasks

    def tasks(rules, shown, prior, k, agree_with: dict | None = None) -> list:
        out: list = []
        for _ in range(200 * k):
            if len(out) == k:
                break
            t = make_task(d, rng, rule_version=rules, split=split, prior=prior, shown=shown)
            if agree_with is None or d.same_answer(t.params, rules, agree_with):
                out.append(t)
        return out

    v1 = d.versions[REPLAY_VERSION]
    out: dict[str, list] = {}
    if contexts:
        last = contexts[-1]
        prior = [(v, r) for v, r in last["prior"]]
        out["current"] = tasks(last["rules"], (last["shown_version"], last["shown_rules"]), prior, n)
        older = [c for c in contexts[:-1] if c["rules"] != last["rules"]]
        out["old_rules"] = []
        for c in older or [{"rules": v1, "shown_rules": v1, "shown_version": REPLAY_VERSION, "prior": []}]:
            silent = c["shown_rules"] == last["shown_rules"]
            out["old_rules"] += tasks(c["rules"], (c["shown_version"], c["shown_rules"]),
                                      [(v, r) for v, r in c["prior"]], max(1, n // max(1, len(older))),
                                      agree_with=last["rules"] if silent else None)
        out["held_out"] = tasks(last["rules"], (last["version"], last["rules"]), prior, n)
    else:
        out["current"] = tasks(v1, (REPLAY_VERSION, v1), [], n)
    return out


def tenant_tasks(cfg: CycleConfig, trajs: list, n: int, purpose: str, split: str = "test") -> dict[str, list]:
    """About `n` tasks in all, split over the tenants of `trajs`, each under its tenant's latest
    rule context (as its users meet them: the rules in force and the policy text shown)."""
    from evolve.mining import rule_contexts

    by_tenant: dict[str, list] = {}
    for t in trajs:
        by_tenant.setdefault(t.tenant, []).append(t)
    per = max(1, n // max(1, len(by_tenant)))
    out = {}
    for tenant, ts in sorted(by_tenant.items()):
        contexts = rule_contexts(ts)
        if contexts:
            out[tenant] = gate_slices(cfg, contexts[-1:], per, purpose=f"{purpose}/{tenant}", split=split)["current"]
    return out


def judged_slices(cfg: CycleConfig, contexts: list[dict], mem, trajs: list, n: int = 0,
                  purpose: str = "gate") -> tuple[dict[str, list], dict[str, list[list[str]]]]:
    """The slices a candidate is judged on (`gate_slices`, and `with_memory` from `memory_slice`
    where any tenant has something recalled: else it would repeat "current") and the notes shown
    per slice: the gate's with purpose "gate", candidate selection's (evolve.selection) with another."""
    slices = gate_slices(cfg, contexts, n, purpose=purpose)
    mem_tasks, notes = memory_slice(cfg, mem, trajs, n, purpose=f"{purpose}-memory")
    if any(notes):
        slices["with_memory"] = mem_tasks
    return slices, {"with_memory": notes}


def memory_slice(cfg: CycleConfig, mem, trajs: list, n: int = 0,
                 purpose: str = "gate-memory") -> tuple[list, list[list[str]]]:
    """The gate's `with_memory` slice: test tasks under each tenant's latest rules (`n` in all,
    default `cfg.gate_tasks`), each with the notes the runtime would recall from that tenant's
    memory (`recalled_notes`). Why: the service serves the promoted adapter *with* memory, and on
    build D's seed-1 demo a candidate promoted on the memory-free slices followed memory worse
    than the policy it replaced (0.785 vs 0.855 with memory on fresh tasks); this slice rejects that
    candidate (-9.0 points: 25 of its 32 losses were refunds over the new escalation threshold)."""
    from runtime.graph import recalled_notes

    pairs = [(tenant, t) for tenant, ts in tenant_tasks(cfg, trajs, n or cfg.gate_tasks, purpose).items()
             for t in ts]
    return [t for _, t in pairs], recalled_notes(mem, pairs)


def evaluate(cfg: CycleConfig, policies: list[tuple[str | None, str]], slices: dict[str, list], seed: int,
             memory: dict[str, list[list[str]]] | None = None) -> list[dict[str, list[int]]]:
    """Greedy outcomes (1/0) per task for each (adapter, version), all on the same tasks and env
    seeds; no memory unless `memory[slice][i]` gives the notes shown for task i (training.rollout
    renders them as the runtime does). One engine, adapters swapped in turn."""
    from training.engines import make_engine
    from training.rollout import RolloutConfig, rollout

    engine = make_engine(f"torch:{base_policy(cfg)}", seed=seed)
    rc = RolloutConfig(temperature=0.0, max_steps=cfg.max_turns, seed=seed)
    results = []
    try:
        for adapter, version in policies:
            engine.load_adapter(adapter, version)
            out = {}
            for name, tasks in slices.items():
                mem = (memory or {}).get(name)
                trajs = rollout(engine, engine.tokenizer, tasks, rc, memory=mem) if tasks else []
                out[name] = [int(t.outcome == "success") for t in trajs]
            results.append(out)
    finally:
        engine.close()
    return results


def gate(ctx: CycleContext) -> dict:
    from evolve.gate import decide

    cfg = ctx.cfg
    cand = ctx.output("train").get("candidate")
    reg = registry(ctx)
    if not cand:
        return {"outcome": "nothing-to-learn", "candidate": None, "serving": reg.current_version()}
    rec = reg.get(cand)
    if rec.status in ("promoted", "rejected"):  # decided before a crash: keep that decision
        return json.loads((ctx.dir / "gate.json").read_text())["result"]
    ev_path = ctx.dir / "gate_eval.json"
    if ev_path.exists():
        ev = json.loads(ev_path.read_text())
    else:
        contexts = json.loads((ctx.dir / "experience" / "contexts.json").read_text())
        slices, notes = judged_slices(cfg, contexts, memory(ctx), window(ctx))
        current, candidate = evaluate(cfg, [serving_policy(reg), (rec.adapter_path, cand)], slices, cfg.seed * 7 + 1,
                                      memory=notes)
        ev = {"current_version": reg.current_version(), "candidate_version": cand,
              "n_tasks": {k: len(v) for k, v in slices.items()},
              "task_ids": {k: [t.id for t in v] for k, v in slices.items()}, "current": current, "candidate": candidate}
        write_json(ev_path, ev)
    d = decide({k: (ev["candidate"][k], ev["current"][k]) for k in ev["current"]}, cfg.gate_config())
    outcome = "promoted" if d.promote else "rejected"
    result = {"outcome": outcome, "candidate": cand, "previous": ev["current_version"],
              "reasons": d.reasons, "gate": d.to_dict()}
    write_json(ctx.dir / "gate.json", {"result": result})
    ctx.fault_point("gate")
    reason = f"{ctx.state.cycle_id}: " + "; ".join(d.reasons)
    if d.promote:
        reg.promote(cand, reason)  # a no-op when it already serves
    elif reg.get(cand).status != "rejected":
        reg.reject(cand, reason)
    return result


# ---- 5. consolidate -------------------------------------------------------------------------------
def consolidate(ctx: CycleContext) -> dict:
    from evolve.consolidation import consolidate as run

    g = ctx.output("gate")
    if g.get("outcome") != "promoted":
        return {"skipped": f"no promotion ({g.get('outcome')})", "retired": 0}
    rec = registry(ctx).get(g["candidate"])
    trajs = window(ctx)
    fresh = (tenant_tasks(ctx.cfg, trajs, ctx.cfg.consolidate_fresh_tasks, purpose="consolidate", split="train")
             if ctx.cfg.consolidate_fresh_tasks else None)
    return run(ctx.cfg, memory(ctx), rec.adapter_path, rec.version, ctx.dir, {t.tenant for t in trajs},
               fault=lambda: ctx.fault_point("consolidate"), fresh=fresh)


# ---- 6. report -----------------------------------------------------------------------------------
def report(ctx: CycleContext) -> dict:
    st = ctx.state
    g = ctx.output("gate")
    rep = {"cycle_id": st.cycle_id, "outcome": g.get("outcome"), "started_at": st.started_at,
           "after_cursor": st.after_cursor, "config": ctx.cfg.__dict__,
           "stages": {k: {kk: vv for kk, vv in (v.get("output") or {}).items() if kk not in ("item_ids", "gate")}
                      for k, v in st.stages.items() if k != "report"},
           "gate": g.get("gate"), "consolidation": ctx.output("consolidate")}
    ctx.fault_point("report")
    paths = write_cycle_report(ctx.dir, rep)
    if "memory" in ctx.cache:
        ctx.cache.pop("memory").close()
    return {k: str(v) for k, v in paths.items()}


# ---- dry run ---------------------------------------------------------------------------------------
def plan(cfg: CycleConfig) -> dict:
    """What a cycle would do now; reads the log and the registry, writes nothing of the cycle's."""
    from evolve.lock import CycleLock
    from evolve.mining import approved_tools, contradicted, experience as build, mine_items, rule_contexts
    from memory import MemoryService
    from runtime.policy_registry import PolicyRegistry

    data = Path(cfg.data_dir)
    lock = CycleLock(data / "cycles" / "cycle.lock").read()
    mem = MemoryService(data / "memory")
    try:
        page = mem.trajectories(after_cursor=read_cursor(data))
    finally:
        mem.close()
    trajs = [t for t in page.trajectories if not cfg.tenants or t.tenant in cfg.tenants]
    specs = mine_items(trajs, "dry-run")
    approved = approved_tools(trajs) if cfg.retract_contradicted else set()
    exp = build(trajs)
    return {"dry_run": True, "lock": lock.describe() if lock else "free",
            "trajectories_since_last_cycle": len(trajs), "cursor": page.cursor,
            "would_mine_items": len(specs), "by_kind": dict(Counter(s["kind"] for s in specs)),
            "examples": [s["text"] for s in specs[:8]],
            "would_retract": [s["text"] for s in specs if contradicted(s, approved)],
            "experience": {k: len(v) for k, v in exp.items()}, "rule_contexts": len(rule_contexts(trajs)),
            "serving": PolicyRegistry(data).current_version(),
            "would_distill": f"{cfg.distill_tasks} fresh tasks played with and without memory; up to "
                             f"{cfg.memory_rl_tasks} failed with memory go to RL with it shown" if trajs else "nothing",
            "would_train": (f"{cfg.sft_warmup_epochs} supervised passes, then " if cfg.sft_warmup_epochs else "")
                           + f"{cfg.rl_steps} RL steps from the {cfg.preset} cold-start policy" if trajs else "nothing",
            "would_gate": f"{cfg.gate_tasks} tasks per slice, alpha {cfg.alpha}, tolerance {cfg.tolerance}"}
