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
                fault: Callable[[], None] = lambda: None) -> dict[str, Any]:
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
        write_json(path, plan)
    fault()
    retired = 0
    for d in plan["decisions"]:
        if not d["retire"]:
            continue
        it = mem.get(d["item_id"], d["tenant"])
        if it.status in ("candidate", "validated"):
            mem.retire(d["item_id"], f"handled without memory by policy {version}: "
                                     f"{d['successes_without_memory']}/{len(d['tasks'])} of its tasks"
                                     f"{' and their neighbours' if d.get('neighbours') else ''} succeeded",
                       tenant=d["tenant"])
            retired += 1
    return {"items_considered": len(plan["decisions"]), "retired": sum(d["retire"] for d in plan["decisions"]),
            "retired_now": retired, "kept": sum(not d["retire"] for d in plan["decisions"]),
            "tasks_evaluated": plan["n_tasks"], "success_without_memory": plan["success_without_memory"],
            "success_with_memory": plan["success_with_memory"]}
