"""Memory distillation: what memory makes the serving policy get right becomes training data.

The logged experience covers only the requests users happened to make, and a silent shift leaves
the policy text unchanged, so without memory the policy has nothing to tell the new rules from the
old. Here the serving policy plays fresh tasks under each tenant's latest rules twice, greedily:
with the memory the runtime would recall for them (`runtime.graph.recall_items`) and without.
The tasks that succeed with memory and fail without are the cases memory is carrying; their steps,
with the memory section emptied (`without_memory`), become SFT rows, so the candidate learns them
and the tenant depends less on memory (DESIGN: turn memory into training data); tasks it already
solves without memory anchor what must not change. Only verified successes are kept, so a wrong
memory item teaches nothing. Tasks come from the train split (the gate draws from test); each
tenant's tasks are played with that tenant's memory only. With `CycleConfig.distill_neighbours`,
each task only memory solved brings tasks whose facts lie around its own (`neighbour_tasks`), played
the same way: they straddle the threshold the shift moved, so the rows show where the new rule stops;
with `CycleConfig.distill_boundary`, also tasks with one fact right on a threshold or one past it
(`boundary_tasks`), where a rule learned only roughly goes wrong; with `CycleConfig.distill_changed`,
tasks with one fact inside the band a shifted threshold swept (`changed_tasks`).
The tasks memory was recalled for and still failed go to RL with their notes shown
(`unsolved_with_memory`, `CycleConfig.memory_rl_tasks`).
"""
from __future__ import annotations

import random
from typing import Any


def memory_distillation(cfg, mem, trajs: list, policy: tuple[str | None, str], n: int) -> tuple[list[dict], dict]:
    """SFT rows (`prompt_token_ids` without memory, `completion_token_ids`) from the tasks the serving
    `policy` (adapter, version) solves only with memory, and the counts behind them."""
    from evolve.stages import base_policy, tenant_tasks
    from runtime.graph import recalled_notes
    from training.engines import make_engine
    from training.rollout import RolloutConfig, rollout

    per_tenant = tenant_tasks(cfg, trajs, n, purpose="distill", split="train")
    tasks = [(tenant, t) for tenant, ts in per_tenant.items() for t in ts]
    stats: dict[str, Any] = {"distill_tasks": len(tasks), "with_memory": 0, "without_memory": 0,
                             "memory_made_the_difference": 0, "neighbour_tasks": 0, "neighbours_only_memory_solved": 0,
                             "neighbours_solved_without_memory": 0, "distilled_rows": 0, "anchor_rows": 0,
                             "outcomes": []}
    if not tasks:
        return [], stats
    engine = make_engine(f"torch:{base_policy(cfg)}", seed=cfg.seed)
    rc = RolloutConfig(temperature=0.0, max_steps=cfg.max_turns, seed=cfg.seed * 13 + 5)

    def play(pairs: list) -> tuple[list, list, list]:
        """Each task's recalled notes, and the task played greedily with them and without."""
        notes, ts = recalled_notes(mem, pairs), [t for _, t in pairs]
        return notes, rollout(engine, engine.tokenizer, ts, rc, memory=notes), rollout(engine, engine.tokenizer, ts, rc)

    try:
        engine.load_adapter(*policy)
        notes, with_mem, bare = play(tasks)
        if cfg.distill_neighbours or cfg.distill_boundary or cfg.distill_changed:  # listed first: anchors first
            near = neighbours_of_distilled(tasks, with_mem, bare, cfg.distill_neighbours, cfg.seed,
                                           cfg.distill_boundary, cfg.distill_changed)
            near_notes, near_with, near_bare = play(near) if near else ([], [], [])
            tasks, notes = near + tasks, near_notes + notes
            with_mem, bare = near_with + with_mem, near_bare + bare
            stats["neighbour_tasks"] = len(near)
        tok = engine.tokenizer
    finally:
        engine.close()
    tasks = [t for _, t in tasks]
    stats["memory_rl"] = unsolved_with_memory(tasks, notes, with_mem, cfg.memory_rl_tasks, cfg.seed)
    reads = [read_tools(cfg.domain, t) for t in tasks] if cfg.distill_focus else None
    rows, stats["outcomes"] = distilled_rows(with_mem, bare, tok, cfg.distill_anchor_ratio, reads,
                                             cfg.distill_memory_anchor_ratio)
    for i, o in enumerate(stats["outcomes"]):
        if i < stats["neighbour_tasks"]:
            o["neighbour"] = True
            stats["neighbours_only_memory_solved"] += only_memory_solved(o)
            stats["neighbours_solved_without_memory"] += o["without_memory"]
            continue
        stats["with_memory"] += o["with_memory"]
        stats["without_memory"] += o["without_memory"]
        stats["memory_made_the_difference"] += only_memory_solved(o)
    stats["anchor_rows"] = sum(bool(r.get("anchor")) and not r.get("with_memory") for r in rows)
    stats["memory_anchor_rows"] = sum(bool(r.get("with_memory")) for r in rows)
    stats["distilled_rows"] = len(rows) - stats["anchor_rows"] - stats["memory_anchor_rows"]
    return rows, stats


def neighbours_of_distilled(tasks: list[tuple[str, Any]], with_memory: list, bare: list, k: int,
                            seed: int, k_boundary: int = 0, k_changed: int = 0) -> list[tuple[str, Any]]:
    """(tenant, task) for `k_boundary` tasks with a fact on a threshold (`boundary_tasks`), `k_changed`
    with a fact in a band a shifted threshold swept (`changed_tasks`), then `k` neighbours
    (`neighbour_tasks`), of each task only memory solved."""
    from dynamic_bench.tasks import boundary_tasks, changed_tasks, neighbour_tasks

    rng = random.Random(f"distill-neighbours/{seed}")
    return [(tenant, near) for (tenant, t), w, b in zip(tasks, with_memory, bare, strict=True)
            if only_memory_solved(outcome(w, b))
            for near in boundary_tasks(t, rng, k_boundary) + changed_tasks(t, rng, k_changed)
            + neighbour_tasks(t, rng, k)]


def distilled_rows(with_memory: list, bare: list, tokenizer, anchor_ratio: float = 0.0,
                   reads: list[set[str]] | None = None,
                   memory_anchor_ratio: float = 0.0) -> tuple[list[dict], list[dict]]:
    """SFT rows from the i-th task's trajectory with memory when it succeeded and the i-th without
    memory failed: every step, its prompt's memory section emptied; and each task's outcomes.

    With `anchor_ratio`, also that many anchor tasks per distilled task, first come first: tasks the
    policy already solves without memory, their own steps as rows (`"anchor": True`). Why: a demo
    candidate trained on distilled rows alone learned the new refund window (+10 points) and
    stopped escalating large refunds it had escalated right (-6.5 points on old-rule tasks).

    With `reads` (each task's read tools: `read_tools`), the rows are focused on decisions
    (`CycleConfig.distill_focus`): a distilled task's steps from the first action that differs
    from the memory-free run's on (`first_divergence`: the steps before it are what the policy
    already does), an anchor's from its first action that is not a read on (`first_decision`).

    With `memory_anchor_ratio`, also that many memory anchors per distilled task, first come first:
    tasks solved *with* memory that was recalled for them, their steps with the memory still shown
    (`"anchor": True, "with_memory": True`). Why: the service serves the candidate with memory; on build
    E's seed-1 demo the candidate refunded in-window refunds over 150 that the cold start escalated
    with the same notes shown (gate `with_memory` -15.0), and nothing it trained on showed it the
    notes it must keep following."""
    from runtime.scaffolds import without_memory

    rows, anchors, memory_anchors, outcomes = [], [], [], []
    for i, (w, b) in enumerate(zip(with_memory, bare, strict=True)):
        ok = outcome(w, b)
        outcomes.append({"task_id": w.task_id, **ok})
        if ok["without_memory"]:
            anchors.append((b.task_id, b.steps[first_decision(b, reads[i]):] if reads else b.steps))
        if ok["with_memory"] and w.steps and without_memory(tokenizer, w.steps[0].prompt_token_ids) is not None:
            memory_anchors.append((w.task_id, w.steps[first_decision(w, reads[i]):] if reads else w.steps))
        if not only_memory_solved(ok):
            continue
        rows += [_row(w.task_id, without_memory(tokenizer, s.prompt_token_ids) or list(s.prompt_token_ids), s)
                 for s in w.steps[first_divergence(w, b) if reads else 0:] if s.completion_token_ids]
    n_distilled = sum(only_memory_solved(o) for o in outcomes)
    for task_id, steps in anchors[:round(anchor_ratio * n_distilled)]:
        rows += [{**_row(task_id, list(s.prompt_token_ids), s), "anchor": True} for s in steps if s.completion_token_ids]
    for task_id, steps in memory_anchors[:round(memory_anchor_ratio * n_distilled)]:
        rows += [{**_row(task_id, list(s.prompt_token_ids), s), "anchor": True, "with_memory": True}
                 for s in steps if s.completion_token_ids]
    return rows, outcomes


def unsolved_with_memory(tasks: list, notes: list[list[str]], with_memory: list, k: int, seed: int) -> list[dict]:
    """Up to `k` tasks the policy failed although memory was recalled for them, each with those
    notes ({"task": json, "memory": notes}): RL tasks played with the notes shown (`TaskPool.memory`).
    Why: distillation learns only what memory already got right; after build C's seed-0 demo
    cycle, the six stream episodes both memory arms lost were rule compositions their recalled
    notes stated (refund above the escalation threshold, gold window, coupon) and that neither
    policy applied with the notes in its prompt. Reward on such tasks, notes shown, teaches that."""
    found = [{"task": t.model_dump(mode="json"), "memory": list(n)}
             for t, n, w in zip(tasks, notes, with_memory, strict=True) if n and w.outcome != "success"]
    return found if len(found) <= k else random.Random(f"memory-rl/{seed}").sample(found, k)


def outcome(with_memory, bare) -> dict[str, int]:
    """One task's two greedy runs as {"with_memory": 0/1, "without_memory": 0/1}."""
    return {"with_memory": int(with_memory.outcome == "success"), "without_memory": int(bare.outcome == "success")}


def only_memory_solved(o: dict[str, int]) -> bool:
    """The task distillation learns from: solved with memory, failed without."""
    return bool(o["with_memory"] and not o["without_memory"])


def read_tools(domain: str, task) -> set[str]:
    """Names of the tools that only read, under the rules in force for `task`."""
    from dynamic_bench import get_domain

    return {name for name, spec in get_domain(domain).tools(task.params["rules"]).items() if not spec.is_write}


def first_decision(traj, reads: set[str]) -> int:
    """Index of the first step whose action is not a read (a write, a reply, or unparsable)."""
    for i, s in enumerate(traj.steps):
        if not s.action or s.action.get("name") not in reads:
            return i
    return len(traj.steps)


def first_divergence(with_memory, bare) -> int:
    """Index of the first step whose action differs between the two runs of one task (the length
    of the shorter run if one is a prefix of the other)."""
    for i, (a, b) in enumerate(zip(with_memory.steps, bare.steps)):
        if a.action_text != b.action_text:
            return i
    return min(len(with_memory.steps), len(bare.steps))


def _row(task_id: str, prompt_ids: list[int], step) -> dict:
    return {"task_id": task_id, "prompt_token_ids": prompt_ids, "completion_token_ids": list(step.completion_token_ids)}
