"""`evolve simulate run`: simulated users drive the service over HTTP with `langgraph-sdk`.

Each episode of a DriftBench stream is one thread: the thread's metadata names the world and
the task, a run starts it, and every write the agent proposes pauses the run with an approval
interrupt. The simulated user judges the proposal against the rules in force for *them* (a
local replica of the thread's world, replayed from the thread's applied actions), answers
with their persona (accept / edit / ignore / take over; a rejection comes with the reason, in
words, when they volunteer it), and resumes the run with `command={"resume": ...}` — the same
path a real user's client takes, so trajectories and feedback land in the ledger the same way.
"""
from __future__ import annotations

import random
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

from dynamic_bench import get_domain, make, make_stream
from dynamic_bench.actions import ToolCall, format_action, parse_action
from dynamic_bench.schema import Task
from evolve.simulator.persona import SimPersona, default_persona


@dataclass
class SimConfig:
    url: str
    users: int = 4                  # concurrent simulated users (threads in flight)
    episodes: int = 20
    stream: str = "silent"
    domain: str = "retail"
    api_key: str | None = None
    persona_file: str | None = None  # a fitted persona for every user; default: each task's own
    seed: int = 0
    start: int = 0                  # first episode index of the stream to play
    stream_length: int | None = None  # length of the stream the episodes come from (default: episodes)
    assistant_id: str = "agent"
    volunteer: float = 0.7
    patience: int = 10
    temperature: float | None = None
    max_turns: int | None = None
    timeout_s: float = 300.0


def judge_proposal(task: Task, applied: list[str], proposed: str, seed: int | None = None) -> dict[str, Any]:
    """What the user knows: is `proposed` right under *their* rules, given what was done so far."""
    env = make(f"driftbench/{task.domain}-v1", user_simulation=False, max_steps=10_000)
    env.reset(seed=seed, options={"task": task, "user_simulation": False})
    for a in applied:
        env.step(a)
    return env.judge_action(proposed)


def reason_for(task: Task) -> str | None:
    """What a volunteering user says when rejecting: what changed from the policy the agent sees
    (None when nothing did: the agent just erred, and the user has no rule to add)."""
    d = get_domain(task.domain)
    p = task.params
    notes = d.describe_change(p["shown_rules"], p["rules"]) if p.get("shown_rules") != p.get("rules") else []
    return "no. " + "; ".join(notes) if notes else None


def response_for(decision, judgement: dict[str, Any], task: Task, volunteers: bool) -> dict[str, Any]:
    """A persona's decision as LangGraph's HumanResponse (plus Evolve's `takeover`)."""
    if decision.kind == "approve":
        return {"type": "accept", "args": None}
    if decision.kind == "reject":
        reason = reason_for(task) if volunteers else None
        return {"type": "response", "args": reason} if reason else {"type": "ignore", "args": None}
    call = parse_action(decision.action_text or "")
    if not isinstance(call, ToolCall):
        return {"type": "ignore", "args": None}
    return {"type": decision.kind, "args": {"action": call.name, "args": call.args}}


def _interrupts(thread: dict[str, Any]) -> list[dict[str, Any]]:
    return [i for lst in (thread.get("interrupts") or {}).values() for i in lst]


def play_episode(client, ep, persona: SimPersona | None, cfg: SimConfig) -> dict[str, Any]:
    """One episode through the service; returns its outcome as the service judged it."""
    task: Task = ep.task
    rng = random.Random(f"sim/{cfg.seed}/{ep.index}")
    who = persona or default_persona(task.persona, cfg.patience, cfg.volunteer)
    t0 = time.perf_counter()
    thread = client.threads.create(metadata={"world": f"driftbench/{task.domain}-v1",
                                             "task": task.model_dump(mode="json"), "episode": ep.index})
    tid = thread["thread_id"]
    conf: dict[str, Any] = {"seed": int(ep.seed) % 1_000_000_000}
    if cfg.temperature is not None:
        conf["temperature"] = cfg.temperature
    if cfg.max_turns is not None:
        conf["max_turns"] = cfg.max_turns
    config = {"configurable": conf}
    client.runs.wait(tid, cfg.assistant_id, input={"messages": []}, config=config)
    answers: list[str] = []
    gave_up = False
    for _ in range(64):
        th = client.threads.get(tid)
        pending = _interrupts(th)
        if not pending:
            break
        values = th.get("values") or {}
        if int(values.get("turns", 0)) > who.patience:
            gave_up = True  # the user walks away; the thread stays interrupted
            break
        req = pending[0]["value"]
        ar = req["action_request"]
        proposed = format_action(ToolCall(ar["action"], dict(ar.get("args") or {})))
        j = judge_proposal(task, list(values.get("applied", [])), proposed, seed=None)
        d = who.decide(j, rng)
        resp = response_for(d, j, task, who.volunteers(rng) if d.kind == "reject" else False)
        answers.append(resp["type"])
        client.runs.wait(tid, cfg.assistant_id, command={"resume": resp}, config=config)
    values = client.threads.get(tid).get("values") or {}
    epi = values.get("episode") or {}
    verdict = epi.get("verdict") or {}
    return {"index": ep.index, "thread_id": tid, "trajectory_id": values.get("trajectory_id"),
            "task_id": task.id, "user_id": task.user_id, "phase": ep.phase, "version": ep.version,
            "success": bool(verdict.get("success")) and not gave_up, "outcome": epi.get("outcome", "aborted"),
            "gave_up": gave_up, "answers": answers, "n_stale": int(verdict.get("n_stale", 0) or 0),
            "policy_version": (values.get("steps") or [{}])[-1].get("policy_version"),
            "seconds": time.perf_counter() - t0}


def simulate(cfg: SimConfig, on_episode: Callable[[dict], None] | None = None, progress: bool = True) -> dict[str, Any]:
    """Play episodes [start, start+episodes) of the stream, `users` at a time, in stream order."""
    from langgraph_sdk import get_sync_client

    n = cfg.stream_length or (cfg.start + cfg.episodes)
    stream = make_stream(cfg.stream, cfg.domain, n, cfg.seed)
    eps = stream.episodes[cfg.start:cfg.start + cfg.episodes]
    persona = SimPersona.load(cfg.persona_file) if cfg.persona_file else None
    client = get_sync_client(url=cfg.url, api_key=cfg.api_key, timeout=cfg.timeout_s)
    results: list[dict] = []
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=len(eps), desc=f"simulate {cfg.domain}/{cfg.stream}", unit="ep")
    try:
        with ThreadPoolExecutor(max_workers=max(1, cfg.users)) as pool:
            for i in range(0, len(eps), max(1, cfg.users)):  # a wave of concurrent users
                wave = list(pool.map(lambda e: play_episode(client, e, persona, cfg), eps[i:i + cfg.users]))
                for r in wave:
                    results.append(r)
                    if on_episode:
                        on_episode(r)
                if bar:
                    bar.update(len(wave))
    finally:
        if bar:
            bar.close()
        client.close()
    succ = [float(r["success"]) for r in results]
    return {"episodes": results, "success_rate": sum(succ) / max(1, len(succ)),
            "shifts": stream.shifts, "phases": stream.phases}
