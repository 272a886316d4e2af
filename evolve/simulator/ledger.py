"""Logged feedback → persona fit: read the trajectory log, re-judge each proposed write, fit.

A logged trajectory keeps the proposed action of every step and the user's answer, not whether
the action was right. The world is deterministic, so the judgement is recovered by replaying the
thread's task: reads and approved writes are applied, edits and take-overs apply the user's
action, rejections apply nothing (the runtime's semantics), and each proposed write is judged
in the state it was proposed in.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from dynamic_bench import make
from dynamic_bench.actions import Reply, parse_action
from dynamic_bench.schema import CORRECTION_KINDS, Task, Trajectory
from evolve.report import md_table, write_json
from evolve.simulator.fit import FeedbackRecord, fit, validate

# The runtime's feedback kinds → the persona's answer, and whether the user said why.
KIND_MAP = {"approve": ("approve", False), "edit": ("edit", False), "takeover": ("takeover", False),
            "reject": ("reject", False), "respond": ("reject", True)}


def task_of(traj: Trajectory) -> Task | None:
    world = (traj.metadata or {}).get("world") or {}
    tj = world.get("task_json")
    return Task.model_validate_json(tj) if tj else None


def replay(traj: Trajectory) -> list[dict[str, Any]]:
    """Per proposed write: step index, judgement, the user's feedback (if any)."""
    task = task_of(traj)
    if task is None:
        return []
    env = make(f"driftbench/{task.domain}-v1", user_simulation=False, max_steps=10_000)
    env.reset(seed=None, options={"task": task, "user_simulation": False})
    fb_by_step = {f.step: f for f in traj.feedback if f.step is not None}
    out = []
    for s in traj.steps:
        act = parse_action(s.action_text)
        if isinstance(act, Reply) or s.action is None:
            if isinstance(act, Reply):
                break
            continue
        j = env.judge_action(s.action_text)
        fb = fb_by_step.get(s.index)
        if j["is_write"] or fb is not None:
            out.append({"step": s.index, "judgement": j, "feedback": fb, "action_text": s.action_text})
        if fb is None or fb.kind == "approve":
            env.step(s.action_text)
        elif fb.kind in CORRECTION_KINDS and fb.payload.get("action"):
            env.step(fb.payload["action"])
    return out


def records_from(trajs: Iterable[Trajectory]) -> tuple[list[FeedbackRecord], list[int]]:
    recs, quits = [], []
    for t in trajs:
        for r in replay(t):
            fb = r["feedback"]
            if fb is None or fb.kind not in KIND_MAP:
                continue
            kind, said = KIND_MAP[fb.kind]
            recs.append(FeedbackRecord(r["judgement"]["tool"] or "*", bool(r["judgement"]["correct"]), kind,
                                       said if kind != "approve" else None, trajectory_id=t.id))
        if t.outcome == "aborted" and t.steps:
            quits.append(len(t.steps))
    return recs, quits


def fit_from_ledger(data_dir: str | Path, tenant: str | None = None, out: str | Path = "runs/persona-fit",
                    seed: int = 0) -> dict[str, Any]:
    """Fit a persona from the service's trajectory log; write persona.json and validation.{json,md}."""
    from memory import MemoryService

    mem = MemoryService(Path(data_dir) / "memory")
    try:
        trajs = mem.trajectories(tenant=tenant).trajectories
    finally:
        mem.close()
    recs, quits = records_from(trajs)
    if not recs:
        raise ValueError(f"no feedback on proposed writes in the trajectory log of {data_dir}"
                         + (f" for tenant {tenant!r}" if tenant else ""))
    f = fit(recs, quit_turns=quits)
    persona = f.to_persona("fitted")
    val = validate(recs, f, seed=seed, sampler=lambda a, c, rng: persona.decide(
        {"tool": a, "correct": c, "action_text": "x", "correct_write": "y"}, rng).kind)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "persona.json", persona.to_dict())
    write_json(out / "validation.json", {"fit": f.to_dict(), "validation": val, "n_trajectories": len(trajs)})
    rows = [[a, v["n"], v["tv_distance"], v["chi2"], v["p_chi2"], v["p_permutation"]] for a, v in val.items()]
    table = md_table(["action type", "n", "TV distance", "chi2", "p (chi2)", "p (permutation)"], rows)
    (out / "validation.md").write_text(f"# Persona fit: simulated vs logged answers\n\n{len(recs)} answers from "
                                       f"{len(trajs)} trajectories.\n\n{table}\n")
    return {"persona": persona.to_dict(), "validation": val, "n_records": len(recs),
            "summary_text": f"{len(recs)} answers fitted; wrote {out / 'persona.json'}\n{table}"}
