"""Consolidation: retire memory items the promoted policy now handles without memory.

An item is judged on the tasks it came from (its provenance trajectories' tasks) and, with
`CycleConfig.consolidate_neighbours`, on tasks whose facts lie around each of them
(`dynamic_bench.tasks.neighbour_tasks`): the promoted policy plays each greedily with *no*
memory in its prompt; an item all of whose tasks succeed is retired with that reason, so
dependence on external memory falls. Items about a case the policy still fails stay. Why the
neighbours: an item's own one or two tasks say little about its case (on build B's demo a note
retired on its own tasks was then missed on refunds a few units away from them). The same tasks
are also played with the memory the runtime would recall for them, so the report shows success
with and without memory. Decisions are saved before any retirement, and an item that is already
retired is left alone, so a rerun after a crash retires nothing twice.

With `CycleConfig.consolidate_fresh_tasks`, a second test (`not_needed`) asks of each item still
live whether the promoted policy does as well without it on fresh tasks under the latest rules,
shown what the runtime would recall for each (the rest of its memory included); items it does not
need are retired too, one at a time, each judged with the ones before it already gone. Why: notes
the cold start needed can cost the promoted policy successes, and the first test keeps them as
long as one of their own tasks still fails without memory. On build E's seed-2 demo the promoted
policy solved 90 of 100 fresh tasks without memory and 86 shown its three (correct) rule notes;
the first test kept all three, this one retired them, and on the stream after the cycle the
memory + evolve arm went from 0.875 to 0.958 (memory only: 0.875).
"""
from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, Callable

from evolve.report import write_json
from evolve.simulator.ledger import task_of

KINDS = ("task_experience", "tool_knowledge", "strategy")  # about the policy's competence


def candidates(mem, tenants: set[str], per_item: int, neighbours: int = 0, seed: int = 0) -> list[dict[str, Any]]:
    """Live items of the tenants with the tasks of their provenance trajectories, each followed by
    `neighbours` tasks like it (same request, rules and split; facts moved a little)."""
    from dynamic_bench.tasks import neighbour_tasks
    from memory.models import NotFound

    rng = random.Random(f"consolidate-neighbours/{seed}")
    out = []
    for tenant in sorted(tenants):
        for it in mem.items(tenant, statuses=("candidate", "validated")):
            if it.kind not in KINDS:
                continue
            tasks = {}
            for p in it.provenance:
                if p.trajectory_id and len(tasks) < per_item:
                    try:
                        t = task_of(mem.get_trajectory(p.trajectory_id, tenant))
                    except NotFound:
                        continue
                    if t is not None:
                        tasks[t.id] = t
            if tasks:
                near = [n for t in tasks.values() for n in neighbour_tasks(t, rng, neighbours)]
                out.append({"item": it, "tasks": list(tasks.values()) + near, "neighbours": len(near)})
    return out


def consolidate(cfg, mem, adapter: str | None, version: str, cycle_dir: Path, tenants: set[str],
                fault: Callable[[], None] = lambda: None, fresh: dict[str, list] | None = None) -> dict[str, Any]:
    """Decide (or read the saved decisions), then retire. `fresh`: each tenant's fresh tasks under
    its latest rules for the second test (`not_needed`); None or empty: the first test only."""
    from evolve.stages import evaluate
    from runtime.graph import recalled_notes

    path = Path(cycle_dir) / "consolidation.json"
    if path.exists():
        plan = json.loads(path.read_text())
    else:
        cands = candidates(mem, tenants, cfg.consolidate_tasks, cfg.consolidate_neighbours, cfg.seed)
        uniq = {(c["item"].tenant, t.id): t for c in cands for t in c["tasks"]}
        keys = list(uniq)
        tasks = [uniq[k] for k in keys]
        # With memory: what the runtime would recall for the task (before anything is retired).
        notes = recalled_notes(mem, [(tenant, t) for (tenant, _), t in uniq.items()])
        seed = cfg.seed * 11 + 3
        res = evaluate(cfg, [(adapter, version)], {"without": tasks, "with": tasks}, seed=seed,
                       memory={"with": notes})[0] if tasks else {"without": [], "with": []}
        ok = {k: r for k, r in zip(keys, res["without"])}
        decisions = []
        for c in cands:
            ids = [t.id for t in c["tasks"]]
            wins = sum(ok[(c["item"].tenant, i)] for i in ids)
            decisions.append({"item_id": c["item"].id, "tenant": c["item"].tenant, "kind": c["item"].kind,
                              "text": c["item"].text, "tasks": ids, "neighbours": c["neighbours"],
                              "successes_without_memory": wins,
                              "retire": wins == len(ids)})
        plan = {"version": version, "decisions": decisions, "n_tasks": len(tasks),
                "success_without_memory": sum(res["without"]) / max(1, len(tasks)),
                "success_with_memory": sum(res["with"]) / max(1, len(tasks))}
        if fresh:
            gone = {d["item_id"] for d in decisions if d["retire"]}
            more, plan["fresh_tasks"] = not_needed(cfg, mem, adapter, version, fresh, gone)
            plan["decisions"] += more
        write_json(path, plan)
    fault()
    retired = 0
    for d in plan["decisions"]:
        if not d["retire"]:
            continue
        it = mem.get(d["item_id"], d["tenant"])
        if it.status in ("candidate", "validated"):
            mem.retire(d["item_id"], retire_reason(d, version), tenant=d["tenant"])
            retired += 1
    judged = {d["item_id"] for d in plan["decisions"]}
    return {"items_considered": len(judged), "retired": sum(d["retire"] for d in plan["decisions"]),
            "retired_not_needed": sum(d["retire"] for d in plan["decisions"] if d.get("test") == "not needed"),
            "retired_now": retired, "kept": len(judged) - sum(d["retire"] for d in plan["decisions"]),
            "tasks_evaluated": plan["n_tasks"], "success_without_memory": plan["success_without_memory"],
            "success_with_memory": plan["success_with_memory"], **fresh_figures(plan.get("fresh_tasks"))}


def fresh_figures(totals: dict[str, int] | None) -> dict[str, Any]:
    """The second test's fresh tasks as flat figures: how many, and the promoted policy's success
    on them without memory, with memory as it was, and with memory once consolidated."""
    if not totals:
        return {}
    n = max(1, totals["tasks"])
    return {"fresh_tasks": totals["tasks"], "fresh_success_without_memory": totals["without_memory"] / n,
            "fresh_success_with_memory": totals["with_memory"] / n,
            "fresh_success_with_memory_consolidated": totals["with_memory_after"] / n}


def retire_reason(d: dict[str, Any], version: str) -> str:
    """Why a decision retires its item, in words (kept on the item)."""
    if d.get("test") == "not needed":
        others = f" and the {d['together'] - 1} others retired with it" if d.get("together") else ""
        return (f"not needed by policy {version}: on {d['fresh_tasks']} fresh tasks (recalled for "
                f"{d['recalled_for']}) it succeeds on {d['successes_without_item']} without the item{others}, "
                f"{d['successes_with_item']} with it")
    return (f"handled without memory by policy {version}: {d['successes_without_memory']}/{len(d['tasks'])} of its "
            f"tasks{' and their neighbours' if d.get('neighbours') else ''} succeeded")


def not_needed(cfg, mem, adapter: str | None, version: str, tasks_by_tenant: dict[str, list],
               gone: set[str]) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Decisions (`ablate`) on each tenant's live items but those in `gone`, the promoted policy
    playing the tenant's fresh tasks with what recall would show; and the tasks' successes without
    memory, with memory as it was, and with memory as these retirements leave it."""
    from evolve.stages import evaluate
    from runtime.graph import AgentConfig, recall_candidates

    acfg = AgentConfig()
    decisions: list[dict[str, Any]] = []
    totals = {"tasks": 0, "without_memory": 0, "with_memory": 0, "with_memory_after": 0}
    for tenant, tasks in sorted(tasks_by_tenant.items()):
        hits = [[h.item for h in recall_candidates(mem, tenant, t.instruction, [t.instruction], acfg)]
                for t in tasks]

        def play(out: set[str] | None) -> list[int]:
            notes = None if out is None else {"s": [[it.text for it in xs] for xs in shown(hits, out, acfg.recall_k)]}
            return evaluate(cfg, [(adapter, version)], {"s": tasks}, cfg.seed * 11 + 5, memory=notes)[0]["s"]

        live = [it for it in mem.items(tenant, statuses=("candidate", "validated")) if it.kind in KINDS]
        made, before, after = ablate(hits, acfg.recall_k, live, play, set(gone), cfg.consolidate_min_success)
        decisions += [{**d, "tenant": tenant, "fresh_tasks": len(tasks)} for d in made]
        totals["tasks"] += len(tasks)
        totals["without_memory"] += sum(play(None))
        totals["with_memory"] += sum(before)
        totals["with_memory_after"] += sum(after)
    return decisions, totals


def shown(hits: list[list[Any]], out: set[str], k: int) -> list[list[Any]]:
    """Per task, the first `k` of its recall candidates that are not in `out`: what recall shows
    once those items are retired."""
    return [[it for it in hs if it.id not in out][:k] for hs in hits]


def ablate(hits: list[list[Any]], k: int, items: list[Any], play: Callable[[set[str]], list[int]],
           gone: set[str], min_success: float) -> tuple[list[dict[str, Any]], list[int], list[int]]:
    """Ablation: `play(out)` gives per-task outcomes (1/0) with the items in `out` kept out of
    recall (`shown`). An item recalled for some task is retired when the tasks as a whole lose
    nothing without it and, on those it is recalled for, the policy succeeds at least `min_success`
    of the time without it (it handles them; a policy that fails them either way keeps the note
    for a later one). One at a time, oldest first, each judged with the items retired before it
    already gone; and all such items together (`together`): the latter where it succeeds as often
    (the tenant then depends on none of them). Returns the decisions and the outcomes before and
    after.

    Why together too: a policy trained on prompts with the notes shown or with none can do worse
    with some of them than with all or none. Build E's seed-2 demo (stop 46): each of three rule
    notes alone cost 1-3 of 100 tasks, all three together none, so one at a time kept all three,
    and the promoted policy served 0.938 with them on the stream after the cycle, 0.979 without.
    And not together only: on seed 1 one at a time kept one of three notes and won 2 tasks more
    than with all three or none."""
    out = set(gone)
    now = first = play(out)
    judged = sorted((it for it in items if it.id not in out), key=lambda it: (it.created_at, it.id))
    all_at_once, without_all = together(hits, k, judged, play, out, first, min_success)
    decisions: list[dict[str, Any]] = []
    for it in judged:
        recalled = recalled_for(shown(hits, out, k), it.id)
        if not recalled:
            continue
        without = play(out | {it.id})
        retire = sum(without) >= sum(now) and share(without, recalled) >= min_success
        decisions.append(decision(it, recalled, now, without, retire))
        if retire:
            out.add(it.id)
            now = without
    if all_at_once and sum(without_all) >= sum(now):
        return all_at_once, first, without_all
    return decisions, first, now


def together(hits: list[list[Any]], k: int, items: list[Any], play: Callable[[set[str]], list[int]],
             out: set[str], now: list[int], min_success: float) -> tuple[list[dict[str, Any]], list[int]]:
    """Decisions retiring all `items` recalled for some task at once, and the outcomes without
    them, if the tasks lose nothing without them all and each one's tasks are handled; none (empty
    lists) otherwise, or where fewer than two items are recalled (one at a time judges those alike)."""
    visible = shown(hits, out, k)
    recalled = {it.id: recalled_for(visible, it.id) for it in items}
    shown_items = [it for it in items if recalled[it.id]]
    if len(shown_items) < 2:
        return [], []
    without = play(out | {it.id for it in shown_items})
    if sum(without) < sum(now) or any(share(without, recalled[it.id]) < min_success for it in shown_items):
        return [], []
    return [{**decision(it, recalled[it.id], now, without, True), "together": len(shown_items)}
            for it in shown_items], without


def recalled_for(visible: list[list[Any]], item_id: str) -> list[int]:
    """Indices of the tasks whose shown items (`shown`) include `item_id`."""
    return [i for i, xs in enumerate(visible) if item_id in {x.id for x in xs}]


def share(outcomes: list[int], tasks: list[int]) -> float:
    return sum(outcomes[i] for i in tasks) / len(tasks)


def decision(it: Any, recalled: list[int], now: list[int], without: list[int], retire: bool) -> dict[str, Any]:
    return {"item_id": it.id, "kind": it.kind, "text": it.text, "test": "not needed", "recalled_for": len(recalled),
            "successes_with_item": sum(now), "successes_without_item": sum(without),
            "success_without_item_where_recalled": share(without, recalled), "retire": retire}
