"""Baseline agents and the loops that run agents over tasks and streams.

`OracleAgent` follows the rules in force (it may read them from the task's hidden params: it
is the oracle) and reads the facts through tools first, in a seeded order, so its
trajectories are valid cold-start SFT data with varied action orders. `StaleAgent` is the
oracle frozen on version 1's rules and tools. `RandomAgent` samples tools and arguments.
"""
from __future__ import annotations

import random
import re
from abc import ABC, abstractmethod
from typing import Any, Callable, Iterable

from dynamic_bench.actions import Reply, ToolCall, format_action
from dynamic_bench.domains import Rules, get_domain
from dynamic_bench.env import DriftEnv, make
from dynamic_bench.schema import Task
from dynamic_bench.streams import Stream

_IDS = re.compile(r"[A-Z]-\d+")


class Agent(ABC):
    """An agent: `reset` at an episode's start, `act` once per turn, `end` with the final info."""

    name = "agent"

    def reset(self, obs: str, info: dict[str, Any]) -> None:  # noqa: B027 - optional hook
        pass

    @abstractmethod
    def act(self, obs: str, info: dict[str, Any]) -> str:
        """The next action text."""

    def end(self, obs: str, info: dict[str, Any]) -> None:  # noqa: B027 - learning agents use this
        pass


class OracleAgent(Agent):
    """Plans reads (seeded order, optional extra reads), the prescribed writes, then the reply."""

    name = "oracle"

    def __init__(self, seed: int = 0, extra_read_p: float = 0.3) -> None:
        self.rng = random.Random(seed)
        self.extra_read_p = extra_read_p
        self.plan: list[str] = []

    def rules(self, task: Task) -> Rules:
        return task.params["rules"]

    def reset(self, obs: str, info: dict[str, Any]) -> None:
        task: Task = info["task"]
        d, p = get_domain(task.domain), task.params
        r = self.rules(task)
        needed, extra = d.reads(p, r)
        reads = needed + [c for c in extra if self.rng.random() < self.extra_read_p]
        self.rng.shuffle(reads)
        writes, outcome = d.solve(p, r)
        self.plan = [format_action(c) for c in reads + writes] + [format_action(Reply(d.reply_text(p, outcome)))]

    def act(self, obs: str, info: dict[str, Any]) -> str:
        return self.plan.pop(0) if self.plan else format_action(Reply("done"))


class StaleAgent(OracleAgent):
    """Always follows the first rule version (its rules and its tools)."""

    name = "stale"

    def rules(self, task: Task) -> Rules:
        return get_domain(task.domain).versions[1]


class RandomAgent(Agent):
    """Random tools with arguments drawn from ids in the conversation and the enums; random replies."""

    name = "random"

    def __init__(self, seed: int = 0, reply_p: float = 0.2) -> None:
        self.rng = random.Random(seed)
        self.reply_p = reply_p
        self.ids: list[str] = []

    def reset(self, obs: str, info: dict[str, Any]) -> None:
        self.ids = _IDS.findall(obs) or ["X-0"]
        self.outcomes = get_domain(info["task"].domain).outcomes

    def act(self, obs: str, info: dict[str, Any]) -> str:
        self.ids += [i for i in _IDS.findall(obs) if i not in self.ids]
        if self.rng.random() < self.reply_p:
            return format_action(Reply(self.rng.choice(self.outcomes)))
        spec = self.rng.choice(info["tools"])
        args: dict[str, Any] = {}
        for a, t in spec["args"].items():
            if a in spec["enums"]:
                args[a] = self.rng.choice(spec["enums"][a])
            else:
                args[a] = self.rng.choice(self.ids) if t == "str" else self.rng.randint(0, 60)
        return format_action(ToolCall(spec["name"], args))


AGENTS: dict[str, Callable[..., Agent]] = {"oracle": OracleAgent, "stale": StaleAgent, "random": RandomAgent}


def run_episode(env: DriftEnv, agent: Agent, task: Task | None = None, seed: int | None = None,
                user_simulation: bool = True) -> dict[str, Any]:
    """One episode; returns the verdict with the actions and observations of each turn."""
    options: dict[str, Any] = {"user_simulation": user_simulation}
    if task is not None:
        options["task"] = task
    obs, info = env.reset(seed=seed, options=options)
    agent.reset(obs, info)
    actions, observations = [], [obs]
    done = False
    while not done:
        a = agent.act(obs, info)
        obs, _, term, trunc, info = env.step(a)
        actions.append(a)
        observations.append(obs)
        done = term or trunc
    agent.end(obs, info)
    v = info["verdict"]
    return {"task_id": env.task.id, "user_id": env.task.user_id, "success": v["success"], "reward": v["reward"],
            "breakdown": v["breakdown"], "violations": v["violations"], "n_stale": v["n_stale"],
            "stale_violations": v["stale_violations"], "n_steps": v["n_steps"], "actions": actions,
            "observations": observations}


def run_stream(agent: Agent, stream: Stream, *, user_simulation: bool = True, max_steps: int = 10,
               on_episode: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Run `agent` over every episode of `stream`, in order; one result dict per episode."""
    env = make(f"driftbench/{stream.domain}-v1", max_steps=max_steps)
    results = []
    for ep in stream.episodes:
        r = run_episode(env, agent, ep.task, seed=ep.seed, user_simulation=user_simulation)
        r.update(index=ep.index, phase=ep.phase, version=ep.version, shown_version=ep.shown_version,
                 shift=ep.shift, in_scope=ep.in_scope)
        results.append(r)
        if on_episode is not None:
            on_episode(r)
    return results


def repeat_tasks(make_agent: Callable[[int], Agent], tasks: Iterable[Task], n_trials: int = 4, seed: int = 0,
                 max_steps: int = 10) -> dict[str, list[bool]]:
    """Each task `n_trials` times (fresh agent seed and persona seed per trial): input of pass^k."""
    out: dict[str, list[bool]] = {}
    envs: dict[str, DriftEnv] = {}
    for i, task in enumerate(tasks):
        env = envs.setdefault(task.domain, make(f"driftbench/{task.domain}-v1", max_steps=max_steps))
        out[task.id] = [run_episode(env, make_agent(seed * 1000 + t), task, seed=seed * 7919 + i * 31 + t)["success"]
                        for t in range(n_trials)]
    return out


def evaluate_versions(make_agent: Callable[[int], Agent], domain: str, versions: Iterable[int], n_tasks: int = 50,
                      seed: int = 0, split: str = "test", max_steps: int = 10) -> dict[int, float]:
    """Success rate per rule version on held-out tasks (one row of a forgetting matrix)."""
    from dynamic_bench.tasks import generate_tasks

    env = make(f"driftbench/{domain}-v1", max_steps=max_steps)
    out = {}
    for v in versions:
        tasks = generate_tasks(domain, n_tasks, seed, split=split, rule_version=v)
        out[v] = sum(run_episode(env, make_agent(seed * 1000 + i), t, seed=seed * 7919 + i)["success"]
                     for i, t in enumerate(tasks)) / n_tasks
    return out
